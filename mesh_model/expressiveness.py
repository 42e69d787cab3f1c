"""Which state-passing schemes can MeSH express? The closest MeSH routing to a scheme's effective
coefficients, and how far it stays.

**The coefficient reading** (:mod:`mesh_model.state_coefficients`, the ``routing/coef`` probes).
Every scheme builds the loop's states linearly from the sources h_emb, the prelude output and the
core outputs f_1 .. f_K (f_t = f_core(h(t-1))). The scheme's *effective coefficients* are the
(K+1) x (K+2) matrix C whose row t gives h(t) = sum_s C[t, s] v_s over
``source_names(K)`` = (h_emb, prelude, f1 .. fK): rows h(0) .. h(K-1) are the inputs of core
iterations 1 .. K and row h(K) is the coda's input. A source not yet computed has coefficient 0.

* A fixed sum h(t+1) = c_core f + c_res h(t) + c_anchor h(0) + c_emb h_emb (``base``, ``residual``,
  ``anchor``, ``anchor_emb`` = the paper's anchor*, and their weighted sums) has constant C, with
  h(0) = the prelude output: base is the identity shifted by one (C[t, 1+t] = 1), residual the
  lower staircase of ones, anchor C[t, prelude] = 1 and C[t, 1+t] = 1, anchor* C[0, prelude] = 1,
  then C[t, h_emb] = 1 and C[t, 1+t] = 1 (:func:`scheme_coefficients`).
* MeSH with B slots: router i (0 = the transition, which writes the prelude output; i = t for core
  step t, whose read is h(t); router K's read is the final read) gives per token softmax write
  weights w_i and read weights r_i over the slots. The buffer starts as [h_emb, 0, ..., 0] and only
  receives weighted writes, so C[i, h_emb] = r_i[0] and C[i, v_s] = r_i . w_s for the values
  written so far (s <= i), plus 1 f_K in the last row under ``final_read=residual``
  (:func:`mesh_model.state_coefficients.mesh_coefficients`, the function the probes use).

Routers are Linear(D -> B, with bias) of the token's state, so zero weights and a bias reach any
logits: the set of C a token can have is exactly {C(softmax(W), softmax(R))} over logits W, R in
R^((K+1) x B). The fixed schemes' C is the same for every token, so the closest MeSH routing is one
(per-token) problem: min over logits of ||C(W, R) - C_scheme||_F (:func:`closest_routing`), by
Adam in float64 from ``STARTS`` seeded random starts, all at once, then L-BFGS on the best (and, in :func:`fit_table`, from the best
routing at B - 1 with the new slot's logits at ``PAD``: a B-slot router can do what a (B-1)-slot
one does, so the residual does not increase with B, to within e^PAD).

The infimum may only be approached as logits grow without bound (one-hot routing, e.g. base), so
a reported residual is an upper bound on the infimum, within ~e^(-logit gap) of it when the
infimum is reached only at infinity; a residual far above that is a property of softmax reads and
additive writes, not of training or scale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mesh_model.errors import ConfigError
from mesh_model.scheme_names import SCHEME_FORMS, SchemeSpec
from mesh_model.state_coefficients import mesh_coefficients, source_names, state_names

STARTS = 12
SEED = 49
LOGIT_SD = 3.0  # random starts: logits N(0, 3^2), from near-uniform to near-one-hot routing
PAD = -30.0  # a new slot's logits in a warm start from B - 1 slots: weight ~e^-30 relative
ADAM_STEPS = 2_000
ADAM_LR = 0.1
POLISH_ITER = 200
SCHEMES = ("base", "residual", "anchor", "anchor_emb")  # the fixed schemes the paper compares MeSH to


def scheme_coefficients(scheme: str, loops: int) -> Tensor:
    """A fixed scheme's effective coefficients, (K+1) x (K+2) float64 over ``source_names(loops)``."""
    spec = SchemeSpec.parse(scheme)
    if spec.kind not in ("base", "fixed"):
        raise ConfigError("scheme", scheme, "a fixed scheme has constant coefficients: " + SCHEME_FORMS)
    weights = spec.coefficients
    core, res = weights.get("core", 1.0), weights.get("residual", 0.0)
    anchor, emb = weights.get("anchor", 0.0), weights.get("anchor_emb", 0.0)
    unit = torch.eye(loops + 2, dtype=torch.float64)
    h0 = unit[1]
    rows = [h0]
    for t in range(loops):
        rows.append(core * unit[2 + t] + res * rows[-1] + anchor * h0 + emb * unit[0])
    return torch.stack(rows)


def routing_coefficients(logits: Tensor, final_read: str = "read") -> Tensor:
    """MeSH's effective coefficients (..., K+1, K+2) from router logits (..., 2, K+1, B): write
    logits first, then read logits, router 0 (the transition) to K (the final read)."""
    writes, reads = torch.softmax(logits, dim=-1).unbind(-3)
    return mesh_coefficients(writes, reads, final_read)


@dataclass(frozen=True)
class Fit:
    """The closest MeSH routing to ``target``: its logits, softmax weights and coefficients."""

    target: Tensor  # (K+1, K+2)
    logits: Tensor  # (2, K+1, B): write, read
    coefficients: Tensor  # (K+1, K+2)
    squared_error: float  # ||coefficients - target||_F^2
    final_read: str = "read"

    @property
    def residual(self) -> float:
        """The Frobenius norm of the difference."""
        return math.sqrt(self.squared_error)

    @property
    def slots(self) -> int:
        return self.logits.shape[-1]

    @property
    def write(self) -> Tensor:
        return torch.softmax(self.logits[0], dim=-1)

    @property
    def read(self) -> Tensor:
        return torch.softmax(self.logits[1], dim=-1)


def _squared_errors(logits: Tensor, target: Tensor, final_read: str) -> Tensor:
    """One squared error per start: logits (S, 2, K+1, B) -> (S,)."""
    return (routing_coefficients(logits, final_read) - target).square().sum((-2, -1))


def _adam(starts: Tensor, target: Tensor, final_read: str, steps: int) -> Tensor:
    """Every start at once: Adam is per coordinate, so summing the starts' errors leaves them
    independent. The step size decays from ``ADAM_LR`` by cosine to 1/1000 of it."""
    logits = starts.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([logits], lr=ADAM_LR)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps, eta_min=ADAM_LR / 1000)
    for _ in range(steps):
        optimizer.zero_grad()
        _squared_errors(logits, target, final_read).sum().backward()
        optimizer.step()
        schedule.step()
    return logits.detach()


def _polish(start: Tensor, target: Tensor, final_read: str, max_iter: int) -> Tensor:
    """L-BFGS with a strong Wolfe line search (the error never rises) from one start."""
    logits = start.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [logits], max_iter=max_iter, tolerance_grad=1e-12, tolerance_change=1e-15, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = _squared_errors(logits, target, final_read).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return logits.detach()


def closest_routing(
    target: Tensor,
    slots: int,
    final_read: str = "read",
    starts: int = STARTS,
    seed: int = SEED,
    warm: Sequence[Tensor] = (),
    steps: int = ADAM_STEPS,
    polish: int = POLISH_ITER,
) -> Fit:
    """The MeSH routing over ``slots`` slots whose coefficients come closest to ``target``
    ((K+1) x (K+2)): ``starts`` random starts (seeded by ``seed``) and any ``warm`` logits
    (2, K+1, slots), each descended by Adam (``steps``), the best then polished by L-BFGS
    (``polish`` iterations). The result is never worse than the best start itself."""
    target = target.to(torch.float64)
    loops = target.shape[0] - 1
    if loops < 0 or target.shape != (loops + 1, loops + 2) or slots < 1:
        raise ValueError(f"target must be (K+1) x (K+2) and slots >= 1, got {tuple(target.shape)}, {slots}")
    generator = torch.Generator().manual_seed(seed)
    random = LOGIT_SD * torch.randn(starts, 2, loops + 1, slots, generator=generator, dtype=torch.float64)
    initial = torch.cat((torch.stack([w.to(torch.float64) for w in warm]), random)) if warm else random
    candidates = torch.cat((initial, _adam(initial, target, final_read, steps)))
    best = candidates[int(torch.nan_to_num(_squared_errors(candidates, target, final_read), nan=math.inf).argmin())]
    polished = _polish(best.unsqueeze(0), target, final_read, polish)
    errors = _squared_errors(torch.cat((best.unsqueeze(0), polished)), target, final_read)
    logits = polished[0] if errors[1] < errors[0] else best
    with torch.no_grad():
        coefficients = routing_coefficients(logits, final_read)
    return Fit(target, logits, coefficients, float(errors.nan_to_num(nan=math.inf).min()), final_read)


def pad_slot(logits: Tensor) -> Tensor:
    """(2, K+1, B) logits -> (2, K+1, B+1) with the new last slot at ``PAD`` below each router's
    largest logit: the same routing to within e^PAD."""
    low = logits.amax(dim=-1, keepdim=True) + PAD
    return torch.cat((logits, low), dim=-1)


@dataclass(frozen=True)
class Row:
    scheme: str
    loops: int
    slots: int
    final_read: str
    fit: Fit


def fit_table(
    schemes: Sequence[str] = SCHEMES,
    loops: Sequence[int] = (2, 3),
    slots: Sequence[int] = (3, 4, 5, 6),
    final_read: str = "read",
    starts: int = STARTS,
    seed: int = SEED,
    steps: int = ADAM_STEPS,
) -> list[Row]:
    """The closest fit of every scheme at every K and B; B ascending, each B warm-started from the
    best fit at the previous B, so the residual is non-increasing in B."""
    rows = []
    for scheme in schemes:
        for k in loops:
            target, previous = scheme_coefficients(scheme, k), None
            for b in sorted(slots):
                warm = [pad_slot(previous.logits)] if previous is not None and previous.slots == b - 1 else []
                previous = closest_routing(target, b, final_read, starts, seed, warm, steps)
                rows.append(Row(scheme, k, b, final_read, previous))
    return rows


def table_markdown(rows: Sequence[Row]) -> str:
    """Rows as a markdown table: one line per scheme and K, one column per B, the squared error."""
    slots = sorted({r.slots for r in rows})
    lines = [
        "| scheme | K | " + " | ".join(f"B = {b}" for b in slots) + " |",
        "|---|---|" + "---|" * len(slots),
    ]
    keys = dict.fromkeys((r.scheme, r.loops) for r in rows)
    for scheme, k in keys:
        cells = {r.slots: r.fit.squared_error for r in rows if (r.scheme, r.loops) == (scheme, k)}
        values = " | ".join(_number(cells[b]) if b in cells else "" for b in slots)
        lines.append(f"| {scheme} | {k} | {values} |")
    return "\n".join(lines)


def _number(value: float) -> str:
    return f"{value:.2e}" if value < 1e-3 else f"{value:.4f}"


def describe(fit: Fit) -> str:
    """The fit's coefficients beside the target's, one line per state (for a reader, not a parser)."""
    loops = fit.target.shape[0] - 1
    header = "state  " + "  ".join(f"{name:>14}" for name in source_names(loops))
    lines = [header]
    for name, got, want in zip(state_names(loops), fit.coefficients, fit.target, strict=True):
        cells = "  ".join(f"{g:6.3f} ({w:4.1f})" for g, w in zip(got.tolist(), want.tolist(), strict=True))
        lines.append(f"{name:<6} {cells}")
    return "\n".join(lines)


__all__ = [
    "SCHEMES",
    "Fit",
    "Row",
    "closest_routing",
    "describe",
    "fit_table",
    "pad_slot",
    "routing_coefficients",
    "scheme_coefficients",
    "table_markdown",
]
