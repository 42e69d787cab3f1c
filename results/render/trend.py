"""The size-and-tokens trend written out: trend.md (the answer first, then the gaps at every point and
each point's change from the reference) and trend.csv (one line per comparison and point, every
number the Markdown shows, the per-seed Δs included)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from results.verdicts.trend import CLOSES, NO_REFERENCE, NO_RUNS, TrendStudy

MARKDOWN, CSV = "trend.md", "trend.csv"
RULE = (
    "The rule, declared in `sweeps/conf/sweep/size_tokens.yaml` before its runs: per point and "
    "comparison, the per-seed Δ = log PPL(MeSH arm) - log PPL(other arm) (final validation loss on "
    "docs, both arms on the same seeds), its paired t 95% interval; the trend, the Welch 95% interval "
    "of the point's mean Δ minus the reference's (different seeds): \"the gap closes\" when it lies "
    'below 0 (MeSH gains on the other arm), "the gap widens" above, else "no change shown". At 3 '
    "seeds the words describe these runs; an interval that covers 0 is a finding. Where nothing changed, "
    "Welch's interval at 3 seeds against 6-9 misses 5-7% of the time with normal seeds, not 5% "
    "(simulated in tests/test_trend.py)."
)


def _cell(study: TrendStudy, point: str, first: str, second: str) -> str:
    g = study.gaps[(point, first, second)]
    if g.interval.n == 0:
        return "no runs"
    if g.interval.n < 2:  # its text says the n already
        return g.interval.text()
    return f"{g.interval.text()} (n = {g.interval.n})"


def answer(study: TrendStudy) -> str:
    """One sentence per point: each comparison's trend word with its interval, how many of the
    comparisons read there closed, and the comparisons that could not be read."""
    lines = []
    for point in study.points:
        trends = [t for t in study.trends if t.gap.point == point.name]
        read = [t for t in trends if t.word not in (NO_RUNS, NO_REFERENCE)]
        said = "; ".join(f"{t.gap.first} - {t.gap.second}: {t.word} ({t.change.text()})" for t in read)
        closed = sum(t.word == CLOSES for t in read)
        line = f"At {point.name} against {study.reference.name}: {said or 'nothing to compare'}."
        line += f" {closed} of {len(read)} gaps close." if read else ""
        unread = [f"{t.gap.first} - {t.gap.second} ({t.word})" for t in trends if t not in read]
        lines.append(line + (f" Not read: {', '.join(unread)}." if unread else ""))
    return " ".join(lines)


def frame(study: TrendStudy) -> pd.DataFrame:
    rows = []
    for first, second in study.comparisons:
        ref = study.gaps[(study.reference.name, first.name, second.name)]
        for point in (study.reference, *study.points):
            g = study.gaps[(point.name, first.name, second.name)]
            t = next((t for t in study.trends if t.gap is g), None)
            rows.append(
                {
                    "first": first.name,
                    "second": second.name,
                    "point": point.name,
                    "reference": point is study.reference,
                    "folder": g.folder,
                    "n": g.interval.n,
                    "seeds": " ".join(str(s) for s in g.seeds),
                    "deltas": " ".join(f"{d:.9f}" for d in g.deltas),
                    "gap": g.interval.mean,
                    "gap_low": g.interval.low,
                    "gap_high": g.interval.high,
                    "gap_reads": g.word,
                    "change": t.change.diff if t else float("nan"),
                    "change_df": t.change.df if t else float("nan"),
                    "change_low": t.change.low if t else float("nan"),
                    "change_high": t.change.high if t else float("nan"),
                    "trend": t.word if t else "",
                    "reference_folder": ref.folder,
                }
            )
    return pd.DataFrame(rows)


def markdown(study: TrendStudy, title: str) -> str:
    names = [study.reference.name, *(p.name for p in study.points)]
    out = [f"# {title}", "", answer(study), "", RULE, ""]
    out += [
        "## The gap at each point",
        "",
        "Mean per-seed Δ log PPL [paired t 95% interval] (seeds paired); the first column is the reference point.",
        "",
    ]
    out.append("| comparison | " + " | ".join(names) + " |")
    out.append("|---|" + "---:|" * len(names))
    for first, second in study.comparisons:
        cells = [_cell(study, n, first.name, second.name) for n in names]
        out.append(f"| {first.name} - {second.name} | " + " | ".join(cells) + " |")
    out += [
        "",
        "## The change from the reference point",
        "",
        f"The point's mean Δ minus {study.reference.name}'s [Welch 95% interval, its df].",
        "",
    ]
    out.append("| comparison | point | change [95% CI] | df | reads |")
    out.append("|---|---|---:|---:|---|")
    for t in study.trends:
        df = f"{t.change.df:.1f}" if t.change.df == t.change.df else "-"
        out.append(f"| {t.gap.first} - {t.gap.second} | {t.gap.point} | {t.change.text()} | {df} | {t.word} |")
    out += ["", "## Where each gap's runs are", ""]
    for point in (study.reference, *study.points):
        folders = ", ".join(f"`{f}`" for f, _ in point.folders)
        out.append(f"- {point.name}: {folders}")
        if len(point.folders) > 1:  # which folder each comparison took
            for first, second in study.comparisons:
                g = study.gaps[(point.name, first.name, second.name)]
                out.append(f"  - {first.name} - {second.name}: " + (f"`{g.folder}`" if g.folder else "none"))
    return "\n".join(out) + "\n"


def write_trend(study: TrendStudy, out: Path, title: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, csv = out / MARKDOWN, out / CSV
    md.write_text(markdown(study, title))
    frame(study).to_csv(csv, index=False, float_format="%.9g")
    return [md, csv]


__all__ = ["CSV", "MARKDOWN", "answer", "frame", "markdown", "write_trend"]
