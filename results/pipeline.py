"""The ``mesh-results`` pipeline: the stages in order, evaluating once, writing each report whole.

:func:`build_report` reads the runs of some experiments from the MLflow store (:mod:`results.runs`),
and :func:`rebuild_report` reads the data a report folder keeps (``runs.csv``, ``curves.csv``,
``routing.csv``, ``train_loss.csv``, ``probe_reports/``, ``report.json``: :mod:`results.runs.committed`);
both then run the same :func:`write_report`: rows (:mod:`results.rows`), the claims decided once
(:func:`results.verdicts.decide.decide`), tables, ``claims.md``, figures and ``report.md``
(:mod:`results.render`), written with the data beside them in a folder that takes the report's
place whole (:mod:`results.publish.folder`). A report built from the store and the same report
rebuilt from its folder are the same bytes. :func:`build_report` then puts the report on the
sweeps' parent runs (:mod:`results.publish.parents`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.store.sqlite import is_opened_read_only
from results.publish import parents
from results.publish.folder import REPORT, report_folder
from results.render import answer, formats, plots, tables
from results.render.claims_md import write_claims
from results.render.depth import write_depth_study
from results.render.lr import write_lr_sensitivity
from results.render.output import Output
from results.render.ranking import ranking
from results.render.report_md import render_report
from results.render.routing import plot_routing
from results.rows.aggregate import Results, aggregate
from results.rows.curves import FILE as FILE_CURVES
from results.rows.depth import DEPTH_FILE, EXIT_FILE, DepthData, depth_arms
from results.rows.frame import ResultsError, runs_table
from results.rows.paper import PaperRow, load_paper_numbers
from results.rows.routing import FILE as FILE_ROUTING
from results.rows.spec import ReportSpec
from results.runs import store
from results.runs.committed import (
    DERIVED,
    probe_report_files,
    read_curves_csv,
    read_depth_csvs,
    read_histories_csv,
    read_routing_csv,
    read_runs_csv,
)
from results.runs.curves import read_curves
from results.runs.depth import read_depth
from results.runs.routing import read_routing
from results.runs.stages import STAGES, read_confirmatory, read_design, read_stages
from results.verdicts.claims import Evaluation
from results.verdicts.decide import decide
from results.verdicts.depth import decide_depth
from results.verdicts.over_training import claim_deltas, primary_claims

FIGURES = "figures"
RUNS_CSV = "runs.csv"
TRAIN_LOSS = "train_loss.csv"  # every logged step of every run's train/loss
PROBE_REPORTS = "probe_reports"  # <run id>.json: the final probes.json of the run each row's figures draw


@dataclass
class RunData:
    """Everything a report is made from, read from the store or from a report folder."""

    frame: pd.DataFrame  # one line per run: collect_runs's columns (params: those that set rows apart)
    curves: Any = None  # every validation step (curves.csv); None where the folder never kept it
    routing: pd.DataFrame = field(default_factory=pd.DataFrame)
    train_loss: pd.DataFrame | None = None  # None where the folder never kept it
    probe_files: dict[str, Path] = field(default_factory=dict)  # run id -> its probes.json
    stages: Path | None = None  # the seeds=auto grid's stages.json, from its parent run
    depth: DepthData = field(default_factory=DepthData)  # the runs' depth and exit curves (depth.csv, exit.csv)


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
    add: bool = False,
) -> Output:
    """Read the runs of ``experiments`` (all when empty) passing ``filter_string`` from the store and
    write the report into ``out_dir`` (:func:`write_report`); then (``publish_to_parents``) colour and
    tag the runs, write the experiments' views, and put the report on the MLflow parent run of every
    sweep whose cells it read. ``opening``: lines that ``report.md``, ``claims.md`` and the parent
    runs' descriptions open with this grid's answer (:func:`results.render.answer.opening`) and then
    these context lines (the main job's decided-result and regime lines, :mod:`results.commands.demo_regime`),
    which the parents record for the next ``mesh-results`` (:data:`results.publish.parents.CONTEXT_TAG`).
    ``add``: the report already in ``out_dir`` keeps the runs it reports that this store lacks (a grid
    run in parts, each part in its own store: :func:`merged`); only this store's sweeps are published to."""
    out = Path(out_dir)
    spec = ReportSpec(name, tuple(experiments), tracking_uri, filter_string, metric, tuple(opening))
    client = store.open_client(tracking_uri)
    frame = store.collect_runs(client, experiments, filter_string)
    where = ", ".join(experiments) or "the store"
    if frame.empty:
        raise ResultsError(f"no runs in {where}" + (f" match --filter {filter_string!r}" if filter_string else ""))
    paper = load_paper_numbers(paper_file)
    results = _rows(frame, spec, paper, where)
    finished = [run_id for row in results.rows for run_id in row.run_ids]
    with tempfile.TemporaryDirectory() as downloads, report_folder(out) as folder:
        data = RunData(
            frame,
            read_curves(client, results),
            read_routing(client, results),
            store.metric_histories(client, finished, "train/loss"),
            _probe_files(client, results, Path(downloads)),
            store.stages_file(client, results.runs, Path(downloads)),
            read_depth(client, results, Path(downloads)),
        )
        report_results = results
        if add and (out / RUNS_CSV).is_file():
            # this store's data written as a folder keeps it, so both sides are joined in one form and
            # the merged report rebuilds from its folder to the same bytes
            staged = Path(downloads) / "this-store"
            staged.mkdir()
            _write_data(Output(staged, staged / REPORT, results), spec, data, results)
            data = merged(read_folder(out), read_folder(staged))
            report_results = _rows(data.frame, spec, paper, f"{where} and {out / RUNS_CSV}")
            _refuse_merged_cells(report_results, out)
        output = write_report(folder, spec, data, report_results, paper, final=out)
    output = output.moved_to(out)
    known = store.experiment_ids(client, ())
    output.experiment_ids = {name: known[name] for name in results.runs["experiment"].unique() if name in known}
    if publish_to_parents and not is_opened_read_only(tracking_uri):  # a read-only store is only read
        quoted = formats.quote_lines(output.opening)[1:]
        lines = [*quoted, *([""] if quoted else []), *ranking(output.results, output.evaluations)]
        done = parents.publish(client, tracking_uri, out, name, results.runs, output.experiment_ids, lines, opening)
        output.published, output.published_pages, output.published_to = done.parents, done.pages, done.folder
        output.view = done.view
    return output


def rebuild_report(folder: str | Path, paper_file: str | Path | None = None) -> Output:
    """Write the report in ``folder`` again, whole, from the data it keeps (no store): the same
    :func:`write_report` that :func:`build_report` runs."""
    folder = Path(folder)
    spec = ReportSpec.read(folder)
    data = read_folder(folder)
    paper = load_paper_numbers(paper_file)
    results = _rows(data.frame, spec, paper, str(folder / RUNS_CSV))
    with report_folder(folder) as new:
        output = write_report(new, spec, data, results, paper, final=folder)
    return output.moved_to(folder)


def read_folder(folder: Path) -> RunData:
    """The data a report folder keeps beside its report (what :func:`_write_data` wrote)."""
    return RunData(
        read_runs_csv(folder / RUNS_CSV),
        read_curves_csv(folder / FILE_CURVES),
        read_routing_csv(folder / FILE_ROUTING),
        read_histories_csv(folder / TRAIN_LOSS),
        probe_report_files(folder / PROBE_REPORTS),
        depth=read_depth_csvs(folder),
    )


def _refuse_merged_cells(results: Results, out: Path) -> None:
    """A row of the merged report that holds one seed twice is two cells the report cannot tell apart:
    each part's folder keeps only the settings that set its own rows apart."""
    for row in results.rows:
        seeds = [s for s in row.seeds if s != ""]
        if len(seeds) != len(set(seeds)):
            twice = sorted({s for s in seeds if seeds.count(s) > 1})
            raise ResultsError(
                f"--add: {out} and this store have runs it cannot tell apart (row {row.label!r} would hold seed "
                f"{twice[0]} twice); report each part with the same arms (split a grid by seeds), or into its own --out"
            )


def merged(kept: RunData, new: RunData) -> RunData:
    """``new``'s runs and those of ``kept`` that ``new`` lacks, each table joined the same way; both as
    report folders keep them (:func:`read_folder`). A kept run is replaced by ``new``'s when they share
    the run id or the config hash (the same cell trained again, e.g. in a fresh store), so a cell is
    never counted twice. A table one side never kept comes from the other."""
    hashes = {h for h in new.frame.get("config_hash", pd.Series(dtype=str)).dropna().astype(str) if h}
    old_ids = kept.frame["run_id"].astype(str)
    same_cell = kept.frame.get("config_hash", pd.Series("", index=kept.frame.index)).astype(str).isin(hashes)
    replaced = set(new.frame["run_id"].astype(str)) | set(old_ids[same_cell])

    def join(old: pd.DataFrame | None, recent: pd.DataFrame | None) -> pd.DataFrame | None:
        if old is None or old.empty:
            return recent
        rest = old[~old["run_id"].astype(str).isin(replaced)] if "run_id" in old.columns else old
        return rest if recent is None else pd.concat([rest, recent], ignore_index=True)

    frame = join(kept.frame, new.frame)
    assert frame is not None  # both sides hold runs
    # the columns every run's table recomputes last, as a folder read back places them (read_runs_csv):
    # a store's run with columns the kept runs lack would otherwise put them after these, and the
    # merged report would not rebuild to the same bytes
    derived = [c for c in DERIVED if c in frame.columns]
    frame = frame[[c for c in frame.columns if c not in derived] + derived]
    return RunData(
        frame,
        join(kept.curves, new.curves),
        join(kept.routing, new.routing),
        join(kept.train_loss, new.train_loss),
        {**{k: v for k, v in kept.probe_files.items() if k not in replaced}, **new.probe_files},
        depth=DepthData(join(kept.depth.depth, new.depth.depth), join(kept.depth.exit, new.depth.exit)),
    )


def _rows(frame: pd.DataFrame, spec: ReportSpec, paper: list[PaperRow], where: str) -> Results:
    if not (frame["status"] == "FINISHED").any():  # nothing to average: no report, no empty folder
        states = ", ".join(f"{n} {s.lower()}" for s, n in frame["status"].value_counts().items())
        raise ResultsError(f"no finished run in {where} yet ({states}); a report needs one")
    prefer = tuple(spec.experiments) + tuple(s for s in frame["sweep"].unique() if s)
    try:
        return aggregate(frame, spec.metric, paper, prefer)
    except ValueError as error:
        raise ResultsError(str(error)) from None


def _probe_files(client: Any, results: Results, tmp: Path) -> dict[str, Path]:
    run_dirs = dict(zip(results.runs["run_id"], results.runs["run_dir"].fillna("").astype(str), strict=True))
    return store.probe_report_files(client, _rows_with_probes(results), run_dirs, tmp)


def write_report(
    out: Path, spec: ReportSpec, data: RunData, results: Results, paper: list[PaperRow], final: Path | None = None
) -> Output:
    """The report of ``results`` in the folder ``out`` (which becomes ``final``, where a
    ``seeds_auto.log`` names the design that chose the seeds and whose parent holds the
    ``confirmatory.yaml``): its data first, then the claims decided once, tables, ``claims.md``,
    figures and ``report.md``."""
    final = final or out
    output = Output(out, out / REPORT, results, opening=list(spec.opening), folder_name=final.name)
    output.design = read_stages(data.stages.parent) if data.stages is not None else read_design(final)
    output.declared = read_confirmatory(final)
    _write_data(output, spec, data, results)

    decided = decide(results, None, output.design, output.declared, final.name, data.curves)
    output.evaluations = decided.evaluations
    main = tables.main_table(results)
    output.tables += formats.write_table(main, out, "table")
    probes = tables.probe_table(results)
    if probes is not None:
        output.tables += formats.write_table(probes, out, "probes")
    output.opening = answer.opening(results, decided.evaluations, spec.opening)  # this grid's answer, then its context
    output.claims = write_claims(
        decided, results, out, spec.name, spec.experiments, data.curves, "", final.name, output.opening
    )

    figures = out / FIGURES
    output.figures["ranking"] = plots.plot_ranking(results, figures)
    if plots.shares_spread(results):
        output.figures["ppl_vs_params"] = plots.plot_ppl_vs_params(results, figures)
    output.figures["buffer_slots"] = plots.plot_buffer_slots(results, figures, paper)
    if data.train_loss is not None:
        output.figures["train_loss"] = plots.plot_train_loss(results, data.train_loss, figures)
    if data.curves is not None:
        _plot_over_training(output, results, data.curves, figures)
    output.lr_section, lr_files = write_lr_sensitivity(results, out, figures)
    arms = depth_arms(results, data.depth)  # the depth study's rule, decided once
    depth = write_depth_study(results, arms, decide_depth(arms), out, figures)
    output.depth_section, depth_tables, depth_figures = depth
    output.tables += depth_tables
    for key, paths in depth_figures.items():
        output.figures[key] = paths
    output.tables += [p for p in lr_files if p.suffix == ".csv"]
    if lr_files:
        output.figures["lr_sensitivity"] = [p for p in lr_files if p.suffix != ".csv"]
    for key, paths in plot_routing(results, data.routing, figures).items():
        output.figures[f"routing/{key}"] = paths
    reports = _load_reports(data.probe_files)
    probe_figures = plots.plot_probes(results, reports, figures / "probes")
    for block, kinds in probe_figures.items():
        for kind, files in kinds.items():
            output.figures[f"probes/{block}/{kind}"] = files

    text = render_report(
        name=spec.name,
        experiments=spec.experiments,
        tracking_uri=spec.tracking_uri,
        filter_string=spec.filter_string,
        results=results,
        main=main,
        probes=probes,
        output=output,
        probe_figures=probe_figures,
        probe_seeds=plots.probe_seeds(results, reports),
    )
    output.report.write_text(text)
    return output


def _write_data(output: Output, spec: ReportSpec, data: RunData, results: Results) -> None:
    """What the report is made from, beside it: rebuilt from these alone (:func:`rebuild_report`)."""
    out = output.out_dir
    spec.write(out)
    output.runs_csv = out / RUNS_CSV
    runs_table(results.runs).to_csv(output.runs_csv, index=False)
    if data.curves is not None:
        output.curves_csv = out / FILE_CURVES
        data.curves.to_csv(output.curves_csv, index=False)
    if not data.routing.empty:
        output.routing_csv = out / FILE_ROUTING
        data.routing.to_csv(output.routing_csv, index=False)
    if data.train_loss is not None:
        data.train_loss.to_csv(out / TRAIN_LOSS, index=False)
    if not data.depth.depth.empty:
        data.depth.depth.to_csv(out / DEPTH_FILE, index=False)
    if not data.depth.exit.empty:
        data.depth.exit.to_csv(out / EXIT_FILE, index=False)
    if output.design is not None and output.design.log.name == STAGES:
        shutil.copyfile(output.design.log, out / STAGES)
        output.design = replace(output.design, log=out / STAGES)
    if data.probe_files:
        (out / PROBE_REPORTS).mkdir(exist_ok=True)
        for run_id, path in data.probe_files.items():
            target = out / PROBE_REPORTS / f"{run_id}.json"
            if path.resolve() != target.resolve():
                shutil.copyfile(path, target)


def _load_reports(files: Mapping[str, Path]) -> dict[str, Any]:
    from experiments.probing.files import load_report

    return {run_id: load_report(path) for run_id, path in files.items()}


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


def rebuild_claims(
    csv: str | Path, out_dir: str | Path, metric: str = "val_loss", name: str = "", experiments: Sequence[str] = ()
) -> tuple[Path, list[Evaluation], Results]:
    """``mesh-results --from-csv``: the report in ``out_dir`` rebuilt whole from the ``runs.csv`` there
    (:func:`rebuild_report`); a folder without ``report.json`` gets one from ``name``, ``experiments``
    and ``metric`` first. Returns ``claims.md``, the evaluations and the rows."""
    out = Path(out_dir)
    csv = Path(csv)
    if not csv.is_file():
        raise ResultsError(f"--from-csv {csv}: no such file; give the runs.csv a report wrote")
    out.mkdir(parents=True, exist_ok=True)
    if csv.resolve() != (out / RUNS_CSV).resolve():
        shutil.copyfile(csv, out / RUNS_CSV)
    for kept in (FILE_CURVES, FILE_ROUTING, TRAIN_LOSS, DEPTH_FILE, EXIT_FILE):
        if (csv.parent / kept).is_file() and csv.parent.resolve() != out.resolve():
            shutil.copyfile(csv.parent / kept, out / kept)
    if name or experiments or not (out / "report.json").is_file():
        frame = read_runs_csv(out / RUNS_CSV)
        listed = tuple(experiments) or tuple(sorted(frame["experiment"].unique()))
        ReportSpec(name or out.name, listed, "", "", metric).write(out)
    output = rebuild_report(out)
    assert output.claims is not None
    return output.claims, output.evaluations, output.results


__all__ = [
    "Output",
    "RunData",
    "build_report",
    "merged",
    "read_folder",
    "rebuild_claims",
    "rebuild_report",
    "write_report",
]
