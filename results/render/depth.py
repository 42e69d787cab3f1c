"""A depth study's section of ``report.md`` (issue 48), its tables and its two figures.

The section opens with the answer (which arms extrapolate past the training K under the declared
rule, sweeps/conf/sweep/depth.yaml), then: validation PPL at every test-time loop count (mean ± sd
over seeds), the shape verdicts with their intervals, sampled against fixed training, MeSH's rules
against each other, the exit curves read at 25/50/75% of their full loops, and the stability monitor
at the end of training. Every number is computed here from ``depth.csv``, ``exit.csv`` and
``runs.csv`` (the folder keeps them), so a rebuilt report says the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.probing.figures import figure, save_figure
from mesh_model.probe_names import scheme_color
from results.rows.aggregate import Results
from results.rows.depth import STABILITY, DepthArm
from results.verdicts.depth import EXTRAPOLATES, FLAT, DepthFindings, ExitPoint, PairedShape

SECTION = "## Loop count at test time"
SECTION_FILE = "depth.md"


def _mean_sd(values: Sequence[float], digits: int = 2) -> str:
    kept = [v for v in values if math.isfinite(v)]
    if not kept:
        return "—"
    mean = sum(kept) / len(kept)
    if len(kept) < 2:
        return f"{mean:.{digits}f} (n = 1)"
    sd = math.sqrt(sum((v - mean) ** 2 for v in kept) / (len(kept) - 1))
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def _seeds(arms: list[DepthArm]) -> str:
    counts = sorted({len(a.seeds) for a in arms})
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _loops(arms: list[DepthArm]) -> list[int]:
    return sorted({k for arm in arms for k in arm.loss.columns})


def ppl_table(arms: list[DepthArm]) -> pd.DataFrame:
    """One line per arm and loop count: PPL mean, sd and n over seeds (what the table shows)."""
    records = []
    for arm in arms:
        for k in _loops(arms):
            values = [math.exp(v) for v in arm.at(k) if math.isfinite(v)]
            mean = sum(values) / len(values) if values else math.nan
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else math.nan
            records.append((arm.label, arm.scheme, arm.training, arm.rule or "", k, mean, sd, len(values)))
    return pd.DataFrame.from_records(
        records, columns=["arm", "scheme", "training", "rule", "loops", "ppl_mean", "ppl_sd", "n"]
    )


def verdict_table(findings: DepthFindings) -> pd.DataFrame:
    """Every interval the rule read: shapes, sampled vs fixed, rule vs rule (long)."""
    records = []
    for shaped in findings.shapes:
        for k, interval in shaped.d.items():
            records.append(("shape", shaped.arm.label, "", k, interval.n, interval.mean, interval.low,
                            interval.high, shaped.verdict[k]))  # fmt: skip
    for kind, pairs in (("sampled_minus_fixed", findings.sampled_vs_fixed), ("cycle_minus_last", findings.rules)):
        for pair in pairs:
            i = pair.interval
            records.append(
                (kind, pair.first.label, pair.second.label, pair.loops, i.n, i.mean, i.low, i.high, pair.word)
            )
    columns = ["kind", "arm", "against", "loops", "n", "d_mean", "d_low", "d_high", "verdict"]
    return pd.DataFrame.from_records(records, columns=columns)


def exit_table(findings: DepthFindings) -> pd.DataFrame:
    records = []
    for point in findings.exits:
        reached = [v for v in point.ppl if math.isfinite(v)]
        records.append(
            (
                point.arm.label,
                point.criterion,
                point.fraction,
                point.loops,
                len(reached),
                len(point.ppl),
                sum(reached) / len(reached) if reached else math.nan,
            )  # fmt: skip
        )
    return pd.DataFrame.from_records(
        records, columns=["arm", "criterion", "fraction", "loops_per_token", "n_reached", "n", "ppl_mean"]
    )


def _mean_ppl(arm: DepthArm, loops: int) -> float:
    values = [math.exp(v) for v in arm.at(loops) if math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def _exit_mean(point: ExitPoint) -> float:
    reached = [v for v in point.ppl if math.isfinite(v)]
    return sum(reached) / len(reached) if reached else math.nan


def _answer(findings: DepthFindings, arms: list[DepthArm]) -> list[str]:
    """The section's first paragraph: which arms extrapolate at the first K' past K (the declared
    rule's words), sampled against fixed training, MeSH's rules, and what the exit buys at half its
    loops against the passes at fixed loop counts."""
    past = sorted({k for s in findings.shapes for k in s.d})
    if not past:
        return ["No arm has a curve past its training K: nothing to say about extrapolation."]
    first = past[0]
    groups: dict[str, list[str]] = {}
    for shaped in findings.shapes:
        if first in shaped.verdict:
            groups.setdefault(shaped.verdict[first], []).append(shaped.arm.label)
    trained = "/".join(str(k) for k in sorted({a.trained_loops for a in arms}))
    said = [
        f"At K' = {first}, against each model at its training K = {trained} (where the sampled arms were "
        f"validated too; {_seeds(arms)} seeds, the declared paired rule):"
    ]
    words = ("improves", "flat", "worsens", "inconclusive")
    said += [f"**{word}**: {'; '.join(groups[word])}." for word in words if word in groups]
    extrapolate = sum(len(groups.get(w, [])) for w in EXTRAPOLATES)
    said.append(f"{extrapolate} of {sum(len(v) for v in groups.values())} arms extrapolate (improve or flat).")
    if findings.sampled_vs_fixed:
        pairs = "; ".join(f"{p.first.label}: {p.word} ({p.interval.text(3)})" for p in findings.sampled_vs_fixed)
        said.append(f"Sampled against fixed training, d({first}) paired by seed: {pairs}.")
    for pair in findings.rules:
        best = "cycle" if pair.interval.mean < 0 else "last"
        said.append(
            f"MeSH's rule at fixed K: {best} has the lower mean d({first}), cycle minus last "
            f"{pair.interval.text(3)}: {pair.word}."
        )
    half = [p for p in findings.exits if p.fraction == 0.5 and math.isfinite(_exit_mean(p))]
    if half:
        k = half[0].loops
        beats_k = sum(_exit_mean(p) < _mean_ppl(p.arm, p.arm.trained_loops) for p in half)
        fixed = [p for p in half if float(k).is_integer() and int(k) in p.arm.loss]
        beats_fixed = sum(_exit_mean(p) < _mean_ppl(p.arm, int(k)) for p in fixed)
        said.append(
            f"Exits read at {k:g} core steps per token (half of {k / 0.5:g}): below the fixed {k:g}-loop pass "
            f"in {beats_fixed} of {len(fixed)} (arm, criterion) pairs, below the arm's own training-K pass in "
            f"{beats_k} of {len(half)}."
        )
    return [" ".join(said)]


def _pair_line(pair: PairedShape) -> str:
    return f"| {pair.first.label} | {pair.second.label} | {pair.interval.text()} | {pair.word} |"


def depth_markdown(results: Results, arms: list[DepthArm], findings: DepthFindings) -> list[str]:
    loops = _loops(arms)
    lines = [SECTION, "", *_answer(findings, arms), ""]
    lines += [
        f"Validation PPL ({results.sets[0]}) of each arm at each test-time loop count K' (mean ± sd over seeds; "
        "the same validation windows as training's, so K' = K should be the run's own final validation PPL, checked below). "
        "A per-step scheme trained at a fixed K is shown under each rule of its passes past K (at K both are "
        "the trained model); trained at sampled K, under the rule it trained with. The figure draws each arm's "
        "mean (line) and its seeds' range (band), the training K dotted; the exit figure each threshold's mean "
        "over seeds.",
        "",
        "| arm | n | " + " | ".join(f"K'={k}" for k in loops) + " |",
        "|---|---:|" + "---:|" * len(loops),
    ]
    for arm in arms:
        cells = []
        for k in loops:
            text = _mean_sd([math.exp(v) for v in arm.at(k)])
            cells.append(f"**{text}**" if k == arm.trained_loops else text)
        lines.append(f"| {arm.label} | {len(arm.seeds)} | " + " | ".join(cells) + " |")
    lines += ["", *_consistency(results, arms)]
    lines += [
        "",
        "**Shape past the training K** (the declared rule): d = log PPL(K') - log PPL(K) per seed, each model "
        "against itself; the 95% paired t interval of its mean (df n - 1); *improves* when the interval is below "
        f"0, *worsens* when above, *flat* inside ±{FLAT:g} (1% PPL), else *inconclusive*. At {_seeds(arms)} seeds "
        "the verdicts describe these seeds; an *inconclusive* is a finding.",
        "",
    ]
    past = sorted({k for s in findings.shapes for k in s.d})
    lines += ["| arm | " + " | ".join(f"d({k}) [95% CI] | at {k}" for k in past) + " |"]
    lines += ["|---|" + "---:|---|" * len(past)]
    for shaped in findings.shapes:
        cells = [f"{shaped.d[k].text()} | {shaped.verdict[k]}" if k in shaped.d else "— | —" for k in past]
        lines.append(f"| {shaped.arm.label} | " + " | ".join(cells) + " |")
    if findings.sampled_vs_fixed:
        lines += [
            "",
            f"**Sampled against fixed training**: d({findings.sampled_vs_fixed[0].loops}) of the sampled arm minus "
            "the fixed arm's, paired by seed (*lower*: sampled training extrapolates better).",
            "",
            "| sampled | fixed | difference [95% CI] | reads |",
            "|---|---|---:|---|",
            *(_pair_line(p) for p in findings.sampled_vs_fixed),
        ]
    if findings.rules:
        lines += [
            "",
            f"**MeSH's rules** (trained at fixed K): d({findings.rules[0].loops}) under *cycle* minus under *last*, "
            "paired by seed; the best rule is the one with the lower mean d.",
            "",
            "| cycle | last | difference [95% CI] | reads | best rule |",
            "|---|---|---:|---|---|",
        ]
        for pair in findings.rules:
            best = "cycle" if pair.interval.mean < 0 else "last"
            lines.append(_pair_line(pair) + f" {best} |")
    lines += _exit_markdown(findings)
    lines += _stability_markdown(arms)
    return lines


def _exit_markdown(findings: DepthFindings) -> list[str]:
    if not findings.exits:
        return []
    fractions = sorted({p.fraction for p in findings.exits})
    full = findings.exits[0].loops / findings.exits[0].fraction
    lines = [
        "",
        f"**Exit curves** (training-free, per token; at most {full:g} core steps, docs/depth.md): validation PPL "
        "where a curve's mean core steps per token is "
        + ", ".join(f"{f:.0%} of {full:g} ({f * full:g})" for f in fractions)
        + ", read off each seed's curve (linear between adjacent thresholds; — where its thresholds never reach "
        "it), mean ± sd over the seeds that reach it; in brackets the same arm's pass at that fixed loop count "
        "(every token runs it), what an exit has to beat; *no exit*: every token runs all of them.",
        "",
        "| arm | criterion | no exit | "
        + " | ".join(f"{f * full:g} steps (K' = {f * full:g} pass)" for f in fractions)
        + " |",
        "|---|---|---:|" + "---:|" * len(fractions),
    ]
    keys = list(dict.fromkeys((p.arm.label, p.criterion) for p in findings.exits))
    for label, criterion in keys:
        points = {p.fraction: p for p in findings.exits if (p.arm.label, p.criterion) == (label, criterion)}
        first = next(iter(points.values()))
        cells = []
        for f in fractions:
            point = points.get(f)
            reached = [v for v in point.ppl if math.isfinite(v)] if point else []
            text = _mean_sd(reached)
            if point and len(reached) < len(point.ppl):
                text += f" ({len(reached)}/{len(point.ppl)} reach it)"
            if point and float(point.loops).is_integer() and int(point.loops) in first.arm.loss:
                text += f" ({_mean_ppl(first.arm, int(point.loops)):.2f})"
            cells.append(text)
        lines.append(f"| {label} | {criterion} | {_mean_sd(first.full_ppl)} | " + " | ".join(cells) + " |")
    return lines


def _with_infinite(values: Sequence[float]) -> str:
    """Mean ± sd of the finite values, and how many were infinite (a ratio over a step that did not move)."""
    infinite = sum(math.isinf(v) for v in values)
    return _mean_sd(values, 3) + (f" (+{infinite} ∞)" if infinite else "")


def _consistency(results: Results, arms: list[DepthArm]) -> list[str]:
    """Whether each run's curve at its training K equals its final validation loss (the same
    windows: it should, to float rounding), said either way."""
    runs = results.runs.set_index("run_id")
    checked, off, seen = 0, [], set()
    for arm in arms:  # the rules of one row are one set of runs: each checked once
        for run_id, seed in zip(arm.row.run_ids, arm.row.seeds, strict=True):
            if seed not in arm.loss.index or "val_loss" not in runs or run_id in seen:
                continue
            seen.add(run_id)
            mine, logged = float(arm.loss.at[seed, arm.trained_loops]), float(runs.at[run_id, "val_loss"])
            checked += 1
            if not math.isclose(mine, logged, rel_tol=1e-6):
                off.append(f"{arm.label} seed {seed} ({mine:.6f} vs {logged:.6f})")
    if off:
        return [
            f"K' = K differs from the run's final validation loss in {len(off)} of {checked}: " + "; ".join(off) + "."
        ]
    return [f"K' = K equals each run's final validation loss (relative difference under 1e-6 in all {checked})."]


def _stability_markdown(arms: list[DepthArm]) -> list[str]:
    present = [key for key in STABILITY if any(key in arm.stability for arm in arms)]
    if not present:
        return []
    seen, lines = (
        set(),
        [
            "",
            "**Stability of the loop map** at the last validation (docs/depth.md; mean ± sd over seeds): the spectral "
            "radius of step K's Jacobian (below 1: more loops converge locally), the ratio of successive state "
            "changes over 2K steps, and within K.",
            "",
            "| row | " + " | ".join(key.removeprefix("stability/") for key in present) + " |",
            "|---|" + "---:|" * len(present),
        ],
    )
    for arm in arms:
        if id(arm.row) in seen:  # the rules of one row share its runs' monitor
            continue
        seen.add(id(arm.row))
        # a row trained at fixed K is one monitor under either rule; an arm trained at sampled K trained
        # with its rule, which names it
        label = arm.label if arm.sampled and arm.rule else ", ".join(arm.label.split(", ")[:2])
        lines.append(f"| {label} | " + " | ".join(_with_infinite(arm.stability.get(k, [])) for k in present) + " |")
    return lines


def _plain_log_axis(ax: Any) -> None:
    """A log y axis labelled in plain numbers (55, 60, 80, ...), not powers of ten."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def _style(arm: DepthArm) -> dict[str, Any]:
    """The scheme's colour; sampled training dashed, the cycle rule dotted with squares."""
    cycle = arm.rule == "cycle"
    return {
        "color": scheme_color(arm.scheme),
        "linestyle": ("-." if cycle else "--") if arm.sampled else (":" if cycle else "-"),
        "marker": "s" if cycle else "o",
    }


def depth_figure(results: Results, arms: list[DepthArm]) -> Any:
    """Validation PPL against the test-time loop count, one panel per training (fixed, sampled): each
    arm's mean over seeds (line) and the seeds' range (band); the training K dotted."""
    trainings = list(dict.fromkeys(a.training for a in arms))
    fig, axes = figure(0.5 + 5.5 * len(trainings), 4.2, ncols=len(trainings))
    for ax, training in zip(axes, trainings, strict=True):
        for arm in (a for a in arms if a.training == training):
            ks = list(arm.loss.columns)
            ppl = arm.loss.map(math.exp)
            ax.plot(ks, ppl.mean(axis=0), label=arm.label, markersize=4, **_style(arm))
            ax.fill_between(ks, ppl.min(axis=0), ppl.max(axis=0), color=scheme_color(arm.scheme), alpha=0.12, lw=0)
        trained = {a.trained_loops for a in arms if a.training == training}
        for k in trained:
            ax.axvline(k, color="0.4", linestyle=":", linewidth=1)
        _plain_log_axis(ax)
        ax.set_xlabel("test-time loop count K'")
        ax.set_ylabel(results.metric_label)
        ax.set_title(f"trained at {'fixed K' if training == 'fixed' else f'sampled K ({training})'}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return fig


def exit_figure(results: Results, arms: list[DepthArm]) -> Any | None:
    """Validation PPL against the mean core steps per token under each exit criterion (one panel each):
    per arm, the seeds' mean at each threshold."""
    with_exit = [a for a in arms if not a.exit.empty]
    if not with_exit:
        return None
    criteria = sorted({c for a in with_exit for c in a.exit["criterion"]})
    fig, axes = figure(0.5 + 5.5 * len(criteria), 4.2, ncols=len(criteria))
    for ax, criterion in zip(axes, criteria, strict=True):
        for arm in with_exit:
            lines = arm.exit[arm.exit["criterion"] == criterion]
            mean = lines.groupby("eps", sort=True)[["loops_used", "ppl"]].mean()
            ax.plot(mean["loops_used"], mean["ppl"], label=arm.label, markersize=4, **_style(arm))
        _plain_log_axis(ax)
        ax.set_xlabel("mean core steps per token")
        ax.set_ylabel(results.metric_label)
        ax.set_title(f"exit on {criterion}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return fig


def write_depth_study(
    results: Results, arms: list[DepthArm], findings: DepthFindings, out: Path, figures: Path
) -> tuple[list[str], list[Path], dict[str, list[Path]]]:
    """The section's lines, the files written (the section alone as ``depth.md``, ``depth_ppl.csv``,
    ``depth_verdicts.csv``, ``exit_points.csv``) and the figures; nothing where no row has depth curves."""
    if not arms:
        return [], [], {}
    tables = [out / "depth_ppl.csv", out / "depth_verdicts.csv", out / "exit_points.csv"]
    ppl_table(arms).to_csv(tables[0], index=False)
    verdict_table(findings).to_csv(tables[1], index=False)
    exit_table(findings).to_csv(tables[2], index=False)
    drawn = {"depth_curves": save_figure(depth_figure(results, arms), figures, "depth_curves")}
    if (fig := exit_figure(results, arms)) is not None:
        drawn["exit_curves"] = save_figure(fig, figures, "exit_curves")
    lines = depth_markdown(results, arms, findings)
    images = [
        f"![{key.replace('_', ' ')}]({next(p for p in paths if p.suffix == '.png').relative_to(out).as_posix()})"
        for key, paths in drawn.items()
    ]
    table_end = lines.index("", 6)  # after the PPL table: the curves it tabulates
    lines[table_end:table_end] = ["", *images] if images else []
    section = out / SECTION_FILE  # the section alone: what a page quotes ({{depth_answer F}}, {{table F}})
    section.write_text("\n".join(lines) + "\n")
    return [*lines, ""], [section, *tables], drawn


__all__ = ["depth_figure", "exit_figure", "write_depth_study"]
