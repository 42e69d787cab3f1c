"""The schema of the paper's claims file (``paper_claims.yaml``): :func:`load_claims` reads and
checks it (one-line errors naming the claim, field, value and what is allowed, :class:`ClaimsError`)
into :class:`Claim` objects; :mod:`results.verdicts.claims` tests them on the runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from mesh_model import ConfigError, SchemeSpec
from mesh_model.schemes import SCHEME_FORMS
from results.rows.aggregate import Row, is_ppl
from results.rows.frame import ResultsError
from results.rows.paper import canonical_scheme, default_slots, slots_value
from results.stats.comparison import ALPHA

DATA_FILE = "paper_claims.yaml"
KINDS = ("pairwise", "best_of")
EXPECT = ("lower", "higher")
PRIORITIES = ("primary", "secondary")
DEFAULT_PPL_MARGIN = 0.01  # ±1% PPL (0.01 nats of val loss) when the paper gives no effect
PPL = "ppl"  # the metric name for "the validation PPL of every validation set"


class ClaimsError(ResultsError):
    """The claims file is malformed; the message says where and what is allowed."""


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
        """PPL claims compare log PPL (as every table and ranking does: :meth:`Row.compare`)."""
        return self.metric == PPL or is_ppl(self.metric)

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
