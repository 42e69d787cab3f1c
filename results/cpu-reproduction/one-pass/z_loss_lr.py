"""The declared rule of the z-loss LR grid (``sweeps/conf/sweep/z_loss_lr.yaml``), applied to its
report's ``runs.csv``: ``decision.md``.

Rows: the z-loss arm at MeSH's LR 4e-3 and at 8e-3, and base. Per seed, "collapse" is the coda
input's coefficient of f_K at the end below 0.1. With the seeds a row has (6 declared):

* the collapse comes with the LR: at 8e-3 in 4 or more seeds of 6, at 4e-3 in at most 1;
* the collapse comes with the z-loss arm whatever the LR: 4 or more at both;
* no collapse: at most 1 at both;
* otherwise not separated at these seeds (with fewer than 6 seeds a row: not read).

Loss: per LR the paired Δ log PPL of the z-loss arm - base with its 95% t interval, and the arm at
8e-3 - at 4e-3 (paired by seed); "collapse and loss go together" is read only where one LR
collapses and the other does not and the 8e-3 - 4e-3 interval excludes 0, with the side the
collapsed LR's PPL is on (lower or higher: "together" alone does not say which).

    python results/cpu-reproduction/one-pass/z_loss_lr.py results/cpu-reproduction/one-pass/z_loss_lr
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from scipy.stats import t as student_t

PPL = "val/docs/ppl"
FK = "routing/coef/coda/f2/mean"  # the coda input's coefficient of f_K (K = 2)
COLLAPSE = 0.1  # stage A's definition (sweeps/conf/sweep/mesh_open_choices.yaml)
LOW, HIGH = 0.004, 0.008  # the z-loss arm's stage-A and re-tuned LRs
SEEDS = 6  # a row's declared seeds (500-505)
MOST, FEWEST = 4, 1  # of 6 seeds: "collapses" at 4 or more, "does not" at 1 or fewer
Z_LOSS = "mesh_router_z_coef=0.001"
LR_KEY = "optim.lr_by_scheme.mesh="

WITH_LR = "the collapse comes with the LR"
WITH_ARM = "the collapse comes with the z-loss arm whatever the LR"
NONE = "no collapse at either LR"
NOT_SEPARATED = "not separated at these seeds"
INCOMPLETE = "not read: a row is short of its seeds"


@dataclass(frozen=True)
class Row:
    name: str  # "z-loss at 4e-3", "z-loss at 8e-3", "base"
    ppl: dict[int, float]  # seed -> final validation PPL
    fk: dict[int, float]  # seed -> the coda's coefficient of f_K at the end (empty for base)

    @property
    def collapsed(self) -> int:
        return sum(v < COLLAPSE for v in self.fk.values())


@dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    @property
    def text(self) -> str:
        if self.n < 2:
            return f"{self.mean:+.4f} (n={self.n}, no interval)"
        return f"{self.mean:+.4f} [{self.low:+.4f}, {self.high:+.4f}] (n={self.n}, {math.expm1(self.mean) * 100:+.1f}% PPL)"


def paired_interval(a: dict[int, float], b: dict[int, float]) -> Interval:
    """Mean log PPL(a) - log PPL(b) over the seeds both have, with its two-sided 95% t interval."""
    diffs = [math.log(a[s]) - math.log(b[s]) for s in sorted(set(a) & set(b))]
    if not diffs:
        raise ValueError("no seed in common between the rows compared")
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return Interval(1, mean, -math.inf, math.inf)
    half = float(student_t.ppf(0.975, len(diffs) - 1)) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return Interval(len(diffs), mean, mean - half, mean + half)


def _lr(overrides: str) -> float:
    words = [w for w in str(overrides).split() if w.startswith(LR_KEY)]
    if not words:
        raise ValueError(f"a z-loss run names no {LR_KEY}... in its overrides ({overrides!r})")
    return float(words[0].removeprefix(LR_KEY))


def rows(runs: pd.DataFrame) -> dict[str, Row]:
    """The three rows of the grid from its finished runs."""
    finished = runs[runs["status"] == "FINISHED"]
    found: dict[str, tuple[dict[int, float], dict[int, float]]] = {}
    for _, run in finished.iterrows():
        overrides = "" if pd.isna(run.get("overrides")) else str(run["overrides"])
        if run["scheme"] == "base":
            name = "base"
        elif run["scheme"] == "mesh" and any(w.endswith(Z_LOSS) for w in overrides.split()):
            lr = _lr(overrides)
            if not any(math.isclose(lr, x) for x in (LOW, HIGH)):
                raise ValueError(f"a z-loss run at LR {lr:g}: the grid declares {LOW:g} and {HIGH:g}")
            name = f"z-loss at {lr:g}"
        else:
            continue
        ppl, fk = found.setdefault(name, ({}, {}))
        seed = int(run["seed"])
        ppl[seed] = float(run[PPL])
        if name != "base":
            fk[seed] = float(run[FK])
    expected = ("base", f"z-loss at {LOW:g}", f"z-loss at {HIGH:g}")
    missing = [n for n in expected if n not in found]
    if missing:
        raise ValueError(f"no finished run of {', '.join(missing)} in these runs")
    return {n: Row(n, *found[n]) for n in expected}


def reading(low: Row, high: Row) -> str:
    """The declared reading of the collapse counts at the two LRs (6 seeds a row declared: with
    fewer, the counts are not read)."""
    n = min(len(low.fk), len(high.fk))
    if n < SEEDS:
        return f"{INCOMPLETE} ({n} of {SEEDS} seeds at both LRs)"
    if high.collapsed >= MOST and low.collapsed <= FEWEST:
        return WITH_LR
    if high.collapsed >= MOST and low.collapsed >= MOST:
        return WITH_ARM
    if high.collapsed <= FEWEST and low.collapsed <= FEWEST:
        return NONE
    return NOT_SEPARATED


def parts(low: Row, high: Row) -> str:
    """Which LR collapses while the other does not ("" where neither), on the declared 6 seeds."""
    if min(len(low.fk), len(high.fk)) < SEEDS:
        return ""
    if high.collapsed >= MOST and low.collapsed <= FEWEST:
        return "8e-3 collapses, 4e-3 does not"
    if low.collapsed >= MOST and high.collapsed <= FEWEST:
        return "4e-3 collapses, 8e-3 does not"
    return ""


def render(found: dict[str, Row]) -> str:
    base, low, high = found["base"], found[f"z-loss at {LOW:g}"], found[f"z-loss at {HIGH:g}"]
    verdict = reading(low, high)
    vs_base = {r.name: paired_interval(r.ppl, base.ppl) for r in (low, high)}
    between = paired_interval(high.ppl, low.ppl)
    parted = parts(low, high)
    if parted:
        shown = "excludes 0" if between.excludes_zero else "covers 0"
        together = f"{'yes' if between.excludes_zero else 'not shown'}: {parted}, and the 8e-3 - 4e-3 interval {shown}"
        if between.excludes_zero:  # which way: the rule's "together" does not say whether collapse costs or gains
            collapsed_lower = (between.mean < 0) == (high.collapsed > low.collapsed)  # one LR collapsed: parts()
            together += f" (the collapsed LR's PPL is the {'lower' if collapsed_lower else 'higher'})"
    else:
        together = "not read: no LR collapses while the other does not"
    lines = [
        "# The z-loss arm at both of its LRs: the declared rule applied",
        "",
        "Rule (declared in `sweeps/conf/sweep/z_loss_lr.yaml` before the grid ran): per seed, collapse = the coda "
        f"input's coefficient of f_K at the end below {COLLAPSE}; the collapse comes with the LR when it happens "
        f"at 8e-3 in {MOST} or more of 6 seeds and at 4e-3 in at most {FEWEST}; with the arm whatever the LR when "
        f"{MOST} or more at both; no collapse when at most {FEWEST} at both; otherwise not separated. Loss: the "
        "paired Δ log PPL with its 95% t interval. Per-seed values in brackets, seeds in increasing order.",
        "",
        "| row | seeds | PPL mean (per seed) | f_K coef at end (per seed) | collapsed | Δ log PPL vs base, 95% CI |",
        "|---|---:|---|---|---:|---|",
    ]
    for r in (base, low, high):
        ppl = f"{statistics.fmean(r.ppl.values()):.2f} ({', '.join(f'{v:.2f}' for _, v in sorted(r.ppl.items()))})"
        fk = ", ".join(f"{v:.3f}" for _, v in sorted(r.fk.items())) or "—"
        collapsed = f"{r.collapsed}/{len(r.fk)}" if r.fk else "—"
        versus = vs_base[r.name].text if r.name in vs_base else "—"
        lines.append(f"| {r.name} | {len(r.ppl)} | {ppl} | {fk} | {collapsed} | {versus} |")
    lines += [
        "",
        f"**Reading**: {verdict} (collapsed: {low.collapsed}/{len(low.fk)} at 4e-3, {high.collapsed}/{len(high.fk)} "
        "at 8e-3).",
        f"**8e-3 - 4e-3** (the z-loss arm, paired by seed): {between.text}.",
        f"**Collapse and loss together**: {together}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="z_loss_lr.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the grid's report folder (its runs.csv)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    try:
        text = render(rows(pd.read_csv(folder / "runs.csv")))
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    (folder / "decision.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
