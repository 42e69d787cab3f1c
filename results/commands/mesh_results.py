"""``mesh-results NAME``: paper-style tables, figures and a report from the runs in MLflow.

    mesh-results schemes                                   # runs/mlflow.db -> results/schemes/
    mesh-results schemes,skip_combos --out /tmp/ablations  # several experiments in one report
    mesh-results --filter "tags.preset = 'tiny'"           # any runs, selected by tags
    mesh-results loops --tracking-uri http://host:5000 --metric val/cpython/loss
    mesh-results --from-csv results/cpu-reproduction/all/runs.csv     # claims.md again (report.md refreshed), no store

NAME is an MLflow experiment (a sweep's name), or several comma-separated. Writes
``report.md``, ``table.{md,tex,csv}``, ``probes.{md,tex,csv}`` (when runs were probed),
``claims.md`` (the paper's claims tested on these runs), ``runs.csv`` (every run read, any
status) and ``figures/`` to ``--out`` (default ``results/<NAME>``). Every difference between two
rows carries its 95% CI, p-value and test over seeds (paired t, or Welch t).
"""

from __future__ import annotations

# pandas, MLflow and matplotlib are imported past --help, inside main.
import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from experiments.console import quiet_libraries, take_verbose_flag
from mesh_model.cli_text import parser_for


def main(argv: Sequence[str] | None = None) -> int:
    parser = parser_for("mesh-results", __doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="let MLflow and Alembic log their INFO lines")
    parser.add_argument("name", nargs="?", default="", help="experiment (sweep) name(s), comma-separated")
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow store (default: $MLFLOW_TRACKING_URI, then sqlite in --runs-dir)"
    )
    parser.add_argument(
        "--runs-dir",
        default=None,
        help="where mesh-train put runs/mlflow.db (default: runs); given, its store is read even when "
        "$MLFLOW_TRACKING_URI is set",
    )
    parser.add_argument("--out", default=None, help="output folder (default: results/<NAME>)")
    parser.add_argument("--filter", default="", help="MLflow filter string, e.g. \"tags.preset = 'tiny'\"")
    parser.add_argument(
        "--metric", default="val_loss", help="key metric for the summary, deltas and plots (default: val_loss)"
    )
    parser.add_argument("--paper", default=None, help=argparse.SUPPRESS)  # another numbers file (tests)
    parser.add_argument(
        "--from-csv",
        default=None,
        metavar="RUNS_CSV",
        help="rebuild claims.md from a report's committed runs.csv (with the curves.csv and seeds_auto.log beside "
        "it), without the MLflow store, and refresh the ranking, claims and design of the report.md there (into "
        "--out, default the CSV's folder)",
    )
    parser.add_argument(
        "--add",
        action="store_true",
        help="add this store's runs to the report already in --out, which keeps the runs it reports that this "
        "store lacks (a grid run in parts, each in its own store); a cell in both is this store's",
    )
    args = parser.parse_args(take_verbose_flag(list(sys.argv[1:] if argv is None else argv)))
    experiments = [n.strip() for n in args.name.split(",") if n.strip()]
    if args.from_csv:
        return _from_csv(args.from_csv, args.out, args.metric, experiments)
    if not experiments and not args.filter:
        parser.error("give an experiment NAME (e.g. schemes) or --filter")
    label = "-".join(experiments) or "filtered"
    out = (Path(args.out) if args.out else Path("results") / label).resolve()  # every printed path absolute
    start = time.perf_counter()
    quiet_libraries()
    from experiments.store.views import runs_list_url
    from results.rows.frame import ResultsError  # pandas, MLflow: only past --help
    from results.runs.store import tracking_uri_for

    uri = ""
    try:
        from results.pipeline import build_report
        from results.publish.parents import ARTIFACT_DIR
        from results.render.terminal import summary_lines

        uri = tracking_uri_for(args.tracking_uri, args.runs_dir or "runs", environment=args.runs_dir is None)
        context = _recorded_context(uri, experiments)  # what the grid's job set its answer beside (mesh-demo)
        output = build_report(
            label, experiments, uri, out, args.filter, args.metric, args.paper, opening=context, add=args.add
        )
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # a store damaged past the opening check (a filter's error is its own)
        from experiments.disk import report_disk_full
        from experiments.store.sqlite import damaged_store_error

        if (damaged := damaged_store_error(error, uri) or report_disk_full(error, out)) is None:
            raise
        print(f"error: {damaged}", file=sys.stderr)
        return 2
    summary = summary_lines(output.results, output.evaluations)
    if output.opening:  # this grid's answer, then the context its job recorded (as report.md opens)
        print("\n".join(output.opening))
        print()
    if summary:
        print("\n".join(summary).rstrip())
        print(f"(every metric and test: {output.out_dir.resolve() / 'table.md'})")
        print()
    runs = output.results.runs
    finished = int((runs["status"] == "FINISHED").sum())
    print(
        f"[mesh-results] {len(runs)} runs ({finished} finished) -> {len(output.results.rows)} rows; "
        f"{output.report} ({time.perf_counter() - start:.1f}s)"
    )
    if output.published:
        pages = ", ".join(output.published_pages or output.published)
        if output.published_to == ARTIFACT_DIR:
            print(f"[mesh-results] the ranking, the claims and the report are on the sweep's parent run:\n{pages}")
        else:  # a report over several experiments: beside each grid's own report
            print(
                f"[mesh-results] the report is in the artifacts of the sweeps' parent runs, {output.published_to}/: {pages}"
            )
    for name, experiment_id in output.experiment_ids.items():
        print(f"[mesh-results] MLflow, experiment {name!r}:\n{runs_list_url(uri, experiment_id, output.view)}")
    return 0


def _recorded_context(uri: str, experiments: Sequence[str]) -> list[str]:
    """The context lines the job of the one grid ``experiments`` names recorded on its parent run
    (``mesh-demo``'s decided result and regime), so that this report keeps them; none for several."""
    if len(experiments) != 1:
        return []
    from results.publish.parents import recorded_context
    from results.runs.store import open_client

    client = open_client(uri)
    experiment = client.get_experiment_by_name(experiments[0])
    return recorded_context(client, [experiment.experiment_id]) if experiment else []


def _from_csv(csv: str, out: str | None, metric: str, experiments: Sequence[str]) -> int:
    from results.pipeline import rebuild_claims
    from results.rows.frame import ResultsError

    try:
        folder = Path(out) if out else Path(csv).parent
        path, evaluations, _ = rebuild_claims(csv, folder.resolve(), metric, "", experiments)
    except ResultsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"[mesh-results] {len(evaluations)} claim evaluations from {Path(csv).resolve()} -> {path.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
