"""``claims.md``: each claim of the paper, its verdict on these runs, and the numbers behind it.

The header names the test, α, the error-rate control, the runs' commit and the generator; a
summary table gives one line per evaluation (claim x block x claimed row x metric); then each claim
with its statement and, for every evaluation, the means ± std and n of both rows, n and df, the
difference with its 95% CI (and as %), the paper's effect, raw and adjusted p, the minimal
detectable effect at 80% power and the seeds the paper's effect would need, and the test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from results.render.design import design_lines
from results.render.formats import code_span, markdown_escape, quote_lines, runs_ended
from results.render.over_training import over_training_lines
from results.rows.aggregate import Results, Row, decimals_for, is_accuracy, is_ppl
from results.stats.comparison import METHOD, diff_text, format_p
from results.verdicts.claims import (
    EQUIVALENT,
    FRAGILE_N,
    RULED_OUT,
    ClaimComparison,
    ClaimSet,
    Decided,
    Evaluation,
)
from results.verdicts.sequential import DesignRecord

FILE = "claims.md"


def _scale(metric: str) -> float:
    return 100.0 if is_accuracy(metric) else 1.0


def _stat(row: Row, metric: str) -> str:
    stat = row.stats.get(metric)
    if stat is None:
        return ""
    scale = _scale(metric)
    return stat.text(decimals_for(metric, stat.mean * scale), scale)


def _log_scale(evaluation: Evaluation) -> bool:
    return is_ppl(evaluation.metric)


def _diff(line: ClaimComparison, evaluation: Evaluation) -> str:
    if _log_scale(evaluation):
        return diff_text(line.comparison, 4)
    metric = evaluation.metric
    comparison = line.comparison.scaled(_scale(metric))
    return diff_text(comparison, decimals_for(metric, abs(line.other.stats[metric].mean)))


def _percent(value: float | None, evaluation: Evaluation, line: ClaimComparison) -> str:
    """A Δ as % of the other row: exp(Δ) - 1 on the log scale, else Δ / |other mean|."""
    if value is None:
        return ""
    if _log_scale(evaluation):
        return f"{math.expm1(value) * 100:+.1f}%"
    base = abs(line.other.stats[evaluation.metric].mean)
    return f"{value / base * 100:+.1f}%" if base > 0 else ""


def _paper(evaluation: Evaluation, line: ClaimComparison) -> str:
    effect = evaluation.claim.paper_effect
    return "" if effect is None else _percent(effect, evaluation, line)


# An MDE past this many % of PPL (two seeds and a wild one: exp(38) - 1) is written as "±>1000%":
# seventeen digits of an effect no run could have shown say nothing more.
MDE_SHOWN_UP_TO = 1000.0


def _mde(evaluation: Evaluation, line: ClaimComparison) -> str:
    if line.mde is None:
        return ""
    if _log_scale(evaluation) and math.expm1(line.mde) * 100 > MDE_SHOWN_UP_TO:
        return f"±>{MDE_SHOWN_UP_TO:.0f}%"
    percent = _percent(line.mde, evaluation, line).lstrip("+")
    return f"±{percent}" if percent else f"±{line.mde:.3g}"


def _n_df(line: ClaimComparison) -> str:
    c = line.comparison
    n = f"{c.n_a}" if c.paired else f"{c.n_a}+{c.n_b}"
    return f"{n}, {c.df:.1f}" if c.df is not None else n


def _numbers(evaluation: Evaluation, line: ClaimComparison) -> list[str]:
    """n, df | Δ (95% CI) | Δ % | paper Δ % | MDE | seeds for the paper's Δ."""
    needed = "" if line.seeds_needed is None else str(line.seeds_needed)
    return [
        _n_df(line),
        _diff(line, evaluation),
        _percent(line.comparison.diff, evaluation, line),
        _paper(evaluation, line),
        _mde(evaluation, line),
        needed,
    ]


NUMBER_HEADS = "n, df | Δ (95% CI) | Δ % | paper Δ % | MDE (80%) | seeds for paper Δ"


def _metric(evaluation: Evaluation) -> str:
    return code_span(evaluation.metric) + (" (also shown)" if evaluation.supplementary else "")


def _rows_text(evaluation: Evaluation) -> str:
    if evaluation.row is None:
        return "—"
    if len(evaluation.lines) == 1 and evaluation.claim.kind == "pairwise":
        return f"{code_span(evaluation.row.label)} vs {code_span(evaluation.lines[0].other.label)}"
    if evaluation.lines:
        count = len(evaluation.lines)
        return f"{code_span(evaluation.row.label)} vs {count} other row{'s' if count > 1 else ''}"
    return code_span(evaluation.row.label)


def summary_table(evaluations: Sequence[Evaluation]) -> list[str]:
    """One line per evaluation: claim, block, rows, metric, verdict, and the sign-flip check's word."""
    lines = ["| claim | block | rows | metric | verdict | sign-flip check |", "|---|---|---|---|---|---|"]
    for e in evaluations:
        cells = [code_span(e.claim.id), markdown_escape(e.block or "—"), _rows_text(e), _metric(e), e.verdict_text]
        lines.append("| " + " | ".join([*cells, _sign_flip_word(e)]) + " |")
    return lines


def _sign_flip_word(e: Evaluation) -> str:
    check = e.sign_flip
    if check is None:
        return "—"
    return f"**disagrees**: {check.outcome}" if check.disagree else "agrees"


def _reason(evaluation: Evaluation) -> str:
    return evaluation.reason.replace("|", "\\|")  # its row labels are already code spans


def _family(e: Evaluation) -> str:
    return "Holm" if e.family == "primary" else "BH"


def _pairwise(evaluations: list[Evaluation]) -> list[str]:
    lines = [
        f"| block | metric | row | mean ± std (n) | vs | mean ± std (n) | {NUMBER_HEADS} | p | p adj. | test | verdict |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for e in evaluations:
        row = code_span(e.row.label) if e.row else "—"
        row_stat = _stat(e.row, e.metric) if e.row else ""
        shown = e.reason and e.verdict not in (EQUIVALENT, RULED_OUT)  # verdict_text already says it
        verdict = e.verdict_text + (f" ({_reason(e)})" if shown else "")
        if e.sequential is not None:
            v = e.sequential
            t = f"{v.statistic:+.2f}" if v.statistic is not None else "—"
            verdict = (
                f"**{e.verdict_text}** (the design's decision: t {t} vs bound ±{v.bound:.2f}); "
                f"fixed-n view, secondary: {e.fixed_verdict.replace('|', chr(92) + '|')}"
            )
        if e.lines:
            x = e.lines[0]
            numbers = [code_span(x.other.label), _stat(x.other, e.metric), *_numbers(e, x), format_p(x.comparison.p)]
            adjusted = format_p(e.p_adjusted)
            numbers += [f"{adjusted} ({_family(e)})" if adjusted else "", x.comparison.test]
        else:
            numbers = [""] * 11
        lines.append(
            "| " + " | ".join([markdown_escape(e.block or "—"), _metric(e), row, row_stat, *numbers, verdict]) + " |"
        )
    disagreements = [_sign_flip_line(e) for e in evaluations if e.sign_flip is not None and e.sign_flip.disagree]
    return lines + (["", *disagreements] if disagreements else [])


def _sign_flip_line(e: Evaluation) -> str:
    """Where the sign-flip test and the t-test part: which rows, and both sides in words."""
    where = markdown_escape(e.block or "these runs")
    return f"* **Sign-flip check disagrees** ({where}, {_metric(e)}, {_rows_text(e)}): {e.sign_flip.text}."


def _best_of(evaluations: list[Evaluation]) -> list[str]:
    lines: list[str] = []
    for e in evaluations:
        where = f"**{markdown_escape(e.block or 'these runs')}**, {_metric(e)}"
        if e.row is None:
            lines += [f"* {where}: {e.verdict} ({_reason(e)})", ""]
            continue
        adjusted = (
            f"; p = {format_p(e.p)}, adjusted ({_family(e)}) {format_p(e.p_adjusted)}"
            if e.p_adjusted is not None
            else ""
        )
        lines += [
            f"* {where}, {code_span(e.row.label)} {_stat(e.row, e.metric)}: **{e.verdict_text}**"
            + (f" ({_reason(e)}{adjusted})" if e.reason or adjusted else ""),
            "",
        ]
        if not e.lines:
            continue
        lines += [
            f"  | vs | mean ± std (n) | {NUMBER_HEADS} | p | p (Holm, within the claim) | test | this comparison alone |",
            "  |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for x in e.lines:
            cells = [code_span(x.other.label), _stat(x.other, e.metric), *_numbers(e, x), format_p(x.comparison.p)]
            cells += [format_p(x.p_holm), x.comparison.test, x.verdict]
            lines.append("  | " + " | ".join(cells) + " |")
        if e.sign_flip is not None and e.sign_flip.disagree:
            lines += ["", "  " + _sign_flip_line(e)]
        lines.append("")
    return lines[:-1] if lines and lines[-1] == "" else lines


def _commits(results: Results) -> str:
    runs = results.runs
    finished = runs[runs["status"] == "FINISHED"] if "status" in runs else runs
    commits = sorted({str(c) for c in finished.get("git_commit", []) if str(c) not in ("", "nan", "None")})
    if not commits:
        return "commit not logged"
    shown = ", ".join(code_span(c[:12] + ("-dirty" if c.endswith("-dirty") else "")) for c in commits)
    return f"commit{'s' if len(commits) > 1 else ''} {shown}" + (
        " (runs from more than one commit)" if len(commits) > 1 else ""
    )


def _fragile_banner(evaluations: Sequence[Evaluation]) -> list[str]:
    fragile = [e for e in evaluations if e.fragile]
    if not fragile:
        return []
    return [
        "",
        f"> **Fewer than {FRAGILE_N} seeds** in {len(fragile)} of {len(evaluations)} evaluations (marked "
        "*fragile*): with n = 2 the t-test has one degree of freedom, its CI is very wide and one seed "
        "decides the sign. Read those verdicts as provisional.",
    ]


def sign_flip_lines(evaluations: Sequence[Evaluation], where: str = "under its claim") -> list[str]:
    """The header's account of the sign-flip check: what it is, and on how many verdicts it parts
    (``where``: where each disagreement is said)."""
    checked = [e for e in evaluations if e.sign_flip is not None]
    if not checked:
        return []
    parted = [e for e in checked if e.sign_flip.disagree]
    unreachable = [e for e in parted if not e.sign_flip.rejects and not e.sign_flip.can_reject]
    outcome = (
        f"it agrees on all {len(checked)}"
        if not parted
        else f"it disagrees on {len(parted)} of {len(checked)}, each said {where} as *Sign-flip check disagrees*"
        + (
            f" ({len(unreachable)} where the t-test rejects with too few pairs for the sign-flip test to reject "
            "at all: those rejections rest on normal per-seed differences)"
            if unreachable
            else ""
        )
    )
    return [
        "* **Sign-flip check** (docs/seeds.md, *When the seeds are not normal*): each"
        " verdict that rests on paired t-tests has its test of Δ = 0 taken again by the "
        "exact sign-flip permutation test of the same per-seed differences, which assumes symmetric "
        "differences, not normal ones, at the level the verdict used (its p in the t-test's place in the same "
        f"Holm / BH family; under the `seeds=auto` design, the level of the deciding look's bound): {outcome}."
    ]


def family_lines(declared: dict | None, folder_name: str) -> list[str]:
    """The confirmatory family, declared once for the reproduction (confirmatory.yaml), as it applies here."""
    if not declared:
        return []
    listed = ", ".join(code_span(c) for c in declared["claims"])
    if declared["report"] == folder_name:
        second = declared.get("second_readings", [])
        return [
            f"* **Confirmatory family**: this report is the confirmatory test of {listed} (declared once in "
            f"`{declared['path'].name}` of the reproduction); the other reports show these claims as "
            f"replications on new runs ({', '.join(declared['replications']) or 'none'})"
            + (f" or as second readings of this grid's own runs ({', '.join(second)})" if second else "")
            + "."
        ]
    if folder_name in declared.get("second_readings", []):
        return [
            f"* **Second reading, not a replication**: {listed} are tested confirmatorily in "
            f"`../{declared['report']}/claims.md` (declared once in `{declared['path'].name}` of the reproduction); "
            "here their lines compare that grid's own runs again (the same Δ and p), marked *second reading*: "
            "no new evidence, and no claim added to that family."
        ]
    return [
        f"* **Replication, not the confirmatory test**: {listed} are tested confirmatorily in "
        f"`../{declared['report']}/claims.md` (declared once in `{declared['path'].name}` of the reproduction); "
        "here their lines are marked *replication* and are descriptive: they add no claim to that family."
    ]


def render_claims(
    evaluations: Sequence[Evaluation],
    claims: ClaimSet,
    results: Results,
    name: str,
    experiments: Sequence[str] = (),
    source: str = "",
    design: DesignRecord | None = None,
    declared: dict | None = None,
    folder_name: str = "",
    opening: Sequence[str] = (),
) -> str:
    """The text of ``claims.md`` (``source``: the runs.csv it was rebuilt from, if not the store;
    ``opening``: lines it opens with, as a quote)."""
    where = f"experiments {', '.join(code_span(e) for e in experiments)}" if experiments else "the runs selected"
    if source:
        where = f"{code_span(source)} (the runs of {where}, read back without the MLflow store)"
    alpha = f"{claims.alpha:g}"
    lines = [
        f"# The paper's claims, tested on these runs: {markdown_escape(name)}",
        "",
        f"Generated by `mesh-results` from {where} ({runs_ended(results.runs)}); {_commits(results)}. Claims from "
        f"{code_span(claims.source)}, tests from `results/stats/comparison.py`.",
        *quote_lines(opening),
        "",
        f"* **Test**: {METHOD}. p is two-sided; **α = {alpha}**. Δ is the claimed row minus the other; "
        "PPL is compared on the log scale: Δ is the difference of mean log PPL (= of mean val loss, nats) "
        "and Δ % is exp(Δ) - 1; other metrics: Δ % is Δ over the other row's mean.",
        "* **Error-rate control** across this report: the primary claims "
        f"({', '.join(code_span(c.id) for c in claims.claims if c.priority == 'primary')}) form one family, "
        "Holm-adjusted (family-wise error rate α); the secondary claims and every metric shown *also* get "
        "Benjamini-Hochberg (false discovery rate α). Raw and adjusted p are shown; holds and contradicted "
        "use the adjusted p.",
        f"* **Verdicts**: **holds**: adjusted p < {alpha}, the paper's direction; **contradicted**: adjusted "
        f"p < {alpha}, against it; **equivalent**: the 1 - 2·level CI of Δ lies inside ±margin (TOST, two "
        "one-sided tests at the level the family uses for one test: α / m in the primary family of m, α in the "
        "secondary; the margin is declared per claim, or ±1% PPL for a PPL claim without a paper effect, and "
        "the line states it); **paper's effect ruled out**: not significant, but the one-sided 1 - level bound "
        "of Δ on the paper's side excludes the paper's effect (the line gives the bound and the effect; the "
        "paper's effect, not every effect in its direction, is excluded); **inconclusive**: none of these; "
        "the line says which way the mean leans (*leans the paper's way* / *leans against*), which is not "
        "evidence; **not tested**: a row is missing, has fewer than two seeds, or there is no spread.",
        "* **Power**: MDE (80%) is the smallest |Δ| the two-sided t-test detects with 80% power at this n, at "
        "the level the verdict uses (α / m in the primary family, α in the secondary; noncentral t; paired: SD "
        "of the per-seed differences; Welch: the equal-n two-sample approximation with the pooled SD); *seeds "
        "for paper Δ* is the n per row the paper's effect would need at 80% power at that level, given the "
        "observed SD, at a fixed n (one t-test on that many seeds); the `seeds=auto` design, which spends α over "
        "its looks, needs a cap at least as large (`mesh-sweep GRID --plan` gives both). An inconclusive line whose MDE is above "
        "the paper's effect could not have detected it.",
        "* **Best-of claims** (the claimed row against every other row selected): hold only if every pairwise "
        "comparison goes the paper's way and the largest p (intersection-union test), adjusted across the "
        "family, is below α; contradicted if a row with a better mean is significant after Holm's correction "
        "across the claim's comparisons and the family's; when fewer schemes are present than the claim "
        "names, *best of the k present*: at most inconclusive for the full claim.",
        "* **Slightly short** (`within_margin`): holds only if the difference is significant AND its 95% CI "
        "lies inside the margin; a significant difference beyond the margin is *contradicted (not slight)*.",
        "* Rows are compared only within a block (same preset and compute depth) and with the same other "
        "settings. A claim is evaluated for every block, claimed row and validation set where its rows are "
        "present: one line each.",
        *(
            design_lines(design, f"[`{design.log.name}`]({design.log.name}) beside this file", evaluations)
            if design
            else []
        ),
        *family_lines(declared, folder_name),
        *sign_flip_lines(evaluations),
        *_fragile_banner(evaluations),
        "",
        "## Summary",
        "",
        *summary_table(evaluations),
    ]
    for claim in claims.claims:
        own = [e for e in evaluations if e.claim.id == claim.id]
        lines += [
            "",
            f"## {code_span(claim.id)}",
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
    decided: Decided,
    results: Results,
    out_dir: str | Path,
    name: str,
    experiments: Sequence[str] = (),
    curves: Any = None,
    source: str = "",
    folder_name: str = "",
    opening: Sequence[str] = (),
) -> Path:
    """Write ``claims.md`` for the claims as :func:`results.verdicts.decide.decide` decided them;
    with ``curves``, an "Over training" section from the decided trajectories."""
    path = Path(out_dir) / FILE
    text = render_claims(
        decided.evaluations,
        decided.claims,
        results,
        name,
        experiments,
        source,
        decided.design,
        decided.declared,
        folder_name or Path(out_dir).name,
        opening,
    )
    if curves is not None:  # where along training each verdict held
        text += "\n" + "\n".join(over_training_lines(results, decided.trajectories)).rstrip() + "\n"
    path.write_text(text)
    return path


__all__ = ["FILE", "render_claims", "sign_flip_lines", "summary_table", "write_claims"]
