"""The declared rule of the open-choices screen (``sweeps/conf/sweep/mesh_open_choices.yaml``, stage
A), applied to a report's ``runs.csv`` and ``routing.csv``: ``decision.md``.

For each candidate arm, d = the mean over seeds of log PPL(arm, s) - log PPL(mesh, s), paired by
seed (final validation PPL); the arms with d < -0.01 are selected, the best two at most. The rule
selects, it does not test (3 seeds). Beside it, descriptive readouts per arm and seed: the coda
input's coefficient of f_K at the end ("collapse" below 0.1), the final read's entropy at 0.5M
tokens (step 250) and at the end, and the paired difference to base and anchor.

    python results/cpu-reproduction/one-pass/open_choices.py results/cpu-reproduction/one-pass/open_choices

writes ``decision.md`` and ``selected.txt`` (the selected arms, one per line, for stage B) there.
With ``--confirmation`` (stage B's report folder: the selected arms, base and anchor, no control) it
writes ``readouts.md``: the same readouts per arm, no selection; the verdicts are the report's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

PPL = "val/docs/ppl"
THRESHOLD = -0.01  # d below this: at least 1% better than the control
KEEP = 2  # the best two at most
COLLAPSE = 0.1  # the coda input's coefficient of f_K below this: the last iteration is ignored
EARLY_STEP = 250  # 0.5M tokens
CONTROL = "mesh"
CANDIDATES = (
    "mesh_own_slot",
    "mesh_router_lr",
    "mesh_rmsnorm",
    "mesh_z_loss",
    "mesh_residual_read",
    "mesh_warmup",
    "frozen_routing",
)
REFERENCES = ("base", "anchor")

# How each arm's runs are told apart in a report: the scheme, and the settings its file in
# experiments/conf/arm/ sets, as the row's ``overrides`` column spells them (a setting at its default
# value may appear there too, when another arm changed it).
MESH_SETTINGS = {
    "mesh_own_slot": "mesh_router_init=own_slot",
    "mesh_router_lr": "router_lr_scale=0.1",
    "mesh_rmsnorm": "mesh_router_norm=rmsnorm",
    "mesh_z_loss": "mesh_router_z_coef=0.001",
    "mesh_residual_read": "mesh_final_read=residual",
    "mesh_warmup": "warmup_fraction=0.1",
}
SCHEMES = {"frozen_routing": "0.2*core+residual", "base": "base", "anchor": "anchor"}


def arm_of(scheme: str, overrides: str) -> str | None:
    """The arm a row of the screen belongs to (None: not one of its arms)."""
    for arm, name in SCHEMES.items():
        if scheme == name:
            return arm
    if scheme != "mesh":
        return None
    words = set(str(overrides or "").split())
    matched = [arm for arm, setting in MESH_SETTINGS.items() if any(w.endswith(setting) for w in words)]
    if len(matched) > 1:
        raise ValueError(f"row with overrides {overrides!r} matches several arms: {matched}")
    return matched[0] if matched else CONTROL


@dataclass(frozen=True)
class ArmResult:
    arm: str
    ppl: dict[int, float]  # seed -> final validation PPL
    d: float | None  # vs the control, paired; None for the control and the references
    d_seeds: dict[int, float]
    vs: dict[str, float]  # reference -> mean paired log PPL difference
    fk: dict[int, float]  # seed -> coda coefficient of f_K at the end
    read_early: dict[int, float]  # seed -> final read's entropy at EARLY_STEP
    read_end: dict[int, float]

    @property
    def selectable(self) -> bool:
        return self.d is not None and self.arm != "frozen_routing" and self.d < THRESHOLD

    @property
    def collapsed(self) -> int:
        return sum(v < COLLAPSE for v in self.fk.values())


def _paired(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    return {s: math.log(a[s]) - math.log(b[s]) for s in sorted(set(a) & set(b))}


def _by_seed(frame: pd.DataFrame, column: str = "value") -> dict[int, float]:
    return {int(s): float(v) for s, v in zip(frame["seed"], frame[column], strict=True)}


def evaluate_screen(runs: pd.DataFrame, routing: pd.DataFrame, control: bool = True) -> list[ArmResult]:
    """Every arm present, in the declared order, with its d and readouts (``control=False``: stage B,
    which runs no control arm; d is then None for every arm)."""
    finished = runs[runs["status"] == "FINISHED"].copy()
    finished["arm"] = [arm_of(s, o) for s, o in zip(finished["scheme"], finished["overrides"], strict=True)]
    ppl = {arm: _by_seed(group, PPL) for arm, group in finished.groupby("arm")}
    if control and CONTROL not in ppl:
        raise ValueError("the control arm (mesh) has no finished run")
    arm_by_run = dict(zip(finished["run_id"], finished["arm"], strict=True))
    routed = routing[routing["run_id"].isin(arm_by_run)].assign(arm=lambda f: f["run_id"].map(arm_by_run))
    results = []
    for arm in (CONTROL, *CANDIDATES, *REFERENCES):
        if arm not in ppl:
            continue
        own = routed[routed["arm"] == arm]
        d_seeds = _paired(ppl[arm], ppl[CONTROL]) if control and arm not in (CONTROL, *REFERENCES) else {}
        end = own[own["step"] == own["step"].max()] if not own.empty else own
        results.append(
            ArmResult(
                arm=arm,
                ppl=ppl[arm],
                d=statistics.fmean(d_seeds.values()) if d_seeds else None,
                d_seeds=d_seeds,
                vs={
                    r: statistics.fmean(_paired(ppl[arm], ppl[r]).values()) for r in REFERENCES if r in ppl and r != arm
                },
                fk=_by_seed(end[end["metric"] == f"routing/coef/coda/f{_loops(own)}/mean"]) if not own.empty else {},
                read_early=_entropy(own, EARLY_STEP),
                read_end=_entropy(own, int(own["step"].max()) if not own.empty else -1),
            )
        )
    return results


def _loops(routing: pd.DataFrame) -> int:
    cores = [int(m.split("/")[3][1:]) for m in routing["metric"].unique() if m.startswith("routing/coef/coda/f")]
    return max(cores) if cores else 0


def _entropy(routing: pd.DataFrame, step: int) -> dict[int, float]:
    metric = f"routing/loop{_loops(routing)}/read/entropy"
    return _by_seed(routing[(routing["step"] == step) & (routing["metric"] == metric)])


def selected(results: Sequence[ArmResult]) -> list[ArmResult]:
    """The declared selection: d < THRESHOLD, ranked by d, the best KEEP."""
    return sorted((r for r in results if r.selectable), key=lambda r: r.d)[:KEEP]  # type: ignore[arg-type, return-value]


def _spread(values: dict[int, float], text: Callable[[float], str]) -> str:
    if not values:
        return "—"
    return f"{text(statistics.fmean(values.values()))} ({', '.join(text(v) for _, v in sorted(values.items()))})"


def _pct(value: float) -> str:
    return f"{math.expm1(value) * 100:+.1f}%"


def _mean_sd(r: ArmResult) -> str:
    values = list(r.ppl.values())
    sd = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.2f}{sd}"


def _readout_cells(r: ArmResult) -> str:
    """The table cells both stages share: vs base, vs anchor, f_K at the end, collapsed, the entropies."""
    return (
        f"{_vs(r, 'base', _pct)} | {_vs(r, 'anchor', _pct)} | {_spread(r.fk, lambda v: f'{v:.3f}')} | "
        f"{r.collapsed if r.fk else '—'}/{len(r.fk) or '—'} | {_spread(r.read_early, lambda v: f'{v:.3f}')} | "
        f"{_spread(r.read_end, lambda v: f'{v:.3f}')} |"
    )


def render_decision(results: Sequence[ArmResult]) -> str:
    chosen = selected(results)
    lines = [
        "# The open-choices screen, stage A: the declared rule applied",
        "",
        "Rule (declared in `sweeps/conf/sweep/mesh_open_choices.yaml` before the screen ran): d = mean over "
        "seeds of log PPL(arm) - log PPL(mesh), paired by seed, final validation PPL on `docs`; arms with "
        f"d < {THRESHOLD} (1% better) are selected, the best {KEEP} at most. It selects, it does not test. "
        f"Readouts are descriptive: the coda input's coefficient of f_K at the end (collapse: < {COLLAPSE}), the "
        f"final read's entropy (H / log B) at step {EARLY_STEP} (0.5M tokens) and at the end. Per-seed values "
        "in brackets, seeds in increasing order.",
        "",
        "| arm | PPL mean ± sd (per seed) | d vs mesh (exp(d) - 1) | vs base | vs anchor | f_K coef at end | collapsed | final read entropy, 0.5M | at end |",
        "|---|---|---:|---:|---:|---|---:|---|---|",
    ]
    for r in results:
        ppl = f"{_mean_sd(r)} ({', '.join(f'{v:.2f}' for _, v in sorted(r.ppl.items()))})"
        d = "control" if r.arm == CONTROL else "—" if r.d is None else f"{r.d:+.4f} ({_pct(r.d)})"
        mark = " **selected**" if r in chosen else ""
        lines.append(f"| `{r.arm}`{mark} | {ppl} | {d} | {_readout_cells(r)}")
    lines += ["", "**Selected for stage B**: " + (", ".join(f"`{r.arm}` (d {r.d:+.4f})" for r in chosen) or "none")]
    if not chosen:
        lines.append("(the rule's answer: no single open choice moves MeSH by 1% at this scale; stage B is not run)")
    return "\n".join(lines) + "\n"


def render_readouts(results: Sequence[ArmResult]) -> str:
    """Stage B's readouts: per arm the PPL, the paired difference to base and anchor over the seeds both
    have, and the routing readouts of the screen; descriptive (the verdicts are the report's claims)."""
    lines = [
        "# The open-choices screen, stage B: readouts per arm",
        "",
        "Descriptive: the verdicts are the report's (`claims.md`, the seeds=auto design's decision). vs base, "
        "vs anchor: exp of the mean paired difference of log PPL over the seeds both rows have, minus 1. "
        f"f_K coef: the coda input's coefficient of the last core output at the end (collapse: < {COLLAPSE}); "
        f"entropy: the final read's H / log B at step {EARLY_STEP} (0.5M tokens) and at the end. Per-seed values "
        "in brackets, seeds in increasing order.",
        "",
        "| arm | n | PPL mean ± sd | vs base | vs anchor | f_K coef at end | collapsed | final read entropy, 0.5M | at end |",
        "|---|---:|---|---:|---:|---|---:|---|---|",
    ]
    for r in results:
        lines.append(f"| `{r.arm}` | {len(r.ppl)} | {_mean_sd(r)} | {_readout_cells(r)}")
    return "\n".join(lines) + "\n"


def _vs(result: ArmResult, reference: str, pct: Callable[[float], str]) -> str:
    return pct(result.vs[reference]) if reference in result.vs else "—"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="open_choices.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the screen's report folder (its runs.csv and routing.csv)")
    parser.add_argument(
        "--confirmation", action="store_true", help="stage B's report folder: readouts.md, no selection"
    )
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    try:
        runs, routing = pd.read_csv(folder / "runs.csv"), pd.read_csv(folder / "routing.csv")
        results = evaluate_screen(runs, routing, control=not args.confirmation)
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.confirmation:
        text = render_readouts(results)
        (folder / "readouts.md").write_text(text)
        print(text)
        return 0
    text = render_decision(results)
    (folder / "decision.md").write_text(text)
    (folder / "selected.txt").write_text("".join(f"{r.arm}\n" for r in selected(results)))  # run.sh confirm reads it
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
