"""Scheme names: :class:`SchemeSpec` parses ``ModelConfig.scheme`` (see :mod:`mesh_model.schemes`
for what each scheme computes). Kept free of torch so configs and CLIs load without it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from mesh_model.errors import ConfigError, did_you_mean

SUPPLEMENT_TERMS = ("residual", "anchor", "anchor_emb")
LEARNED_SCHEMES = ("static", "dynamic", "mesh")
SCHEME_FORMS = (
    "use base, mesh, static, dynamic, or a '+'-joined sum of residual, anchor, anchor_emb "
    "(optionally weighted, e.g. residual+anchor or 0.5*anchor+anchor_emb; 'core' weights f)"
)
# The schemes the paper reports, in its order (a block's rows are listed so, results.rows.aggregate):
# vanilla (the plain model at the layout's compute depth; a layout, not a scheme), base (the loop
# alone), the fixed supplements alone and summed, the learned ones. Lists of schemes derive from it.
PAPER_SCHEMES = (
    "vanilla", "base", "residual", "anchor_emb", "anchor",
    "residual+anchor", "residual+anchor+anchor_emb", "anchor+anchor_emb",
    "static", "dynamic", "mesh",
)  # fmt: skip
# What an unknown scheme name answers: the model's schemes, and ``vanilla``, which a run config
# (experiments.identity) resolves to the compute-matched plain model before a scheme is parsed.
UNKNOWN_SCHEME = (
    SCHEME_FORMS + "; a run config also takes vanilla (the plain model at the layout's compute depth, no core)"
)
_TERM = re.compile(r"^(?:(?P<coef>[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\*)?(?P<name>[a-z_]+\*?)$")
# A fixed coefficient's magnitude is at most this: beyond it the loop's state grows by orders of
# magnitude per iteration (and 1e400 is not even a float), which is a typo, not an ablation.
MAX_COEFFICIENT = 100.0
_ALIASES = {"anchor*": "anchor_emb", "anchor_star": "anchor_emb", "f": "core"}
# The names a mistyped scheme is matched against for a suggestion: the paper's schemes and the
# alias anchor*, single names first (mesh-train's list of choices shows them in this order).
NAMED_SCHEMES = (
    "base", *LEARNED_SCHEMES, *SUPPLEMENT_TERMS, "anchor*", "vanilla",
    *(scheme for scheme in PAPER_SCHEMES if "+" in scheme),
)  # fmt: skip


def unknown_scheme(text: str) -> ConfigError:
    return ConfigError("scheme", text, did_you_mean(text, NAMED_SCHEMES) + UNKNOWN_SCHEME)


@dataclass(frozen=True)
class SchemeSpec:
    """A parsed scheme name. ``coefficients`` holds the fixed weights of a ``fixed`` sum."""

    kind: str  # base | fixed | static | dynamic | mesh
    coefficients: dict[str, float] = field(default_factory=dict)

    @property
    def canonical(self) -> str:
        if self.kind != "fixed":
            return self.kind
        terms = []
        for name in ("core", *SUPPLEMENT_TERMS):
            coef = self.coefficients.get(name)
            if coef is None or (name == "core" and coef == 1.0):
                continue
            terms.append(name if coef == 1.0 else f"{coef:g}*{name}")
        return "+".join(terms)

    @classmethod
    def parse(cls, text: str) -> SchemeSpec:
        name = str(text).strip().lower().replace(" ", "")
        if name in ("base", *LEARNED_SCHEMES):
            return cls(kind=name)
        coefficients: dict[str, float] = {}
        for term in name.split("+") if name else [""]:
            match = _TERM.match(term)
            if match is None:
                raise unknown_scheme(text)
            term_name = _ALIASES.get(match.group("name"), match.group("name"))
            if term_name not in ("core", *SUPPLEMENT_TERMS) or term_name in coefficients:
                raise unknown_scheme(text)
            coefficients[term_name] = _coefficient(text, term_name, match.group("coef"))
        if not any(t in coefficients for t in SUPPLEMENT_TERMS) and coefficients.get("core", 1.0) == 1.0:
            return cls(kind="base")
        return cls(kind="fixed", coefficients=coefficients)


def _coefficient(text: str, term: str, written: str | None) -> float:
    if written is None:
        return 1.0
    value = float(written)
    if not math.isfinite(value) or abs(value) > MAX_COEFFICIENT:
        allowed = f"the coefficient of {term} ({written}) must be a finite number between -{MAX_COEFFICIENT:g} and {MAX_COEFFICIENT:g}"
        raise ConfigError("scheme", text, allowed)
    return value
