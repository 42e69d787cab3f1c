"""The paper's claims (``paper_claims.yaml``) tested on the runs read, and ``claims.md``.

:func:`load_claims` reads and checks the data file (one-line errors naming the claim, field, value
and what is allowed); :func:`evaluate` tests every claim in every block where its rows are present
(:mod:`results.stats`) and gives each evaluation a verdict; :func:`write_claims` writes
``claims.md``. The verdicts and the "best of" rule are documented in the data file's header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from mesh_model import ConfigError, SchemeSpec
from mesh_model.schemes import SCHEME_FORMS
from results.aggregate import Results, Row
from results.collect import ResultsError
from results.paper import canonical_scheme, default_slots, slots_value
from results.stats import ALPHA, Comparison, holm

DATA_FILE = "paper_claims.yaml"
HOLDS = "holds"
AGREES = "agrees, not significant"
DISAGREES = "disagrees, not significant"
CONTRADICTED = "contradicted"
NOT_TESTED = "not tested"
VERDICTS = (HOLDS, AGREES, DISAGREES, CONTRADICTED, NOT_TESTED)
KINDS = ("pairwise", "best_of")
EXPECT = ("lower", "higher")
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


@dataclass(frozen=True)
class ClaimSet:
    claims: tuple[Claim, ...]
    alpha: float = ALPHA
    source: str = f"results/{DATA_FILE}"


_CLAIM_FIELDS = {"id", "statement", "paper", "metric", "also", "expect", "kind", "row", "against"}
_REQUIRED = ("id", "statement", "metric", "expect", "kind", "row", "against")


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
            )
        )
    return ClaimSet(tuple(claims), alpha, check.source)


# ---------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Line:
    """One comparison: the claimed row against ``other`` (diff = claimed - other)."""

    other: Row
    comparison: Comparison
    verdict: str  # of this comparison alone
    p_holm: float | None = None  # best_of: p adjusted across the claim's comparisons


@dataclass
class Evaluation:
    """One claim in one block, for one claimed row and one metric."""

    claim: Claim
    block: str
    metric: str
    row: Row | None
    verdict: str
    reason: str = ""  # why not tested, or how a best_of verdict was reached
    lines: list[Line] = field(default_factory=list)
    supplementary: bool = False  # a metric of the claim's ``also``


def _agrees(comparison: Comparison, expect: str) -> bool:
    return comparison.diff < 0 if expect == "lower" else comparison.diff > 0


def pairwise_verdict(comparison: Comparison, expect: str, alpha: float = ALPHA) -> str:
    """The verdict of one two-sided test read in the claim's direction."""
    if comparison.p is None:
        return NOT_TESTED
    agrees = _agrees(comparison, expect)
    if comparison.p < alpha:
        return HOLDS if agrees else CONTRADICTED
    return AGREES if agrees else DISAGREES


def best_of_verdict(lines: list[Line], expect: str, alpha: float = ALPHA) -> tuple[str, str]:
    """(verdict, reason) of "the row beats every other": holds when every comparison holds
    (intersection-union test); contradicted when another row is significantly better after Holm's
    correction; not tested when a comparison cannot be tested."""
    against = [x for x in lines if x.p_holm is not None and x.p_holm < alpha and not _agrees(x.comparison, expect)]
    if against:
        names = ", ".join(f"`{x.other.label}`" for x in against)
        return CONTRADICTED, f"significantly better after Holm's correction: {names}"
    untested = [x for x in lines if not x.comparison.tested]
    if untested:
        names = ", ".join(f"`{x.other.label}` ({x.comparison.reason})" for x in untested)
        return NOT_TESTED, f"no test against {names}"
    held = sum(x.verdict == HOLDS for x in lines)
    summary = f"{held} of {len(lines)} comparisons significant in the paper's direction"
    if held == len(lines):
        return HOLDS, summary
    if all(_agrees(x.comparison, expect) for x in lines):
        return AGREES, f"best mean; {summary}"
    return DISAGREES, f"not the best mean, no other row significantly better; {summary}"


def _metrics(claim: Claim, results: Results, rows: list[Row]) -> list[tuple[str, bool]]:
    """(metric, supplementary) to test in a block: for ``ppl`` the PPL of every validation set."""
    if claim.metric == PPL:
        per_set = [f"val/{s}/ppl" for s in results.sets if any(f"val/{s}/ppl" in r.stats for r in rows)]
        primary = per_set or ["val_ppl"]
    else:
        primary = [claim.metric]
    also = [m for m in claim.also if any(m in r.stats for r in rows)]
    return [(m, False) for m in primary] + [(m, True) for m in also]


def _evaluate_row(claim: Claim, block: str, row: Row, others: list[Row], metric: str, alpha: float) -> list[Evaluation]:
    """The evaluations of ``claim`` for the claimed ``row`` against ``others`` in ``metric``."""

    def untested(reason: str) -> Evaluation:
        return Evaluation(claim, block, metric, row, NOT_TESTED, reason)

    if metric not in row.stats:
        return [untested(f"`{row.label}` did not log `{metric}`")]
    if not others:
        return [untested(f"no {claim.against.text} in this block")]
    unlogged = [o for o in others if metric not in o.stats]
    if claim.kind == "pairwise":
        evaluations = []
        for other in others:
            comparison = row.compare(other, metric)
            if comparison is None:
                evaluations.append(untested(f"`{other.label}` did not log `{metric}`"))
                continue
            verdict = pairwise_verdict(comparison, claim.expect, alpha)
            line = Line(other, comparison, verdict)
            evaluations.append(Evaluation(claim, block, metric, row, verdict, comparison.reason, [line]))
        return evaluations
    if unlogged:
        return [untested(", ".join(f"`{o.label}`" for o in unlogged) + f" did not log `{metric}`")]
    comparisons = [row.compare(other, metric) for other in others]
    tested = [i for i, c in enumerate(comparisons) if c.p is not None]
    adjusted = dict(zip(tested, holm([comparisons[i].p for i in tested]), strict=True))
    lines = [
        Line(other, c, pairwise_verdict(c, claim.expect, alpha), adjusted.get(i))
        for i, (other, c) in enumerate(zip(others, comparisons, strict=True))
    ]
    verdict, reason = best_of_verdict(lines, claim.expect, alpha)
    return [Evaluation(claim, block, metric, row, verdict, reason, lines)]


def evaluate(results: Results, claims: ClaimSet | None = None) -> list[Evaluation]:
    """Every claim in every block that has a row it selects (one evaluation per claimed row,
    metric and, for pairwise claims, compared row); a claim no block can test gets one
    "not tested" evaluation."""
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
    return evaluations
