"""``mesh-sweep GRID seeds=auto``: seeds in stages until the grid's primary claims are decided, and
``mesh-sweep GRID --plan``: the seeds and CPU-hours the paper's effects would need.

It runs a grid (sweeps) and reads it back (results), so it lives in the top layer; ``mesh-sweep``
finds it through the ``mesh.sweep`` entry points (sweeps.sweep.results_driver).

A stage is the normal grid machinery (:func:`sweeps.sweep.run_sweep`) on the arms that still need
seeds, at the stage's seeds: finished runs are skipped, so the same command resumes. After each
stage the finished runs are read back (results.runs.store, results.rows.aggregate), the primary claims
evaluated (results.verdicts.claims, paired by seed) and each one decided by the group-sequential design of
results/stats/sequential.py at its look. Decisions depend only on the runs, look by look, so a resumed
command reaches the same ones. Each stage is recorded on the parent run of stage 1 (the whole grid
at seeds 0..stage-1): a ``seeds_auto.stage<k>`` tag and ``stages.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

from experiments.budget import flop_seconds
from experiments.plan import RunPlan, with_seed
from mesh_model import ConfigError
from results.rows import frame as rows_frame
from results.rows.aggregate import aggregate
from results.runs import store as collect
from results.runs.committed import read_runs_csv
from results.stats.comparison import seeds_needed
from results.stats.sequential import (
    CONTINUE,
    PRIOR_SD,
    PRIOR_SD_SOURCE,
    SEQUENTIAL_SEARCH,
    Design,
    sequential_seeds_needed,
)
from results.verdicts.claims import FRAGILE_N, ClaimSet, Evaluation, canonical_scheme
from results.verdicts.engine import evaluate
from results.verdicts.schema import load_claims
from results.verdicts.sequential import Verdict, paired_diffs, verdict_at
from sweeps.catalogue import swept_keys
from sweeps.cells import Cell
from sweeps.grid import AutoSeeds, grid_cells, grid_key, read_request, split_auto_seeds, sweep_dir_for
from sweeps.launch.config import LaunchConfig
from sweeps.packing import usable_cores
from sweeps.parent import ParentRun
from sweeps.sweep import run_sweep

Arm = tuple[str, ...]  # a cell's overrides without its seed


def arm_of(cell: Cell) -> Arm:
    return tuple(o for o in cell.overrides if not o.startswith("seed="))


def seed_of(cell: Cell) -> int:
    return next(int(o.removeprefix("seed=")) for o in cell.overrides if o.startswith("seed="))


def grid_arms(name: str, rest: Sequence[str]) -> tuple[list[Cell], list[RunPlan], LaunchConfig]:
    """The arms (cells at seed 0) and their plans; every cell checked before compute."""
    launch, cell_overrides, _ = read_request(name, [*rest, "seeds=[0]"])
    cells, plans = grid_cells(name, cell_overrides, launch)
    return cells, plans, launch


def primary_claims(claims: ClaimSet, plans: Sequence[RunPlan]) -> list[str]:
    """The primary pairwise claims whose two schemes are both among the grid's arms."""
    schemes = {canonical_scheme(p.train.scheme) for p in plans}
    found = []
    for claim in claims.claims:
        if claim.priority != "primary" or claim.kind != "pairwise":
            continue
        against = set(claim.against.schemes) if claim.against.schemes != ("same",) else set(claim.row.schemes)
        if set(claim.row.schemes) & schemes and against & schemes:
            found.append(claim.id)
    return found


def untested_claims(primary: Sequence[str], verdicts: Sequence[Verdict]) -> list[str]:
    """The primary claims no verdict of this stage speaks for: a stage that leaves one untested (its
    rows were not compared, or a run is missing) decides nothing, rather than "every claim decided"."""
    spoken = {v.claim for v in verdicts}
    return [c for c in primary if c not in spoken]


def read_stage(
    plans_by_hash: dict[str, tuple[Arm, int]],
    tracking_uri: str,
    experiment: str,
    claims: ClaimSet,
    earlier: pd.DataFrame | None = None,
):
    """The primary evaluations of the finished runs of this grid, and the frame of those runs; with
    ``earlier`` (:func:`earlier_runs`), also the earlier part's runs of the cells this store lacks."""
    frame = finished_runs(tracking_uri, experiment)
    frame = frame[frame["config_hash"].isin(list(plans_by_hash)) & (frame["status"] == "FINISHED")]
    if earlier is not None and not earlier.empty:
        frame = with_earlier(frame, earlier[earlier["config_hash"].isin(list(plans_by_hash))])
    if frame.empty:
        return [], frame
    results = aggregate(frame)
    evaluations = [
        e
        for e in evaluate(results, claims)
        if e.family == "primary" and e.claim.kind == "pairwise" and e.lines and e.row is not None
    ]
    return evaluations, frame


def unsettled(hashes: Sequence[str], tracking_uri: str, experiment: str) -> list[str]:
    """The config hashes among ``hashes`` with a RUNNING run and no finished one: cells another
    process (a worker of a grid that died) still trains, on which no stage may decide."""
    frame = finished_runs(tracking_uri, experiment)
    mine = frame[frame["config_hash"].isin(list(hashes))]
    settled = set(mine[mine["status"].isin(["FINISHED", rows_frame.NONFINITE])]["config_hash"])
    return sorted(set(mine[mine["status"] == "RUNNING"]["config_hash"]) - settled)


def earlier_runs(folder: str, hashes: Sequence[str]) -> pd.DataFrame:
    """The finished runs of this grid's cells (``hashes``) that an earlier part reported in
    ``folder/runs.csv`` (``seeds.earlier``: a grid run in parts, each in its own store)."""
    if not folder:
        return pd.DataFrame(columns=["run_id", "config_hash", "status"])
    frame = read_runs_csv(Path(folder) / "runs.csv")
    return frame[frame["config_hash"].isin(list(hashes)) & (frame["status"] == "FINISHED")].reset_index(drop=True)


def with_earlier(frame: pd.DataFrame, earlier: pd.DataFrame) -> pd.DataFrame:
    """This store's runs and the earlier part's of the cells it lacks, joined as ``mesh-results --add``
    joins two parts (:func:`results.pipeline.merged`: a cell in both is this store's); the store's
    runs first put in the form ``runs.csv`` gives them (written and read back as a report writes
    it), so the rows group alike on both sides."""
    if frame.empty:
        return earlier
    from results.pipeline import RunData, merged  # the report's machinery (matplotlib): only for a part

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "runs.csv"
        rows_frame.runs_table(aggregate(frame).runs).to_csv(path, index=False)
        mine = read_runs_csv(path)
    return merged(RunData(earlier), RunData(mine)).frame


def finished_runs(tracking_uri: str, experiment: str) -> pd.DataFrame:
    """The experiment's runs; none when the store or the experiment does not exist yet (nothing is created)."""
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).exists():
        return pd.DataFrame(columns=["run_id", "config_hash", "status"])
    try:
        return collect.collect_runs(collect.open_client(tracking_uri), [experiment])
    except rows_frame.ResultsError:
        return pd.DataFrame(columns=["run_id", "config_hash", "status"])


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    lines = [f"{'claim':26s} {'n':>3s} {'mean Δ':>9s} {'t':>7s} {'bound':>7s}  verdict  (rows)"]
    for v in verdicts:
        t = f"{v.statistic:+.2f}" if v.statistic is not None else "—"
        lines.append(
            f"{v.claim:26s} {v.n:3d} {v.mean:+9.4f} {t:>7s} {v.bound:7.2f}  {v.verdict}  {v.rci_text}  ({v.rows})"
        )
    return "\n".join(lines)


def run_seconds(plans_by_hash: dict[str, tuple[Arm, int]], plans: Sequence[RunPlan]) -> dict[Arm, float]:
    """Each arm's mean measured wall time (``timing.total_s`` of its finished runs' result.json)."""
    times: dict[Arm, list[float]] = {}
    for plan in plans:
        if plan.result_file.exists():
            total = (json.loads(plan.result_file.read_text()).get("timing") or {}).get("total_s")
            if total:
                times.setdefault(plans_by_hash[plan.config_hash][0], []).append(float(total))
    return {arm: statistics.fmean(values) for arm, values in times.items()}


def run_auto(
    name: str, arguments: Sequence[str], dry_run: bool = False, out: TextIO = sys.stdout, command: str | None = None
) -> int:
    """Stages of ``auto.stage`` seeds per needed arm until every primary claim is decided, the cap
    or the budget; the exit code of the last stage that failed, else 0."""
    auto, rest = split_auto_seeds(arguments)
    assert auto is not None
    arms_cells, arm_plans, launch = grid_arms(name, rest)
    claims = load_claims()
    primary = primary_claims(claims, arm_plans)
    if not primary:
        raise ConfigError("seeds=auto", name, "a grid whose arms test a primary claim of results/paper_claims.yaml")
    design = Design(auto.stage, auto.max, auto.alpha, len(primary), auto.spending, auto.futility)  # m fixed up front
    arms = [arm_of(c) for c in arms_cells]
    first = auto.first
    hashes = {
        with_seed(p, s).config_hash: (arm, s)
        for arm, p in zip(arms, arm_plans, strict=True)
        for s in range(first, first + auto.max)
    }
    print(f"{name} seeds=auto: {len(arms)} arms, primary claims {', '.join(primary)}; {_design_text(design)}", file=out)
    print(f"seeds {first}..{first + auto.max - 1} (seeds.first={first})", file=out)
    earlier = earlier_runs(auto.earlier, list(hashes))
    carried = set(earlier["config_hash"])
    if auto.earlier:
        print(
            f"seeds.earlier: {len(carried)} finished run(s) of this grid in {Path(auto.earlier) / 'runs.csv'} count "
            "at their looks; their cells are not trained again",
            file=out,
        )
    cell_hash = {(arm, s): h for h, (arm, s) in hashes.items()}
    evaluations, _ = read_stage(hashes, arm_plans[0].tracking_uri, arm_plans[0].experiment, claims, earlier)
    measured = {e.claim.id: [d for _, d in paired_diffs(e)] for e in evaluations}
    print("power at the cap, before spending:", file=out)
    for line in power_lines(claims, primary, measured, design):
        print(line, file=out)
    if dry_run:
        return run_sweep(name, [*rest, _seeds_argument(range(first, first + auto.stage))], dry_run=True, out=out)
    needed, stages, spent_h, status = set(arms), [], 0.0, 0
    ran_here: tuple[list[int], Callable[[Cell], bool]] | None = None  # the first stage trained in this store
    for k, size in enumerate(design.looks):
        seeds = list(range(first + (design.looks[k - 1] if k else 0), first + size))
        print(f"\nstage {k + 1}: seeds {seeds[0]}..{seeds[-1]} on {len(needed)} arm(s)", file=out)
        chosen = set(needed)

        def in_stage(cell: Cell, chosen: set[Arm] = chosen) -> bool:
            return arm_of(cell) in chosen and cell_hash.get((arm_of(cell), seed_of(cell))) not in carried

        from_earlier = sum(cell_hash.get((a, s)) in carried for a in chosen for s in seeds)
        if from_earlier:
            print(f"  {from_earlier} of its {len(chosen) * len(seeds)} cells finished in the earlier part", file=out)
        if from_earlier < len(chosen) * len(seeds):
            seeds_text = f"seeds=[{','.join(map(str, seeds))}]"
            code = run_sweep(name, [*rest, seeds_text], out=out, command=command, only=in_stage)
            status = status or code
            ran_here = ran_here or (seeds, in_stage)
        stage_hashes = [
            with_seed(p, s).config_hash for a, p in zip(arms, arm_plans, strict=True) if a in chosen for s in seeds
        ]
        if running := unsettled(stage_hashes, arm_plans[0].tracking_uri, arm_plans[0].experiment):
            print(
                f"seeds=auto stops: {len(running)} run(s) of stage {k + 1} are still RUNNING in another process; "
                "no decision is taken on them: run the same command again once they end",
                file=out,
            )
            return status or 1
        # Only the seeds of stages 1..k: runs of later seeds already there (a driver killed while its
        # next stage's jobs ran on) are this look's decision at its own n, not a larger one.
        looked = {h: (arm, s) for h, (arm, s) in hashes.items() if s < first + size}
        evaluations, frame = read_stage(looked, arm_plans[0].tracking_uri, arm_plans[0].experiment, claims, earlier)
        arm_by_run = _arms_by_run(frame, hashes)
        verdicts = [verdict_at(design, e, arm_by_run(e)) for e in evaluations]
        print(f"\n{verdict_table(verdicts)}", file=out)
        if untested := untested_claims(primary, verdicts):
            stop = (
                f"no decision on stage {k + 1}: the primary claim(s) {', '.join(untested)} have no comparison in "
                "this stage's finished runs (mesh-results' claims.md says why for each)"
            )
            stages.append({"stage": k + 1, "seeds": seeds, "arms": len(chosen), "verdicts": [], "spent_h": spent_h})
            _record(name, rest, ran_here, arm_plans, stages, stop, primary, auto)
            print(f"seeds=auto stops: {stop}", file=out)
            return status or 1
        measured = {e.claim.id: [d for _, d in paired_diffs(e)] for e in evaluations}
        open_claims = [v.claim for v in verdicts if v.decision == CONTINUE]
        if open_claims and k < len(design.looks) - 1:  # re-planned on the SD the runs show so far
            print("power at the cap, re-planned on this stage's SD:", file=out)
            for line in power_lines(claims, open_claims, measured, design):
                print(line, file=out)
        stage_plans = [with_seed(p, s) for arm, p in zip(arms, arm_plans, strict=True) for s in seeds if arm in chosen]
        seconds = run_seconds(hashes, stage_plans)
        spent_h += _hours(sum(seconds.get(a, 0.0) for a in chosen) * len(seeds), launch)
        needed = next_arms(verdicts, arms, auto.every_arm)
        record = {"stage": k + 1, "seeds": seeds, "arms": len(chosen), "verdicts": [asdict(v) for v in verdicts],
                  "spent_h": spent_h}  # fmt: skip
        stages.append(record)
        stop = _stop_reason(needed, k, design, auto, seconds, spent_h, launch, out)
        _record(name, rest, ran_here, arm_plans, stages, stop, primary, auto)
        if stop:
            print(f"seeds=auto stops: {stop}", file=out)
            return status
    return status


def _arms_by_run(frame: pd.DataFrame, hashes: dict[str, tuple[Arm, int]]):
    """evaluation -> the arms its two rows ran in (from the runs' config hashes)."""
    by_run = {r: hashes.get(h, ((), 0))[0] for r, h in zip(frame["run_id"], frame["config_hash"], strict=True)}

    def arms(evaluation: Evaluation) -> list[Arm]:
        rows = [row for row in (evaluation.row, evaluation.lines[0].other) if row is not None]
        return sorted({by_run[r] for row in rows for r in row.run_ids if by_run.get(r)})

    return arms


def duration_text(seconds: float) -> str:
    return (
        f"{seconds / 3600:.1f} h"
        if seconds >= 3600
        else f"{seconds / 60:.1f} min"
        if seconds >= 60
        else f"{seconds:.0f} s"
    )


def cores_per_cell(launch) -> int:
    """The cores one cell computes on: a cell sent elsewhere (SLURM) its allocation, cpus per task x
    tasks x nodes; a cell run here its share of this machine, which the local launchers divide
    among the cells they run at once (``resources.cpus_per_task`` does not apply to them)."""
    resources = launch.resources
    if launch.launcher.memory_limit(resources) is not None:
        return resources.cpus_per_task * resources.tasks * resources.nodes
    return max(1, usable_cores() // max(1, launch.launcher.concurrency))


def _hours(seconds: float, launch) -> float:
    """CPU core-hours of ``seconds`` of cells' wall time."""
    return seconds * cores_per_cell(launch) / 3600.0


def next_arms(verdicts: Sequence[Verdict], arms: Sequence[Arm], every_arm: bool = False) -> set[Arm]:
    """The arms the next stage runs: those of the claims still open; with ``seeds.every_arm=true``
    every arm while any claim is open, so that rows whose claims are decided stay on the seeds of the
    others (a comparison between them is then paired on every seed, not on the first stages')."""
    open_arms = {a for v in verdicts if v.decision == CONTINUE for a in v.arms}
    return set(arms) if every_arm and open_arms else open_arms


def _stop_reason(needed, k, design, auto: AutoSeeds, seconds, spent_h, launch, out) -> str:
    if not needed:
        return "every primary claim is decided"
    if k == len(design.looks) - 1:
        return f"the cap seeds.max={auto.max}: the undecided claims are inconclusive"
    adding = design.looks[k + 1] - design.looks[k]
    wall = sum(seconds.get(a, statistics.fmean(seconds.values()) if seconds else 0.0) for a in needed) * adding
    cost = _hours(wall, launch)
    gpus = launch.resources.gpus_per_node * launch.resources.nodes
    eta = duration_text(wall / max(1, launch.launcher.concurrency))
    projected = (
        f"projected {cost:.3g} CPU-h{f', {wall * gpus / 3600:.3f} GPU-h' if gpus else ''}, ETA {eta} "
        "(measured run times of this stage)"
        if seconds
        else "no projection: no run of this stage was timed in this store (an earlier part's runs)"
    )
    print(
        f"next: seeds {auto.first + design.looks[k]}..{auto.first + design.looks[k + 1] - 1} on {len(needed)} arm(s); "
        + projected,
        file=out,
    )
    if auto.budget_cpu_h is not None and spent_h + cost > auto.budget_cpu_h:
        return f"seeds.budget_cpu_h={auto.budget_cpu_h}: {spent_h:.3f} spent, the next stage needs {cost:.3f}"
    if auto.budget_gpu_h is not None and gpus and (spent_h + cost) / cores_per_cell(launch) * gpus > auto.budget_gpu_h:
        return f"seeds.budget_gpu_h={auto.budget_gpu_h}: the next stage would pass it"
    return ""


def _record(
    name: str,
    rest: Sequence[str],
    ran_here: tuple[list[int], Callable[[Cell], bool]] | None,
    plans: Sequence[RunPlan],
    stages: list[dict[str, Any]],
    stop: str,
    claims: Sequence[str],
    auto: AutoSeeds,
) -> None:
    """The stages on the parent run of the first stage trained in this store (stage 1, the whole grid
    at its first seeds, unless an earlier part ran it: ``seeds.earlier``): ``stages.json``, the
    structured record the report reads the design from (its settings and the primary claims it
    decided, so that the family size is the one the design used). Nothing is recorded while no stage
    has trained here."""
    if ran_here is None:
        return
    seeds, kept = ran_here
    launch, cell_overrides, _ = read_request(name, [*rest, _seeds_argument(seeds)])
    cells, stage_plans = grid_cells(name, cell_overrides, launch)
    first = [p for c, p in zip(cells, stage_plans, strict=True) if kept(c)]
    found = ParentRun.find(plans[0].tracking_uri, sweep_dir_for(first[0], grid_key(name, first)))
    if found is None:
        return
    parent, _ = found
    document = {"design": asdict(auto), "claims": list(claims), "stages": stages, "stopped": stop}
    parent.client.log_dict(parent.run_id, document, "stages.json")
    last = stages[-1]
    summary = ", ".join(f"{v['claim']} {v['verdict']}" for v in last["verdicts"])
    parent.set_tags(
        {
            f"seeds_auto.stage{last['stage']}": f"seeds {last['seeds']}: {summary}",
            "seeds_auto.stopped": stop or "running",
        }
    )


def _design_text(design: Design) -> str:
    bounds = ", ".join(f"n={n}: |t|>{b:.2f}" for n, b in zip(design.looks, design.boundaries, strict=True))
    return (
        f"group-sequential paired t, alpha={design.alpha} Bonferroni over {design.claims} ({design.share:.4f} each), "
        f"{design.spending.replace('_', '-')} spending (Lan-DeMets), bounds {bounds}"
    )


def _seeds_argument(seeds: Sequence[int]) -> str:
    """``seeds=3`` for 0..2 (the form a plain grid uses, so its parent run is the same), else a list."""
    seeds = list(seeds)
    return f"seeds={len(seeds)}" if seeds == list(range(len(seeds))) else f"seeds=[{','.join(map(str, seeds))}]"


@dataclass(frozen=True)
class ClaimPlan:
    """One primary claim's plan: the SD it assumes and where it comes from, the design's power at the
    cap for the paper's effect at that SD, the fixed-n seeds per arm for 80% power at alpha / m, and
    the cap at which the sequential design itself reaches 80% (what a seeds=auto grid needs)."""

    claim: str
    effect: float
    sd: float
    source: str
    power: float
    cap: int
    needed: int | None
    needed_sequential: int | None = None

    @property
    def needed_text(self) -> str:
        """``22 seeds per arm at fixed n, a cap of 24 under the sequential design (stages of 3)``."""
        if self.needed is None:
            return "no seed count reaches 80% power"
        sequential = (
            f"a cap of {self.needed_sequential} under the sequential design"
            if self.needed_sequential
            else f"more than {SEQUENTIAL_SEARCH * self.cap} under the sequential design (searched to there)"
        )
        return f"{self.needed} seeds per arm at fixed n, {sequential} for 80% power"

    @property
    def warning(self) -> str:
        """One line when the power at the cap is below 50%, else empty."""
        if self.power >= 0.5:
            return ""
        return f"warning: {self.claim}: {self.power:.0%} power at {self.cap} seeds; {self.needed_text}"


MIN_SEEDS_FOR_SD = FRAGILE_N  # under this many finished paired seeds an observed SD is too thin to plan on


def plan_claim(claim_id: str, effect: float, diffs: Sequence[float], design: Design) -> ClaimPlan:
    """The plan of one claim: the SD of its finished per-seed differences (:data:`MIN_SEEDS_FOR_SD` or
    more), else the prior, or the observed SD of fewer seeds where it is larger (two seeds once gave
    SD 0.0042 and "4 seeds per arm" for a comparison that took 60)."""
    observed = statistics.stdev(diffs) if len(diffs) >= 2 else None
    if observed and len(diffs) >= MIN_SEEDS_FOR_SD:
        sd, source = observed, f"SD {observed:.4f} from {len(diffs)} finished paired seeds"
    elif observed and observed > PRIOR_SD:
        sd, source = (
            observed,
            f"SD {observed:.4f} from {len(diffs)} finished paired seeds (above the prior {PRIOR_SD:g})",
        )
    else:
        sd, source = PRIOR_SD, PRIOR_SD_SOURCE
        if observed is not None:
            source += f"; not the SD {observed:.4f} of {len(diffs)} finished paired seeds (under {MIN_SEEDS_FOR_SD})"
    power = design.power(effect, sd, paths=50_000)
    fixed = seeds_needed(effect, sd, design.share)
    sequential = sequential_seeds_needed(design, effect, sd, fixed) if fixed is not None else None
    return ClaimPlan(claim_id, effect, sd, source, power, design.n_max, fixed, sequential)


def power_lines(claims: ClaimSet, ids: Sequence[str], measured: dict[str, list[float]], design: Design) -> list[str]:
    """For each claim of ``ids`` with a paper effect: its power at the cap, and a warning below 50%."""
    lines = []
    for claim in claims.claims:
        if claim.id not in ids or not claim.paper_effect:
            continue
        plan = plan_claim(claim.id, claim.paper_effect, measured.get(claim.id, []), design)
        lines.append(
            f"  {claim.id:26s} effect {plan.effect:+.3f}, {plan.source}: {plan.power:.0%} power at the cap "
            f"({plan.cap} seeds); {plan.needed_text}"
        )
        if plan.warning:
            lines.append(f"  {plan.warning}")
    return lines


def print_plan(name: str, arguments: Sequence[str], out: TextIO = sys.stdout, **_: object) -> int:
    """For each primary claim the grid can evaluate: the power of the seeds=auto design at its cap and
    the seeds the paper's effect needs at 80% power at alpha / m (SD of the per-seed differences from
    finished runs of these cells, else the prior, said with its source), and their cost."""
    auto, rest = split_auto_seeds(arguments)
    rest = [a for a in rest if not a.startswith("seeds=")]
    arms_cells, arm_plans, launch = grid_arms(name, rest)
    declared = "seed" in swept_keys(name)  # a study whose file declares its seeds (and its rule)
    if declared or any(plan.train.depth_eval.enabled for plan in arm_plans):  # a study: its budget first
        print_study_budget(name, arguments, out)
        if declared:
            print(
                f"{name} --plan: its seeds and decision rule are declared in its sweep file (descriptive at a "
                "fixed n); no claim's power to plan",
                file=out,
            )
            return 0
    claims = load_claims()
    primary = primary_claims(claims, arm_plans)
    auto = auto or AutoSeeds(alpha=claims.alpha)
    design = Design(auto.stage, auto.max, auto.alpha, max(1, len(primary)), auto.spending, auto.futility)
    alpha = design.share
    arms = [arm_of(c) for c in arms_cells]
    seeds = range(auto.first, auto.first + PLAN_SEEDS)
    hashes = {with_seed(p, s).config_hash: (arm, s) for arm, p in zip(arms, arm_plans, strict=True) for s in seeds}
    evaluations, _ = read_stage(hashes, arm_plans[0].tracking_uri, arm_plans[0].experiment, claims)
    measured = {e.claim.id: [d for _, d in paired_diffs(e)] for e in evaluations}
    seconds = run_seconds(hashes, [with_seed(p, s) for p in arm_plans for s in seeds])
    per_run = statistics.fmean(seconds.values()) if seconds else None
    print(
        f"{name} --plan: {len(arms)} arms, alpha {alpha:.4f} per primary claim (Bonferroni over {len(primary)}); "
        f"power at the cap of the seeds=auto design (stages of {design.stage}, cap {design.n_max}, simulated); "
        + sd_basis(primary, measured),
        file=out,
    )
    warnings = []
    for claim in (c for c in claims.claims if c.id in primary):
        if not claim.paper_effect:
            continue
        plan = plan_claim(claim.id, claim.paper_effect, measured.get(claim.id, []), design)
        line = f"  {claim.id:26s} effect {claim.paper_effect:+.3f}, {plan.source}: {plan.power:.0%} power at {plan.cap} seeds; "
        if plan.warning:
            warnings.append(plan.warning)
        # the cost of the seeds the grid would run: the sequential design's cap (it may stop before)
        n = plan.needed_sequential or plan.needed
        if n is None:
            print(line + plan.needed_text, file=out)
            continue
        wall = (per_run if per_run is not None else _flop_seconds(arm_plans[0], cores_per_cell(launch))) * n * 2
        cost = _hours(wall, launch)
        eta = duration_text(wall / max(1, launch.launcher.concurrency))
        how = "measured run times" if per_run is not None else "FLOP model"
        print(
            line
            + f"{plan.needed_text}; 2 arms at {n} seeds {cost:.3g} CPU-h, ETA {eta} on launcher={launch.launcher.name} ({how})",
            file=out,
        )
    for warning in warnings:
        print(warning, file=out)
    return 0


def print_study_budget(name: str, arguments: Sequence[str], out: TextIO) -> None:
    """What ``--plan`` says first of a grid whose cells are evaluated after training (``depth_eval``,
    the depth study): its budget (every cell, the FLOP model, as mesh-sweep estimates a grid), what its
    finished runs took, and the evaluation."""
    from sweeps.estimate import count_line, distinct_configs, estimate_grid

    launch, cell_overrides, _ = read_request(name, list(arguments))
    cells, plans = grid_cells(name, cell_overrides, launch)
    estimate = estimate_grid(distinct_configs(cells))
    print(f"{count_line(name, distinct_configs(cells))}; {estimate.describe()}", file=out)
    done = [p for p in plans if p.result_file.exists()]
    if done:
        took = sum(json.loads(p.result_file.read_text()).get("timing", {}).get("total_s", 0.0) for p in done)
        print(
            f"  {len(done)} of its runs finished, in {took / 3600:.2f} h of run time (their time/total_s summed)",
            file=out,
        )
    loops = plans[0].train.depth_eval
    if not loops.enabled:
        return
    print(
        f"  then each cell's depth_eval (loops {loops.loops}, exit {loops.exit} up to {loops.exit_loops or 'K'} loops) "
        "on its validation windows: forward passes only, not in the FLOP model",
        file=out,
    )


def sd_basis(primary: Sequence[str], measured: dict[str, list[float]]) -> str:
    """What the plan's SDs rest on, for its first line: the runs' own where every primary claim has
    :data:`MIN_SEEDS_FOR_SD` finished paired seeds, else the stated prior (or the observed, if larger)."""
    fewest = min((len(measured.get(c, [])) for c in primary), default=0)
    if fewest >= MIN_SEEDS_FOR_SD:
        return f"SD from the finished runs ({fewest}+ paired seeds per claim)"
    return (
        f"under {MIN_SEEDS_FOR_SD} finished seeds per cell ({fewest} here), so SD = the prior {PRIOR_SD:g} "
        "or the observed, whichever is larger"
    )


PLAN_SEEDS = 16  # --plan reads the finished runs of seeds 0..15


def _flop_seconds(plan: RunPlan, cores: int) -> float:
    """One run's wall time from the FLOP model (experiments/budget.py, also what mesh-sweep estimates)."""
    return flop_seconds(plan.model_config, plan.budget, cores)
