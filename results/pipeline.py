"""The ``mesh-results`` pipeline: :func:`build_report` reads the runs, aggregates them, writes the
tables and ``claims.md``, draws the figures, and writes ``report.md`` beside them (its Markdown:
:mod:`results.render.report_md`; links are relative, so the folder reads well on GitHub wherever it
is committed), then puts the report on the sweeps' parent runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from results.publish import parents
from results.publish.folder import REPORT, report_folder
from results.render import answer, formats, plots, tables
from results.render.claims_md import FILE, write_claims
from results.render.lr import write_lr_sensitivity
from results.render.output import Output
from results.render.ranking import ranking
from results.render.report_md import refresh_report, render_report
from results.render.routing import plot_routing
from results.rows.aggregate import Results, aggregate
from results.rows.curves import FILE as FILE_CURVES
from results.rows.frame import ResultsError
from results.rows.paper import load_paper_numbers
from results.rows.routing import FILE as FILE_ROUTING
from results.runs import store
from results.runs.committed import read_curves_csv, read_runs_csv
from results.runs.curves import read_curves
from results.runs.routing import read_routing
from results.runs.stages import read_confirmatory, read_design
from results.verdicts.claims import Evaluation
from results.verdicts.decide import decide
from results.verdicts.over_training import claim_deltas, primary_claims
from results.verdicts.sequential import LOG

FIGURES = "figures"


def build_report(
    name: str,
    experiments: Sequence[str],
    tracking_uri: str,
    out_dir: str | Path,
    filter_string: str = "",
    metric: str = "val_loss",
    paper_file: str | Path | None = None,
    publish_to_parents: bool = True,
    opening: Sequence[str] = (),
) -> Output:
    """Read the runs of ``experiments`` (all when empty) passing ``filter_string`` from the store and
    write tables, figures and ``report.md`` into ``out_dir`` (written beside it and moved in place
    whole, :mod:`results.publish.folder`); then (``publish_to_parents``) colour and tag the runs, write the
    experiments' views, and put the report on the MLflow parent run of every sweep whose cells it
    read (:mod:`results.publish.parents`). ``opening``: the grid's context (the main job's decided-result and
    regime lines, :mod:`results.commands.demo_regime`): ``report.md``, ``claims.md`` and the parent runs'
    descriptions open with this grid's answer and then it (:func:`results.render.answer.opening`), and the
    parents record it for the next ``mesh-results`` (:data:`results.publish.parents.CONTEXT_TAG`)."""
    out = Path(out_dir)
    client = store.open_client(tracking_uri)
    frame = store.collect_runs(client, experiments, filter_string)
    where = ", ".join(experiments) or "the store"
    if frame.empty:
        raise ResultsError(f"no runs in {where}" + (f" match --filter {filter_string!r}" if filter_string else ""))
    if not (frame["status"] == "FINISHED").any():  # nothing to average: no report, no empty folder
        states = ", ".join(f"{n} {s.lower()}" for s, n in frame["status"].value_counts().items())
        raise ResultsError(f"no finished run in {where} yet ({states}); a report needs one")
    paper = load_paper_numbers(paper_file)
    prefer = tuple(experiments) + tuple(s for s in frame["sweep"].unique() if s)
    try:
        results = aggregate(frame, metric, paper, prefer)
    except ValueError as error:
        raise ResultsError(str(error)) from None
    with report_folder(out) as folder:
        output = _write(client, folder, name, experiments, tracking_uri, filter_string, results, paper, out, opening)
    output = output.moved_to(out)
    known = store.experiment_ids(client, ())
    output.experiment_ids = {name: known[name] for name in results.runs["experiment"].unique() if name in known}
    if publish_to_parents:
        quoted = formats.quote_lines(output.opening)[1:]
        lines = [*quoted, *([""] if quoted else []), *ranking(results, output.evaluations)]
        done = parents.publish(client, tracking_uri, out, name, results.runs, output.experiment_ids, lines, opening)
        output.published, output.published_pages, output.published_to = done.parents, done.pages, done.folder
        output.view = done.view
    return output


def _write(
    client: Any,
    out: Path,
    name: str,
    experiments: Sequence[str],
    tracking_uri: str,
    filter_string: str,
    results: Results,
    paper: Any,
    final: Path | None = None,
    opening: Sequence[str] = (),
) -> Output:
    """Tables, ``claims.md``, figures and ``report.md`` of ``results`` in the folder ``out`` (which
    becomes ``final``, where a ``seeds_auto.log`` names the design that chose the seeds)."""
    output = Output(out, out / REPORT, results)
    final = final or out
    output.design, output.declared = read_design(final / LOG), read_confirmatory(final)
    main = tables.main_table(results)
    output.tables += formats.write_table(main, out, "table")
    probes = tables.probe_table(results)
    if probes is not None:
        output.tables += formats.write_table(probes, out, "probes")
    runs = results.runs.drop(columns=["params"])
    output.runs_csv = out / "runs.csv"
    runs.to_csv(output.runs_csv, index=False)
    history = read_curves(client, results)
    output.curves_csv = out / FILE_CURVES
    history.to_csv(output.curves_csv, index=False)
    decided = decide(results, None, output.design, output.declared, final.name, history)
    output.evaluations = decided.evaluations
    output.opening = answer.opening(results, decided.evaluations, opening)  # this grid's answer, then its context
    output.claims = write_claims(decided, results, out, name, experiments, history, "", final.name, output.opening)
    steered = read_routing(client, results)
    if not steered.empty:
        output.routing_csv = out / FILE_ROUTING
        steered.to_csv(output.routing_csv, index=False)

    figures = out / FIGURES
    finished = [run_id for row in results.rows for run_id in row.run_ids]
    output.figures["ranking"] = plots.plot_ranking(results, figures)
    if plots.shares_spread(results):
        output.figures["ppl_vs_params"] = plots.plot_ppl_vs_params(results, figures)
    output.figures["buffer_slots"] = plots.plot_buffer_slots(results, figures, paper)
    histories = store.metric_histories(client, finished, "train/loss")
    output.figures["train_loss"] = plots.plot_train_loss(results, histories, figures)
    _plot_over_training(output, results, history, figures)
    output.lr_section, lr_files = write_lr_sensitivity(results, out, figures)
    output.tables += [p for p in lr_files if p.suffix == ".csv"]
    if lr_files:
        output.figures["lr_sensitivity"] = [p for p in lr_files if p.suffix != ".csv"]
    for key, paths in plot_routing(results, steered, figures).items():
        output.figures[f"routing/{key}"] = paths
    run_dirs = dict(zip(results.runs["run_id"], results.runs["run_dir"].fillna("").astype(str), strict=True))
    reports = store.probe_reports(client, _rows_with_probes(results), run_dirs)
    probe_figures = plots.plot_probes(results, reports, figures / "probes")
    for block, paths in probe_figures.items():
        for kind, files in paths.items():
            output.figures[f"probes/{block}/{kind}"] = files

    text = render_report(
        name=name,
        experiments=experiments,
        tracking_uri=tracking_uri,
        filter_string=filter_string,
        results=results,
        main=main,
        probes=probes,
        output=output,
        probe_figures=probe_figures,
        probe_seeds=plots.probe_seeds(results, reports),
    )
    output.report.write_text(text)
    return output


def _plot_over_training(output: Output, results: Results, history: pd.DataFrame, figures: Path) -> None:
    """Validation PPL over tokens per block, and each primary claim's Δ over tokens."""
    for block, paths in plots.plot_validation_curves(results, history, figures).items():
        output.figures[f"val_ppl/{block}"] = paths
    claims = {e.claim.id: e.claim for e in output.evaluations}
    primary = primary_claims(claims.values())
    chosen = [e for e in output.evaluations if e.claim.id in primary and not e.supplementary]
    deltas = claim_deltas(results, history, chosen)
    for claim, paths in plots.plot_claim_deltas(deltas, primary, figures).items():
        output.figures[f"delta/{claim}"] = paths


def _rows_with_probes(results: Results) -> list[list[str]]:
    """The run ids of each row that logged probe metrics (its first run with the artifact is drawn)."""
    return [row.run_ids for row in results.rows if any(m.startswith("probe/") for m in row.stats)]


def _previous_header(out: Path) -> tuple[str, list[str]]:
    """(name, experiments) from the title and header of the claims.md already in ``out``."""
    path = out / FILE
    if not path.exists():
        return out.name, []
    text = path.read_text()
    title = re.search(r"^# The paper's claims, tested on these runs: (.+)$", text, re.M)
    listed = re.search(r" from experiments ((?:`[^`]+`(?:, )?)+)", text)
    name = title.group(1).replace("\\_", "_").strip() if title else out.name
    return name, re.findall(r"`([^`]+)`", listed.group(1)) if listed else []


def rebuild_claims(
    csv: str | Path, out_dir: str | Path, metric: str = "val_loss", name: str = "", experiments: Sequence[str] = ()
) -> tuple[Path, list[Evaluation], Results]:
    """Read ``csv``, aggregate as ``mesh-results`` does, and (re)write ``claims.md`` in ``out_dir``
    (its name and experiments kept from the claims.md there, unless given)."""
    out = Path(out_dir)
    frame = read_runs_csv(csv)
    if not (frame["status"] == "FINISHED").any():
        raise ResultsError(f"--from-csv {csv}: no FINISHED run; a report needs one")
    previous_name, previous_experiments = _previous_header(out)
    experiments = list(experiments) or previous_experiments or sorted(frame["experiment"].unique())
    prefer = tuple(experiments) + tuple(s for s in frame["sweep"].unique() if s)
    try:
        results = aggregate(frame, metric, load_paper_numbers(None), prefer)
    except ValueError as error:
        raise ResultsError(str(error)) from None
    out.mkdir(parents=True, exist_ok=True)
    history = read_curves_csv(Path(csv).parent / FILE_CURVES)
    design, declared = read_design(out / LOG), read_confirmatory(out)
    decided = decide(results, None, design, declared, out.name, history)
    evaluations = decided.evaluations
    path = write_claims(decided, results, out, name or previous_name, experiments, history, Path(csv).name, out.name)
    output = Output(out, out / REPORT, results, claims=path, evaluations=evaluations, design=design, declared=declared)
    refresh_report(output, results)
    return path, evaluations, results


__all__ = ["Output", "build_report", "rebuild_claims"]
