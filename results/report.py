"""The ``mesh-results`` pipeline: :func:`build_report` reads the runs, aggregates them, writes the
tables and ``claims.md``, draws the figures, and writes ``report.md`` beside them (its Markdown:
:mod:`results.report_markdown`; links are relative, so the folder reads well on GitHub wherever it
is committed), then puts the report on the sweeps' parent runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.store.sqlite import is_opened_read_only
from results import collect, curves, plots, publish, render, routing, tables
from results.aggregate import Results, aggregate
from results.claims import Evaluation
from results.claims_md import write_claims
from results.lr_sensitivity import write_lr_sensitivity
from results.outdir import REPORT, report_folder
from results.paper import load_paper_numbers
from results.ranking import ranking
from results.report_markdown import render_report
from results.sequential_verdicts import LOG, DesignRecord, read_confirmatory, read_design

FIGURES = "figures"


@dataclass
class Output:
    """What :func:`build_report` wrote (paths) and the aggregated results."""

    out_dir: Path
    report: Path
    results: Results
    tables: list[Path] = field(default_factory=list)
    figures: dict[str, list[Path]] = field(default_factory=dict)
    runs_csv: Path | None = None
    curves_csv: Path | None = None  # every validation step of every run (results/curves.py)
    routing_csv: Path | None = None  # the routing curves of every looped run (results/routing.py)
    claims: Path | None = None
    evaluations: list[Evaluation] = field(default_factory=list)
    published: list[str] = field(default_factory=list)  # the sweep parent runs that now carry the report
    published_pages: list[str] = field(default_factory=list)  # their pages in the MLflow UI
    published_to: str = publish.ARTIFACT_DIR  # under which artifact folder of theirs
    experiment_ids: dict[str, str] = field(default_factory=dict)  # name -> id of the experiments read
    view: str | None = None  # the grouped view written to those experiments (experiments.store.views)
    lr_section: list[str] = field(default_factory=list)  # each variant's best LR, where LRs vary
    opening: list[str] = field(default_factory=list)  # what report.md, claims.md and the parents open with
    design: DesignRecord | None = None  # the seeds=auto design whose decisions are the primary verdicts
    declared: dict | None = None  # the reproduction's confirmatory family (confirmatory.yaml), if any

    def moved_to(self, out_dir: Path) -> Output:
        """The same output with every path under :attr:`out_dir` moved under ``out_dir``."""

        def move(path: Path) -> Path:
            return out_dir / path.relative_to(self.out_dir)

        return replace(
            self,
            out_dir=out_dir,
            report=move(self.report),
            tables=[move(p) for p in self.tables],
            figures={k: [move(p) for p in paths] for k, paths in self.figures.items()},
            runs_csv=self.runs_csv and move(self.runs_csv),
            curves_csv=self.curves_csv and move(self.curves_csv),
            routing_csv=self.routing_csv and move(self.routing_csv),
            claims=self.claims and move(self.claims),
        )


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
    whole, :mod:`results.outdir`); then (``publish_to_parents``) colour and tag the runs, write the
    experiments' views, and put the report on the MLflow parent run of every sweep whose cells it
    read (:mod:`results.publish`). ``opening``: lines that ``report.md``, ``claims.md`` and the parent
    runs' descriptions open with (the main job's regime, :mod:`results.main_job_regime`)."""
    out = Path(out_dir)
    client = collect.open_client(tracking_uri)
    frame = collect.collect_runs(client, experiments, filter_string)
    where = ", ".join(experiments) or "the store"
    if frame.empty:
        raise collect.ResultsError(
            f"no runs in {where}" + (f" match --filter {filter_string!r}" if filter_string else "")
        )
    if not (frame["status"] == "FINISHED").any():  # nothing to average: no report, no empty folder
        states = ", ".join(f"{n} {s.lower()}" for s, n in frame["status"].value_counts().items())
        raise collect.ResultsError(f"no finished run in {where} yet ({states}); a report needs one")
    paper = load_paper_numbers(paper_file)
    prefer = tuple(experiments) + tuple(s for s in frame["sweep"].unique() if s)
    try:
        results = aggregate(frame, metric, paper, prefer)
    except ValueError as error:
        raise collect.ResultsError(str(error)) from None
    with report_folder(out) as folder:
        output = _write(client, folder, name, experiments, tracking_uri, filter_string, results, paper, out, opening)
    output = output.moved_to(out)
    known = collect.experiment_ids(client, ())
    output.experiment_ids = {name: known[name] for name in results.runs["experiment"].unique() if name in known}
    if publish_to_parents and not is_opened_read_only(tracking_uri):  # a read-only store is only read
        lines = [*render.quote_lines(opening)[1:], *([""] if opening else []), *ranking(results, output.evaluations)]
        done = publish.publish(client, tracking_uri, out, name, results.runs, output.experiment_ids, lines)
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
    output = Output(out, out / REPORT, results, opening=list(opening))
    final = final or out
    output.design, output.declared = read_design(final / LOG), read_confirmatory(final)
    main = tables.main_table(results)
    output.tables += render.write_table(main, out, "table")
    probes = tables.probe_table(results)
    if probes is not None:
        output.tables += render.write_table(probes, out, "probes")
    runs = results.runs.drop(columns=["params"])
    output.runs_csv = out / "runs.csv"
    runs.to_csv(output.runs_csv, index=False)
    history = curves.read_curves(client, results)
    output.curves_csv = out / curves.FILE
    history.to_csv(output.curves_csv, index=False)
    output.claims, output.evaluations = write_claims(
        results, out, name, experiments, curves=history, design=output.design, folder=final, opening=opening
    )
    steered = routing.read_routing(client, results)
    if not steered.empty:
        output.routing_csv = out / routing.FILE
        steered.to_csv(output.routing_csv, index=False)

    figures = out / FIGURES
    finished = [run_id for row in results.rows for run_id in row.run_ids]
    output.figures["ranking"] = plots.plot_ranking(results, figures)
    if plots.shares_spread(results):
        output.figures["ppl_vs_params"] = plots.plot_ppl_vs_params(results, figures)
    output.figures["buffer_slots"] = plots.plot_buffer_slots(results, figures, paper)
    histories = collect.metric_histories(client, finished, "train/loss")
    output.figures["train_loss"] = plots.plot_train_loss(results, histories, figures)
    _plot_over_training(output, results, history, figures)
    output.lr_section, lr_files = write_lr_sensitivity(results, out, figures)
    output.tables += [p for p in lr_files if p.suffix == ".csv"]
    if lr_files:
        output.figures["lr_sensitivity"] = [p for p in lr_files if p.suffix != ".csv"]
    for key, paths in routing.plot_routing(results, steered, figures).items():
        output.figures[f"routing/{key}"] = paths
    run_dirs = dict(zip(results.runs["run_id"], results.runs["run_dir"].fillna("").astype(str), strict=True))
    reports = collect.probe_reports(client, _rows_with_probes(results), run_dirs)
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
    primary = curves.primary_claims(claims.values())
    chosen = [e for e in output.evaluations if e.claim.id in primary and not e.supplementary]
    deltas = curves.claim_deltas(results, history, chosen)
    for claim, paths in plots.plot_claim_deltas(deltas, primary, figures).items():
        output.figures[f"delta/{claim}"] = paths


def _rows_with_probes(results: Results) -> list[list[str]]:
    """The run ids of each row that logged probe metrics (its first run with the artifact is drawn)."""
    return [row.run_ids for row in results.rows if any(m.startswith("probe/") for m in row.stats)]


__all__ = ["Output", "build_report"]
