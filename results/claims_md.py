"""``claims.md``: each claim of the paper, its verdict on these runs, and the numbers behind it.

The header names the test, α, the runs' commit and the generator; a summary table gives one line
per evaluation (claim x block x claimed row x metric); then each claim with its statement and, for
every evaluation, the means ± std and n of both rows, the difference with its 95% CI, p and test.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from results.aggregate import Results, Row, decimals_for, is_accuracy
from results.claims import ClaimSet, Evaluation, Line, evaluate, load_claims
from results.render import markdown_escape
from results.stats import METHOD, diff_text, format_p

FILE = "claims.md"


def _code(text: str) -> str:
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def _scale(metric: str) -> float:
    return 100.0 if is_accuracy(metric) else 1.0


def _stat(row: Row, metric: str) -> str:
    stat = row.stats.get(metric)
    if stat is None:
        return ""
    scale = _scale(metric)
    return stat.text(decimals_for(metric, stat.mean * scale), scale)


def _diff(line: Line, metric: str) -> str:
    comparison = line.comparison.scaled(_scale(metric))
    return diff_text(comparison, decimals_for(metric, abs(line.other.stats[metric].mean)))


def _metric(evaluation: Evaluation) -> str:
    return _code(evaluation.metric) + (" (also shown)" if evaluation.supplementary else "")


def _rows_text(evaluation: Evaluation) -> str:
    if evaluation.row is None:
        return "—"
    if len(evaluation.lines) == 1 and evaluation.claim.kind == "pairwise":
        return f"{_code(evaluation.row.label)} vs {_code(evaluation.lines[0].other.label)}"
    if evaluation.lines:
        count = len(evaluation.lines)
        return f"{_code(evaluation.row.label)} vs {count} other row{'s' if count > 1 else ''}"
    return _code(evaluation.row.label)


def summary_table(evaluations: Sequence[Evaluation]) -> list[str]:
    """One line per evaluation: claim, block, rows, metric, verdict."""
    lines = ["| claim | block | rows | metric | verdict |", "|---|---|---|---|---|"]
    for e in evaluations:
        cells = [_code(e.claim.id), markdown_escape(e.block or "—"), _rows_text(e), _metric(e), e.verdict]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _reason(evaluation: Evaluation) -> str:
    return evaluation.reason.replace("|", "\\|")  # its row labels are already code spans


def _pairwise(evaluations: list[Evaluation]) -> list[str]:
    lines = [
        "| block | metric | row | mean ± std (n) | vs | mean ± std (n) | Δ (95% CI) | p | test | verdict |",
        "|---|---|---|---:|---|---:|---:|---:|---|---|",
    ]
    for e in evaluations:
        row = _code(e.row.label) if e.row else "—"
        row_stat = _stat(e.row, e.metric) if e.row else ""
        verdict = e.verdict + (f" ({_reason(e)})" if e.reason else "")
        if e.lines:
            x = e.lines[0]
            numbers = [_code(x.other.label), _stat(x.other, e.metric), _diff(x, e.metric), format_p(x.comparison.p)]
            numbers.append(x.comparison.test)
        else:
            numbers = ["", "", "", "", ""]
        lines.append(
            "| " + " | ".join([markdown_escape(e.block or "—"), _metric(e), row, row_stat, *numbers, verdict]) + " |"
        )
    return lines


def _best_of(evaluations: list[Evaluation]) -> list[str]:
    lines: list[str] = []
    for e in evaluations:
        where = f"**{markdown_escape(e.block or 'these runs')}**, {_metric(e)}"
        if e.row is None:
            lines += [f"* {where}: {e.verdict} ({_reason(e)})", ""]
            continue
        lines += [
            f"* {where}, {_code(e.row.label)} {_stat(e.row, e.metric)}: **{e.verdict}**"
            + (f" ({_reason(e)})" if e.reason else ""),
            "",
        ]
        if not e.lines:
            continue
        lines += [
            "  | vs | mean ± std (n) | Δ (95% CI) | p | p (Holm) | test | this comparison |",
            "  |---|---:|---:|---:|---:|---|---|",
        ]
        for x in e.lines:
            cells = [_code(x.other.label), _stat(x.other, e.metric), _diff(x, e.metric), format_p(x.comparison.p)]
            cells += [format_p(x.p_holm), x.comparison.test, x.verdict]
            lines.append("  | " + " | ".join(cells) + " |")
        lines.append("")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _commits(results: Results) -> str:
    runs = results.runs
    finished = runs[runs["status"] == "FINISHED"] if "status" in runs else runs
    commits = sorted({str(c) for c in finished.get("git_commit", []) if str(c) not in ("", "nan", "None")})
    if not commits:
        return "commit not logged"
    shown = ", ".join(_code(c[:12] + ("-dirty" if c.endswith("-dirty") else "")) for c in commits)
    return f"commit{'s' if len(commits) > 1 else ''} {shown}" + (
        " (runs from more than one commit)" if len(commits) > 1 else ""
    )


def render_claims(
    evaluations: Sequence[Evaluation], claims: ClaimSet, results: Results, name: str, experiments: Sequence[str] = ()
) -> str:
    """The text of ``claims.md``."""
    stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    where = f"experiments {', '.join(_code(e) for e in experiments)}" if experiments else "the runs selected"
    alpha = f"{claims.alpha:g}"
    lines = [
        f"# The paper's claims, tested on these runs: {markdown_escape(name)}",
        "",
        f"Generated by `mesh-results` on {stamp} from {where}; {_commits(results)}. Claims from "
        f"{_code(claims.source)}, tests from `results/stats.py`.",
        "",
        f"* **Test**: {METHOD}. p is two-sided; **α = {alpha}**. Δ is the claimed row minus the other.",
        f"* **Verdicts**: **holds**: p < {alpha} and the difference goes the paper's way; **agrees, not "
        f"significant**: it goes the paper's way, p ≥ {alpha}; **disagrees, not significant**: it goes against "
        f"the paper (or is 0), p ≥ {alpha}; **contradicted**: p < {alpha} against the paper; **not tested**: a "
        "row is missing, has fewer than two seeds, or there is no spread. Not significant means within "
        "seed-to-seed noise at this number of seeds.",
        "* **Best-of claims** (the claimed row against every other row selected): hold only if every pairwise "
        "comparison holds (an intersection-union test: each comparison must be significant on its own, so "
        "no correction for multiplicity is needed); contradicted if some other row is significantly better "
        "after Holm's correction across the comparisons; not tested if a comparison cannot be tested.",
        "* Rows are compared only within a block (same preset and compute depth) and with the same other "
        "settings. A claim is evaluated for every block, claimed row and validation set where its rows are "
        "present: one line each.",
        "",
        "## Summary",
        "",
        *summary_table(evaluations),
    ]
    for claim in claims.claims:
        own = [e for e in evaluations if e.claim.id == claim.id]
        lines += [
            "",
            f"## {_code(claim.id)}",
            "",
            markdown_escape(claim.statement)
            + (f" *(paper: {markdown_escape(claim.paper)})*" if claim.paper else "")
            + f" Expected: the claimed row's value {claim.expect} than {'every other' if claim.kind == 'best_of' else 'the other'}"
            + f"'s. Claimed row: {claim.row.text}; compared with: {claim.against.text}.",
            "",
            *(_best_of(own) if claim.kind == "best_of" else _pairwise(own)),
        ]
    return "\n".join(lines).rstrip() + "\n"


def write_claims(
    results: Results,
    out_dir: str | Path,
    name: str,
    experiments: Sequence[str] = (),
    claims: ClaimSet | None = None,
) -> tuple[Path, list[Evaluation]]:
    """Evaluate ``claims`` (the packaged file unless given) on ``results`` and write ``claims.md``."""
    claims = claims or load_claims()
    evaluations = evaluate(results, claims)
    path = Path(out_dir) / FILE
    path.write_text(render_claims(evaluations, claims, results, name, experiments))
    return path, evaluations


__all__ = ["FILE", "render_claims", "summary_table", "write_claims"]
