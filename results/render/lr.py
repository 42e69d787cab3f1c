"""Learning-rate sensitivity: each variant's validation PPL at every peak LR it was run at, its best LR.

A grid that varies the peak LR (``mesh-sweep lr``) gives rows that differ by LR alone. They are
regrouped here by variant (the row's label without the LR), so a report can say which LR each
variant got and show the curve, and the comparison that follows can run every variant at its own
best LR (``optim.lr_by_scheme``) rather than at one LR that may suit some schemes more than others.

The best LR is the one with the lowest mean over seeds. Its lead over the next LR is reported in %
of PPL, a description rather than a test (the LRs were chosen, not sampled); a best LR at the edge
of the values tried is flagged, since the optimum may lie beyond it. Whether the best and the
runner-up are **within noise** is said per variant: the runner-up minus the best in log PPL, paired
on their common seeds where they share at least 3 (else Welch; results/stats/comparison.py), is within noise
when it is at most ``NOISE_SES`` (2) standard errors of that difference over seeds. It is a
description of seed noise, not a test (with the 2 seeds of an LR sweep the SE itself is rough): a
variant whose two best LRs are within noise has no settled best LR, and the choice between them
may change a comparison made at either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.probing.figures import figure, save_figure
from mesh_model.probe_names import scheme_color
from results.rows.aggregate import Results
from results.verdicts.lr import NOISE_SES, LrCurve, _lr_text, lr_curves, lr_frame


def lr_markdown(curves: list[LrCurve], metric_label: str) -> list[str]:
    """The report's learning-rate section: one table (variants x LRs) and each variant's best LR."""
    if not curves:
        return []
    lrs = sorted({p.lr for c in curves for p in c.points})
    lines = [
        "## Learning rate",
        "",
        f"{metric_label} at each peak LR (mean ± sd over seeds, n); **bold**: the variant's best LR, the one "
        "its comparison with the others should use. The lead is how much lower the best mean is than the next "
        "LR's, a description, not a test. *Runner-up*: the second-best LR, how much higher its PPL is (the "
        f"runner-up minus the best in log PPL over seeds, paired on common seeds) and {NOISE_SES:g} standard "
        "errors of that gap; *within noise* when the gap is at most that: the best LR is then not settled "
        "by these seeds.",
        "",
        "| variant | " + " | ".join(_lr_text(lr) for lr in lrs) + " | best LR | lead | runner-up |",
        "|---|" + "---:|" * (len(lrs) + 2) + "---|",
    ]
    for curve in curves:
        cells = []
        by_lr = {p.lr: p for p in curve.points}
        for lr in lrs:
            point = by_lr.get(lr)
            if point is None:
                cells.append("—")
                continue
            mean, std, n = point.ppl(curve.metric)
            text = f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "") + f" (n={n})"
            cells.append(f"**{text}**" if lr == curve.best.lr else text)
        lead = curve.lead_pct
        best = _lr_text(curve.best.lr) + (" (edge of the range tried)" if curve.at_edge else "")
        lead_text = "—" if lead is None else f"{lead:.1f}%"
        lines.append(f"| {curve.variant} | " + " | ".join(cells) + f" | {best} | {lead_text} | {curve.noise_text} |")
    edge = [c.variant for c in curves if c.at_edge]
    if edge:
        lines += [
            "",
            f"Best at the edge of the LRs tried: {', '.join(edge)}; the optimum may lie beyond, so widen the range "
            "before reading their comparison as settled.",
        ]
    noisy = [c.variant for c in curves if c.within_noise]
    if noisy:
        lines += [
            "",
            f"Best LR within noise of the runner-up: {', '.join(noisy)}; either LR is as well supported by these "
            "seeds, so say which was used and read a comparison that depends on it with care.",
        ]
    return lines + [""]


def lr_figure(curves: list[LrCurve], metric_label: str) -> Any | None:
    """One panel per block: x the peak LR (log), y the PPL; each seed a dot, the mean a line, in the
    scheme's colour; the best LR of each variant ringed."""
    if not curves:
        return None
    blocks = list(dict.fromkeys(c.block for c in curves))
    fig, axes = figure(0.5 + 6.0 * len(blocks), 4.2, ncols=len(blocks))
    for ax, block in zip(axes, blocks, strict=True):
        for curve in (c for c in curves if c.block == block):
            color = scheme_color(curve.scheme)
            xs = [p.lr for p in curve.points]
            ax.plot(xs, [p.ppl(curve.metric)[0] for p in curve.points], "-", color=color, label=curve.variant)
            for point in curve.points:
                values = point.row.stats[curve.metric].values
                ax.plot([point.lr] * len(values), values, "o", color=color, alpha=0.45, markersize=4)
            best = curve.best
            ax.plot(best.lr, best.ppl(curve.metric)[0], "o", mfc="none", mec=color, markersize=11, mew=1.5)
        ax.set_xscale("log")
        lrs = sorted({p.lr for c in curves if c.block == block for p in c.points})
        ax.set_xticks(lrs, [_lr_text(lr) for lr in lrs])
        ax.minorticks_off()
        ax.set_xlabel("peak learning rate")
        ax.set_ylabel(metric_label)
        ax.set_title(block)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def write_lr_sensitivity(results: Results, out: Path, figures: Path) -> tuple[list[str], list[Path]]:
    """``lr.csv`` in ``out`` and the figure in ``figures``; returns (the report's lines, the paths
    written). Nothing when no variant was run at two or more LRs."""
    curves = lr_curves(results)
    if not curves:
        return [], []
    frame = lr_frame(curves)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "lr.csv", index=False)
    fig = lr_figure(curves, results.metric_label)
    paths = [out / "lr.csv", *save_figure(fig, figures, "lr_sensitivity")]
    lines = lr_markdown(curves, results.metric_label)
    png = next(p for p in paths if p.suffix == ".png")
    lines[-1:-1] = ["", f"![{results.metric_label} against the peak LR]({png.relative_to(out).as_posix()})"]
    return lines, paths
