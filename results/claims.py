"""The paper's claims (``paper_claims.yaml``) tested on the runs read, and ``claims.md``.

:func:`load_claims` reads and checks the data file (one-line errors naming the claim, field, value
and what is allowed); :func:`evaluate` tests every claim in every block where its rows are present
(:mod:`results.stats`) and gives each evaluation a verdict; :func:`write_claims` writes
``claims.md``. The verdicts and the "best of" rule are documented in the data file's header.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from scipy.stats import t as student_t

from mesh_model import ConfigError, SchemeSpec
from mesh_model.schemes import SCHEME_FORMS
from results.aggregate import Results, Row
from results.collect import ResultsError
from results.paper import canonical_scheme, default_slots, slots_value
from results.stats import (
    ALPHA,
    Comparison,
    benjamini_hochberg,
    compare,
    equivalent,
    holm,
    min_detectable,
    seeds_needed,
)

DATA_FILE = "paper_claims.yaml"
HOLDS = "holds"
EQUIVALENT = "equivalent"
INCONCLUSIVE = "inconclusive"
CONTRADICTED = "contradicted"
NOT_TESTED = "not tested"
RULED_OUT = "paper's effect ruled out"
VERDICTS = (HOLDS, EQUIVALENT, RULED_OUT, INCONCLUSIVE, CONTRADICTED, NOT_TESTED)
LEANS_WITH = "leans the paper's way"
LEANS_AGAINST = "leans against"
KINDS = ("pairwise", "best_of")
EXPECT = ("lower", "higher")
PRIORITIES = ("primary", "secondary")
DEFAULT_PPL_MARGIN = 0.01  # ±1% PPL (0.01 nats of val loss) when the paper gives no effect
FRAGILE_N = 3  # fewer seeds than this: the verdict says "fragile"
PPL = "ppl"  # the metric name for "the validation PPL of every validation set"


class ClaimsError(ResultsError):
    """The claims file is malformed; the message says where and what is allowed."""


# ---------------------------------------------------------------- the data file


@dataclass(frozen=True)
class Selector:
    """Which rows of a block a claim compares: ``schemes`` (canonical names, or ``("same",)``: the
    claimed row's), ``layout`` (``same`` as the claimed row, or ``any``), ``buffer_slots`` (``any``,
    ``default`` = K + 3, ``other`` than the claimed row's, or an integer), ``moe`` (``any``,
    ``only``: mixture-of-experts rows, ``never``: dense rows)."""

    schemes: tuple[str, ...]
    layout: str = "any"
    buffer_slots: str = "any"
    moe: str = "any"

    def selects(self, row: Row, claimed: Row | None = None) -> bool:
        if self.moe != "any" and row.is_moe != (self.moe == "only"):
            return False
        scheme = canonical_scheme(row.scheme)
        if self.schemes == ("same",):
            if claimed is None or scheme != canonical_scheme(claimed.scheme):
                return False
        elif scheme not in self.schemes:
            return False
        if claimed is not None and self.layout == "same" and row.layout != claimed.layout:
            return False
        slots = slots_value(row.buffer_slots)
        if self.buffer_slots == "default":
            return slots is None or slots == default_slots(row.layout)
        if self.buffer_slots == "other":
            return claimed is not None and slots is not None and slots != slots_value(claimed.buffer_slots)
        return self.buffer_slots == "any" or slots == int(self.buffer_slots)

    @property
    def text(self) -> str:
        """``base row of the same layout``, ``mesh row with B = K + 3``..."""
        kind = {"only": "mixture-of-experts ", "never": "dense "}.get(self.moe, "")
        parts = [
            f"{kind}row of the same scheme" if self.schemes == ("same",) else f"{kind}{' / '.join(self.schemes)} row"
        ]
        if self.layout == "same":
            parts.append("of the same layout")
        if self.buffer_slots == "default":
            parts.append("with B = K + 3")
        elif self.buffer_slots == "other":
            parts.append("with another B")
        elif self.buffer_slots != "any":
            parts.append(f"with B = {self.buffer_slots}")
        return " ".join(parts)


@dataclass(frozen=True)
class Claim:
    id: str
    statement: str
    metric: str
    expect: str  # lower | higher: the claimed row's value against the others'
    kind: str  # pairwise | best_of
    row: Selector
    against: Selector
    also: tuple[str, ...] = ()
    paper: str = ""
    priority: str = "secondary"
    paper_effect: float | None = None  # the paper's Δ: log PPL ratio for ppl, else in the metric's units
    margin: float | None = None  # equivalence margin, same units
    within_margin: bool = False  # "slightly": holds only if the significant Δ is also inside the margin

    @property
    def log_scale(self) -> bool:
        return self.metric == PPL

    @property
    def equivalence_margin(self) -> float | None:
        """The declared margin, else ±1% PPL for ppl claims without a paper effect (None for others:
        a claim with a paper effect and no margin is asked whether that effect is ruled out instead,
        since "equivalent" within the paper's own effect would only say that)."""
        if self.margin is not None:
            return self.margin
        return DEFAULT_PPL_MARGIN if self.log_scale and self.paper_effect is None else None

    @property
    def slight_margin(self) -> float | None:
        """``within_margin`` claims: the declared margin, else |paper effect|."""
        if self.margin is not None:
            return self.margin
        return abs(self.paper_effect) if self.paper_effect is not None else None


@dataclass(frozen=True)
class ClaimSet:
    claims: tuple[Claim, ...]
    alpha: float = ALPHA
    source: str = f"results/{DATA_FILE}"


_CLAIM_FIELDS = {
    "id",
    "statement",
    "paper",
    "metric",
    "also",
    "expect",
    "kind",
    "row",
    "against",
    "priority",
    "paper_effect",
    "margin",
    "within_margin",
}
_REQUIRED = ("id", "statement", "metric", "expect", "kind", "row", "against", "priority")


class _Checker:
    """One-line errors: ``<file>: claim 2 (mesh_below_base): field 'expect' is 'less'; allowed: ...``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.where = ""

    def fail(self, field_name: str, value: Any, allowed: str) -> ClaimsError:
        where = f" {self.where}:" if self.where else ""
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        return ClaimsError(f"{self.source}:{where} field {field_name!r} is {shown}; allowed: {allowed}")

    def keys(self, mapping: Any, name: str, allowed: set[str], required: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(mapping, dict):
            raise self.fail(name, mapping, "a mapping of " + ", ".join(sorted(allowed)))
        unknown = sorted(set(mapping) - allowed)
        if unknown:
            raise self.fail(unknown[0], mapping[unknown[0]], "one of the fields " + ", ".join(sorted(allowed)))
        missing = [k for k in required if k not in mapping]
        if missing:
            raise self.fail(missing[0], None, f"it is required ({name})")
        return mapping

    def text(self, mapping: dict[str, Any], name: str, default: str | None = None) -> str:
        value = mapping.get(name, default)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, value, "a non-empty string")
        return value.strip()

    def choice(self, mapping: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
        value = mapping.get(name, default)
        if value not in choices:
            raise self.fail(name, value, ", ".join(choices))
        return value

    def number(self, mapping: dict[str, Any], name: str, positive: bool) -> float | None:
        value = mapping.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(name, value, "a number" + (" > 0" if positive else ""))
        if positive and value <= 0:
            raise self.fail(name, value, "a number > 0 (the half-width of the equivalence band)")
        return float(value)

    def scheme(self, name: Any, allow_same: bool) -> str:
        if allow_same and name == "same":
            return name
        if not isinstance(name, str):
            raise self.fail("scheme", name, "a scheme name (vanilla, or " + SCHEME_FORMS + ")")
        if name == "vanilla":
            return name
        try:
            return SchemeSpec.parse(name).canonical
        except ConfigError:
            raise self.fail("scheme", name, "vanilla, " + ("same, " if allow_same else "") + SCHEME_FORMS) from None

    def selector(self, value: Any, name: str) -> Selector:
        against = name == "against"
        fields = {"scheme", "layout", "buffer_slots"} if against else {"scheme", "buffer_slots", "moe"}
        mapping = self.keys(value, name, fields, ("scheme",))
        names = mapping["scheme"] if isinstance(mapping["scheme"], list) else [mapping["scheme"]]
        if not names:
            raise self.fail("scheme", mapping["scheme"], "a scheme name or a non-empty list of them")
        schemes = tuple(self.scheme(n, allow_same=against and len(names) == 1) for n in names)
        slots = mapping.get("buffer_slots", "any")
        allowed_slots = ("any", "default", "other") if against else ("any", "default")
        if not (slots in allowed_slots or (isinstance(slots, int) and not isinstance(slots, bool) and slots > 0)):
            raise self.fail("buffer_slots", slots, ", ".join(allowed_slots) + " or a positive integer")
        layout = self.choice(mapping, "layout", ("same", "any"), "same") if against else "any"
        moe = self.choice(mapping, "moe", ("any", "only", "never"), "any") if not against else "any"
        return Selector(schemes, layout, str(slots), moe)


def _flag(check: _Checker, entry: dict[str, Any], name: str) -> bool:
    value = entry.get(name, False)
    if not isinstance(value, bool):
        raise check.fail(name, value, "true or false")
    return value


def load_claims(path: str | Path | None = None) -> ClaimSet:
    """The claims of the data file (the packaged ``paper_claims.yaml`` unless ``path``), checked."""
    source = resources.files("results").joinpath(DATA_FILE) if path is None else Path(path)
    check = _Checker(f"results/{DATA_FILE}" if path is None else str(path))
    try:
        data = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ClaimsError(f"{check.source}: cannot be read: {str(error).splitlines()[0]}") from None
    data = check.keys(data, "(top level)", {"alpha", "claims"}, ("claims",))
    alpha = data.get("alpha", ALPHA)
    if not isinstance(alpha, float) or not 0 < alpha < 1:
        raise check.fail("alpha", alpha, "a number between 0 and 1, e.g. 0.05")
    if not isinstance(data["claims"], list) or not data["claims"]:
        raise check.fail("claims", data["claims"], "a non-empty list of claims")
    claims: list[Claim] = []
    for index, entry in enumerate(data["claims"], 1):
        check.where = f"claim {index}"
        entry = check.keys(entry, "claim", _CLAIM_FIELDS, _REQUIRED)
        claim_id = check.text(entry, "id")
        check.where = f"claim {index} ({claim_id})"
        if not re.fullmatch(r"[a-z0-9_]+", claim_id) or claim_id in {c.id for c in claims}:
            raise check.fail("id", claim_id, "a new name of lowercase letters, digits and _")
        also = entry.get("also", [])
        if not isinstance(also, list) or not all(isinstance(m, str) and m for m in also):
            raise check.fail("also", also, "a list of metric names")
        claims.append(
            Claim(
                id=claim_id,
                statement=check.text(entry, "statement"),
                metric=check.text(entry, "metric"),
                expect=check.choice(entry, "expect", EXPECT, ""),
                kind=check.choice(entry, "kind", KINDS, ""),
                row=check.selector(entry["row"], "row"),
                against=check.selector(entry["against"], "against"),
                also=tuple(also),
                paper=check.text(entry, "paper") if "paper" in entry else "",
                priority=check.choice(entry, "priority", PRIORITIES, ""),
                paper_effect=check.number(entry, "paper_effect", positive=False),
                margin=check.number(entry, "margin", positive=True),
                within_margin=_flag(check, entry, "within_margin"),
            )
        )
    return ClaimSet(tuple(claims), alpha, check.source)


# ---------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Line:
    """One comparison: the claimed row against ``other`` (diff = claimed - other; for ``ppl`` claims
    the difference of mean log PPL, i.e. of mean val loss, so exp(diff) - 1 is the relative change)."""

    other: Row
    comparison: Comparison
    verdict: str  # of this comparison alone, at alpha on its raw p
    p_holm: float | None = None  # best_of: p adjusted across the claim's comparisons
    mde: float | None = None  # the |Δ| detectable with 80% power at this n and SD
    seeds_needed: int | None = None  # seeds per row for the paper's effect at 80% power, this SD


@dataclass
class Evaluation:
    """One claim in one block, for one claimed row and one metric."""

    claim: Claim
    block: str
    metric: str
    row: Row | None
    verdict: str
    reason: str = ""  # why not tested, or how the verdict was reached
    lines: list[Line] = field(default_factory=list)
    supplementary: bool = False  # a metric of the claim's ``also``
    p: float | None = None  # the p that enters the error-rate family (best_of: see _best_of_p)
    p_adjusted: float | None = None  # Holm across the primary family, BH across the secondary
    lean: str = ""  # inconclusive: which way the mean leans
    level: float = ALPHA  # the per-test level the verdict uses: alpha / m in the primary family, else alpha
    fixed_verdict: str = ""  # under a sequential design: the fixed-n verdict, shown as a secondary view
    role: str = ""  # "confirmatory" | "replication" where a reproduction declares its confirmatory family
    sequential: Any = None  # results.sequential_verdicts.Verdict: the design's decision, when it made this verdict

    @property
    def family(self) -> str:
        return "primary" if self.claim.priority == "primary" and not self.supplementary else "secondary"

    @property
    def fragile(self) -> bool:
        tested = [x for x in self.lines if x.comparison.tested]
        return self.verdict != NOT_TESTED and any(min(x.comparison.n_a, x.comparison.n_b) < FRAGILE_N for x in tested)

    @property
    def verdict_text(self) -> str:
        """``inconclusive, leans the paper's way (n=2, fragile)``; ``paper's effect ruled out (one-sided
        98.75% bound -0.0141 vs paper -0.036)``; ``equivalent (TOST at 0.0125, ±0.01)``."""
        prefix = "replication: " if self.role == "replication" else ""
        if self.sequential is not None:
            return prefix + self.sequential.text
        text = prefix + self.verdict + (f", {self.lean}" if self.lean else "")
        if self.verdict in (RULED_OUT, EQUIVALENT) and self.reason:
            text += f" ({self.reason})"
        if self.reason.startswith("not slight"):
            text += " (not slight)"
        if self.fragile:
            n = min(min(x.comparison.n_a, x.comparison.n_b) for x in self.lines if x.comparison.tested)
            text += f" (n={n}, fragile)"
        return text


def _agrees(comparison: Comparison, expect: str) -> bool:
    return comparison.diff < 0 if expect == "lower" else comparison.diff > 0


def _lean(comparison: Comparison, expect: str) -> str:
    return LEANS_WITH if _agrees(comparison, expect) else LEANS_AGAINST


def one_sided_bound(comparison: Comparison, effect: float, level: float) -> float | None:
    """The one-sided 1 - level confidence bound of Δ on the side of the paper's ``effect`` (the
    lower bound when the paper's effect is negative)."""
    if comparison.se is None or comparison.df is None:
        return None
    half = float(student_t.ppf(1.0 - level, comparison.df)) * comparison.se
    return comparison.diff - half if effect < 0 else comparison.diff + half


def ruled_out(comparison: Comparison, effect: float | None, level: float) -> str:
    """The reason text when the one-sided 1 - level bound excludes the paper's ``effect``, else ""."""
    if not effect:
        return ""
    bound = one_sided_bound(comparison, effect, level)
    if bound is None or not (bound > effect if effect < 0 else bound < effect):
        return ""
    return f"one-sided {100 * (1 - level):.4g}% bound {bound:+.4f} vs paper {effect:+.3f}"


def pairwise_verdict(
    comparison: Comparison,
    claim: Claim,
    alpha: float = ALPHA,
    p_adjusted: float | None = None,
    level: float | None = None,
) -> tuple[str, str, str]:
    """(verdict, lean, reason) of one two-sided test read in the claim's direction; ``p_adjusted``
    (default the raw p) below ``alpha`` decides significance; equivalence (TOST) and "the paper's
    effect ruled out" (one-sided bound) are tested at ``level`` (default alpha), the level the
    family uses for one test."""
    if comparison.p is None:
        return NOT_TESTED, "", comparison.reason
    level = alpha if level is None else level
    p = comparison.p if p_adjusted is None else p_adjusted
    agrees = _agrees(comparison, claim.expect)
    margin = claim.slight_margin if claim.within_margin else claim.equivalence_margin
    if p < alpha and not agrees:
        return CONTRADICTED, "", ""
    if p < alpha and claim.within_margin and margin is not None:
        bound = comparison.ci_high if claim.expect == "higher" else -(comparison.ci_low or 0.0)
        if bound is not None and bound < margin:
            return HOLDS, "", f"significant and inside the ±{margin:g} margin"
        if abs(comparison.diff) > margin:
            return CONTRADICTED, "", f"not slight: Δ beyond the ±{margin:g} margin"
        return INCONCLUSIVE, LEANS_WITH, f"significant, but the 95% CI reaches past the ±{margin:g} margin"
    if p < alpha:
        return HOLDS, "", ""
    if margin is not None and equivalent(comparison, margin, level):
        return EQUIVALENT, "", f"TOST at {level:.4g}: the {100 * (1 - 2 * level):.4g}% CI inside ±{margin:g}"
    excluded = ruled_out(comparison, claim.paper_effect, level)
    if excluded:
        return RULED_OUT, "", excluded
    return INCONCLUSIVE, _lean(comparison, claim.expect), ""


def _missing(claim: Claim, others: list[Row]) -> list[str]:
    """The schemes a best_of claim names that no compared row has (incomplete comparison set)."""
    if claim.against.schemes == ("same",):
        return []
    present = {canonical_scheme(o.scheme) for o in others}
    return [s for s in claim.against.schemes if s not in present]


def _best_of_p(lines: list[Line], expect: str) -> float | None:
    """Every comparison the paper's way: the intersection-union p (the largest raw p); otherwise the
    smallest Holm p of a row with a better mean (the candidate contradiction)."""
    if any(not x.comparison.tested for x in lines):
        return None
    against = [x.p_holm for x in lines if not _agrees(x.comparison, expect) and x.p_holm is not None]
    if against:
        return min(against)
    return max(x.comparison.p for x in lines if x.comparison.p is not None)


def best_of_verdict(
    lines: list[Line], expect: str, alpha: float = ALPHA, p_adjusted: float | None = None, missing: Sequence[str] = ()
) -> tuple[str, str, str]:
    """(verdict, lean, reason) of "the row beats every other" (an intersection-union test): holds when
    every comparison goes the paper's way and the largest p, adjusted across the family, is below
    alpha; contradicted when a row with a better mean is significant after Holm's correction across the
    claim's comparisons (and the family's); capped at inconclusive when rows the claim names are missing."""
    p = _best_of_p(lines, expect)
    adjusted = p if p_adjusted is None else p_adjusted
    better = [x for x in lines if not _agrees(x.comparison, expect)]
    if adjusted is not None and better and adjusted < alpha:
        names = ", ".join(f"`{x.other.label}`" for x in better if x.p_holm is not None and x.p_holm <= p)
        return CONTRADICTED, "", f"significantly better after Holm's correction: {names}"
    untested = [x for x in lines if not x.comparison.tested]
    if untested:
        names = ", ".join(f"`{x.other.label}` ({x.comparison.reason})" for x in untested)
        return NOT_TESTED, "", f"no test against {names}"
    held = sum(x.verdict == HOLDS for x in lines)
    summary = f"{held} of {len(lines)} comparisons significant in the paper's direction"
    if missing:
        summary += "; cannot hold the full claim: no " + ", ".join(missing) + " row"
    lean = LEANS_AGAINST if better else LEANS_WITH
    if better:
        return INCONCLUSIVE, lean, f"not the best mean of the {len(lines) + 1} rows present; {summary}"
    ranked = f"best of the {len(lines) + 1} rows present" if missing else "best mean"
    if adjusted is not None and adjusted < alpha:
        return (INCONCLUSIVE, lean, f"{ranked}; {summary}") if missing else (HOLDS, "", summary)
    return INCONCLUSIVE, lean, f"{ranked}; {summary}"


def _metrics(claim: Claim, results: Results, rows: list[Row]) -> list[tuple[str, bool]]:
    """(metric, supplementary) to test in a block: for ``ppl`` the PPL of every validation set."""
    if claim.metric == PPL:
        per_set = [f"val/{s}/ppl" for s in results.sets if any(f"val/{s}/ppl" in r.stats for r in rows)]
        primary = per_set or ["val_ppl"]
    else:
        primary = [claim.metric]
    also = [m for m in claim.also if any(m in r.stats for r in rows)]
    return [(m, False) for m in primary] + [(m, True) for m in also]


def _log(sample: Any) -> Any:
    if isinstance(sample, dict):
        return {k: math.log(v) for k, v in sample.items()}
    return tuple(math.log(v) for v in sample)


def compare_rows(row: Row, other: Row, metric: str, log_scale: bool) -> Comparison | None:
    """``row`` - ``other`` over seeds; PPL on the log scale (Δ = difference of mean log PPL)."""
    ours, theirs = row.stats.get(metric), other.stats.get(metric)
    if ours is None or theirs is None:
        return None
    if log_scale and min(ours.values + theirs.values) > 0:
        return compare(_log(ours.sample), _log(theirs.sample))
    return compare(ours.sample, theirs.sample)


def _at_level(claim: Claim, line: Line, level: float) -> Line:
    """The line with its MDE and seeds-needed at ``level``, the level its verdict uses."""
    comparison, mde, needed = line.comparison, None, None
    if comparison.tested and comparison.sd and comparison.sd > 0:
        n = min(comparison.n_a, comparison.n_b)
        mde = min_detectable(comparison.sd, n, level, paired=comparison.paired)
        if claim.paper_effect:
            needed = seeds_needed(claim.paper_effect, comparison.sd, level, paired=comparison.paired)
    return replace(line, mde=mde, seeds_needed=needed)


def _line(claim: Claim, other: Row, comparison: Comparison, alpha: float, p_holm: float | None = None) -> Line:
    mde = needed = None
    if comparison.tested and comparison.sd and comparison.sd > 0:
        n = min(comparison.n_a, comparison.n_b)
        mde = min_detectable(comparison.sd, n, alpha, paired=comparison.paired)
        if claim.paper_effect:
            needed = seeds_needed(claim.paper_effect, comparison.sd, alpha, paired=comparison.paired)
    verdict = pairwise_verdict(comparison, claim, alpha)[0]
    return Line(other, comparison, verdict, p_holm, mde, needed)


def _evaluate_row(claim: Claim, block: str, row: Row, others: list[Row], metric: str, alpha: float) -> list[Evaluation]:
    """The evaluations of ``claim`` for the claimed ``row`` against ``others`` in ``metric``
    (verdicts provisional until :func:`decide` has adjusted the family's p-values)."""

    def untested(reason: str) -> Evaluation:
        return Evaluation(claim, block, metric, row, NOT_TESTED, reason)

    if metric not in row.stats:
        return [untested(f"`{row.label}` did not log `{metric}`")]
    if not others:
        return [untested(f"no {claim.against.text} in this block")]
    log_scale = claim.log_scale and metric.endswith("ppl")
    unlogged = [o for o in others if metric not in o.stats]
    if claim.kind == "pairwise":
        evaluations = []
        for other in others:
            comparison = compare_rows(row, other, metric, log_scale)
            if comparison is None:
                evaluations.append(untested(f"`{other.label}` did not log `{metric}`"))
                continue
            line = _line(claim, other, comparison, alpha)
            evaluations.append(Evaluation(claim, block, metric, row, line.verdict, "", [line], p=comparison.p))
        return evaluations
    if unlogged:
        return [untested(", ".join(f"`{o.label}`" for o in unlogged) + f" did not log `{metric}`")]
    comparisons = [compare_rows(row, other, metric, log_scale) for other in others]
    tested = [i for i, c in enumerate(comparisons) if c.p is not None]
    adjusted = dict(zip(tested, holm([comparisons[i].p for i in tested]), strict=True))
    lines = [
        _line(claim, other, c, alpha, adjusted.get(i))
        for i, (other, c) in enumerate(zip(others, comparisons, strict=True))
    ]
    return [Evaluation(claim, block, metric, row, NOT_TESTED, "", lines, p=_best_of_p(lines, claim.expect))]


def decide(evaluations: list[Evaluation], alpha: float = ALPHA) -> None:
    """Adjust the p-values of the tested evaluations across their family (Holm over the primary
    claims, Benjamini-Hochberg over the secondary ones and every ``also`` metric), then give each
    its verdict on the adjusted p."""
    for family, adjust in (("primary", holm), ("secondary", benjamini_hochberg)):
        members = [e for e in evaluations if e.family == family and e.p is not None]
        for evaluation, p in zip(members, adjust([e.p for e in members]), strict=True):
            evaluation.p_adjusted = p
            evaluation.level = alpha / len(members) if family == "primary" else alpha
    for e in evaluations:
        if not e.lines:
            continue
        e.lines = [_at_level(e.claim, x, e.level) for x in e.lines]
        if e.claim.kind == "pairwise":
            e.verdict, e.lean, e.reason = pairwise_verdict(e.lines[0].comparison, e.claim, alpha, e.p_adjusted, e.level)
        else:
            others = [x.other for x in e.lines]
            missing = _missing(e.claim, others)
            e.verdict, e.lean, e.reason = best_of_verdict(e.lines, e.claim.expect, alpha, e.p_adjusted, missing)


def evaluate(results: Results, claims: ClaimSet | None = None) -> list[Evaluation]:
    """Every claim in every block that has a row it selects (one evaluation per claimed row,
    metric and, for pairwise claims, compared row), with verdicts after the error-rate control of
    :func:`decide`; a claim no block can test gets one "not tested" evaluation."""
    claims = claims or load_claims()
    evaluations: list[Evaluation] = []
    for claim in claims.claims:
        found = []
        for block in results.blocks:
            for row in block.rows:
                if not claim.row.selects(row):
                    continue
                others = [
                    r
                    for r in block.rows
                    if r is not row and r.overrides == row.overrides and claim.against.selects(r, row)
                ]
                for metric, supplementary in _metrics(claim, results, [row, *others]):
                    for evaluation in _evaluate_row(claim, block.name, row, others, metric, claims.alpha):
                        evaluation.supplementary = supplementary
                        found.append(evaluation)
        if not found:
            metric = "val_ppl" if claim.metric == PPL else claim.metric
            found.append(Evaluation(claim, "", metric, None, NOT_TESTED, f"no {claim.row.text} in these runs"))
        evaluations += found
    decide(evaluations, claims.alpha)
    return evaluations
