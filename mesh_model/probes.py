"""The paper's hidden-state probes: relative update magnitudes, pairwise CKA, singular-value spectra.

Every function takes hidden states shaped (..., L, D): one sample is the L x D matrix of a stage, the
L token positions are its rows (the examples of CKA). Statistics are computed in float64 without grad.

Choices, made once here:

* Blocks (:func:`update_magnitudes`): ``prelude`` maps ``embedding -> prelude``; core iteration
  ``core{t}`` maps ``h{t-1} -> h{t}``, so for MeSH (and every scheme) the update includes the state
  passing of that step, not just f_core; ``coda`` maps ``h{K} -> coda``. MeSH's transition
  ``prelude -> h0`` (the first buffer read) belongs to no block. A vanilla layout has ``prelude``
  (``embedding -> prelude``) and ``coda`` (``prelude -> coda``). An empty stack (0 layers) has update 0.
* Spread over samples is the population standard deviation (ddof=0): it describes the samples,
  and one sample has std 0.
* Stages (:func:`paper_stages`, used by :func:`probe_report`): the paper's ``embedding, h0..hK, coda``
  (h_emb, h(0)..h(K), h_out), plus ``prelude`` right before ``h0`` only when it differs from ``h0``
  (MeSH reads h(0) from its buffer; every other scheme has h(0) = prelude output). Vanilla:
  ``embedding, prelude, coda``.
* CKA (Kornblith et al. 2019): Gram matrices over the L rows, centred with H = I - 11^T/L,
  CKA = <HKH, HLH>_F / (||HKH||_F ||HLH||_F). The RBF bandwidth is sigma = sigma_fraction x the
  median of the non-zero pairwise Euclidean distances between rows, taken separately for each
  matrix (so RBF CKA is invariant to isotropic scaling). CKA is NaN where a centred Gram is zero.
* Spectra: singular values of the raw (not centred) L x D matrix, normalised sigma_i / sigma_0,
  the first ``top`` kept and padded with NaN when min(L, D) < top. Effective rank: Roy & Vetterli
  (2007), exp of the Shannon entropy of p_i = sigma_i / sum(sigma) over all singular values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

_LOOP_STAGE = re.compile(r"^h(\d+)$")


def _f64(x: Tensor) -> Tensor:
    return x.detach().to(torch.float64)


def _loops(stages: Mapping[str, Tensor]) -> int | None:
    """K from the stage names ``h0..hK``; None for a vanilla layout."""
    steps = [int(m.group(1)) for name in stages if (m := _LOOP_STAGE.match(name))]
    return max(steps) if steps else None


# ---------------------------------------------------------------- relative update magnitude


@torch.no_grad()
def relative_update(h_in: Tensor, h_out: Tensor) -> Tensor:
    """2 ||h_out - h_in||_F / (||h_out||_F + ||h_in||_F) per sample, norms over the last two dims.

    (..., L, D) -> (...). 0 means no change, 2 means h_out = -h_in; 0 when both are zero.
    """
    h_in, h_out = _f64(h_in), _f64(h_out)
    diff = torch.linalg.matrix_norm(h_out - h_in)
    total = torch.linalg.matrix_norm(h_out) + torch.linalg.matrix_norm(h_in)
    return torch.where(total > 0, 2 * diff / total, 0.0)


def update_blocks(stages: Mapping[str, Tensor]) -> dict[str, tuple[str, str]]:
    """Block name -> (input stage, output stage); see the module docstring."""
    loops = _loops(stages)
    if loops is None:
        return {"prelude": ("embedding", "prelude"), "coda": ("prelude", "coda")}
    blocks = {"prelude": ("embedding", "prelude")}
    blocks.update({f"core{t}": (f"h{t - 1}", f"h{t}") for t in range(1, loops + 1)})
    blocks["coda"] = (f"h{loops}", "coda")
    return blocks


def _per_sample_updates(stages: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {block: relative_update(stages[a], stages[b]).reshape(-1) for block, (a, b) in update_blocks(stages).items()}


def _mean_std(values: Tensor) -> tuple[float, float]:
    return values.mean().item(), values.std(correction=0).item()


def update_magnitudes(stages: Mapping[str, Tensor]) -> dict[str, tuple[float, float]]:
    """Block -> (mean, population std) of the relative update over samples: ``prelude``,
    ``core1``..``coreK``, ``coda`` (vanilla: ``prelude``, ``coda``)."""
    return {block: _mean_std(values) for block, values in _per_sample_updates(stages).items()}


# ---------------------------------------------------------------- CKA


def _centred_gram(x: Tensor, kind: str, sigma_fraction: float, debiased: bool = False) -> Tensor:
    """(..., L, D) -> (..., L, L) Gram matrix over rows, centred on both sides (H K H)."""
    x = _f64(x)
    if kind == "linear":
        gram = x @ x.transpose(-1, -2)
    elif kind == "rbf":
        # Exact differences (not the |a|^2+|b|^2-2ab expansion), so repeated rows are exactly 0 apart.
        dist = torch.cdist(x, x, compute_mode="donot_use_mm_for_euclid_dist")
        sigma = sigma_fraction * _nonzero_median(dist)
        gram = torch.exp(-(dist**2) / (2 * sigma[..., None, None] ** 2))
    else:
        raise ValueError(f"unknown CKA kind {kind!r}; use 'rbf' or 'linear'")
    if not debiased:
        return gram - gram.mean(-1, keepdim=True) - gram.mean(-2, keepdim=True) + gram.mean((-1, -2), keepdim=True)
    # The U-statistic form of Kornblith's reference code (Szekely & Rizzo 2014): zero diagonal, then
    # inner products of these matrices are n(n-3) times the unbiased HSIC of Song et al. (2012).
    n = gram.shape[-1]
    if n < 4:
        raise ValueError(f"debiased CKA needs at least 4 rows (tokens), got {n}")
    gram = gram * (1 - torch.eye(n, dtype=gram.dtype, device=gram.device))
    means = gram.sum(-2) / (n - 2)
    means = means - means.sum(-1, keepdim=True) / (2 * (n - 1))
    gram = gram - means[..., :, None] - means[..., None, :]
    return gram * (1 - torch.eye(n, dtype=gram.dtype, device=gram.device))


def _nonzero_median(dist: Tensor) -> Tensor:
    """Median of the non-zero off-diagonal entries of (..., L, L) distance matrices, shape (...)."""
    rows, cols = torch.triu_indices(dist.shape[-1], dist.shape[-1], offset=1, device=dist.device)
    pairs = dist[..., rows, cols]
    if pairs.shape[-1] == 0:  # a single row has no pairs
        return dist.new_full(dist.shape[:-2], torch.nan)
    count = (pairs > 0).sum(-1, keepdim=True)
    ordered = torch.where(pairs > 0, pairs, torch.inf).sort(-1).values  # non-zero first
    low = ordered.gather(-1, ((count - 1) // 2).clamp_min(0))
    high = ordered.gather(-1, count // 2)
    return torch.where(count > 0, (low + high) / 2, torch.nan).squeeze(-1)


def _cka_from_grams(kx: Tensor, ky: Tensor) -> Tensor:
    hsic = (kx * ky).sum((-1, -2))
    return hsic / (torch.linalg.matrix_norm(kx) * torch.linalg.matrix_norm(ky))


@torch.no_grad()
def linear_cka(x: Tensor, y: Tensor, debiased: bool = False) -> Tensor:
    """Linear CKA between (..., L, Dx) and (..., L, Dy) per sample -> (...).

    ``debiased`` uses the unbiased HSIC estimator (Kornblith's ``debiased=True``): the plain
    estimator has a floor of about D / (L + D) for independent random matrices.
    """
    return _cka_from_grams(_centred_gram(x, "linear", 0.0, debiased), _centred_gram(y, "linear", 0.0, debiased))


@torch.no_grad()
def rbf_cka(x: Tensor, y: Tensor, sigma_fraction: float = 0.5, debiased: bool = False) -> Tensor:
    """RBF CKA per sample -> (...).

    sigma = ``sigma_fraction`` x the median of the non-zero pairwise Euclidean distances between the
    L rows, computed separately for x and for y (and for each sample); repeated rows (distance 0,
    e.g. a repeated token in the embedding stage) are left out of the median. ``debiased``: see
    :func:`linear_cka`; the plain RBF estimator's floor for independent inputs is high when D is not
    small against L (about 0.7 for L=256, D=64 at fraction 0.5).
    """
    kx = _centred_gram(x, "rbf", sigma_fraction, debiased)
    return _cka_from_grams(kx, _centred_gram(y, "rbf", sigma_fraction, debiased))


def _per_sample_cka(stages: Mapping[str, Tensor], kind: str, sigma_fraction: float, debiased: bool) -> Tensor:
    """(N, S, S) CKA matrices, one sample at a time so memory stays at S Gram matrices of L x L."""
    tensors = [_f64(t).reshape(-1, *t.shape[-2:]) for t in stages.values()]
    out = []
    for i in range(tensors[0].shape[0]):
        grams = torch.stack([_centred_gram(t[i], kind, sigma_fraction, debiased).flatten() for t in tensors])
        grams = grams / torch.linalg.vector_norm(grams, dim=-1, keepdim=True)
        matrix = grams @ grams.T
        matrix.fill_diagonal_(1.0)
        out.append(matrix)
    return torch.stack(out)


def pairwise_cka(
    stages: Mapping[str, Tensor], kind: str = "rbf", sigma_fraction: float = 0.5, debiased: bool = False
) -> tuple[list[str], Tensor]:
    """CKA between every pair of the given stages (each (N, L, D)), averaged over the N samples.

    Returns the stage names and an (S, S) symmetric matrix with unit diagonal. Pass
    :func:`paper_stages` of a model's hidden states for the paper's figure.
    """
    with torch.no_grad():
        return list(stages), _per_sample_cka(stages, kind, sigma_fraction, debiased).mean(0)


# ---------------------------------------------------------------- spectra and effective rank


def _singular_values(x: Tensor) -> Tensor:
    """(..., L, D) -> (N, min(L, D)), of the uncentred matrices, descending."""
    return torch.linalg.svdvals(_f64(x).reshape(-1, *x.shape[-2:]))


def _normalised_top(sv: Tensor, top: int) -> Tensor:
    """(N, r) singular values -> (N, top): sigma_i / sigma_0, NaN-padded past r."""
    sv = sv[:, :top] / sv[:, :1]
    return torch.nn.functional.pad(sv, (0, top - sv.shape[-1]), value=torch.nan)


def _entropy_rank(sv: Tensor) -> Tensor:
    p = sv / sv.sum(-1, keepdim=True)
    entropy = -torch.where(p > 0, p * p.log(), torch.zeros_like(p)).sum(-1)
    return entropy.exp()


@torch.no_grad()
def spectra(stages: Mapping[str, Tensor], top: int = 50) -> dict[str, Tensor]:
    """Stage -> mean over samples of the top-``top`` normalised singular values (NaN past min(L, D))."""
    return {name: _normalised_top(_singular_values(x), top).mean(0) for name, x in stages.items()}


@torch.no_grad()
def effective_ranks(stages: Mapping[str, Tensor]) -> dict[str, float]:
    """Stage -> mean over samples of the entropy effective rank (Roy & Vetterli 2007)."""
    return {name: _entropy_rank(_singular_values(x)).mean().item() for name, x in stages.items()}


# ---------------------------------------------------------------- the report


def paper_stages(stages: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The stages the CKA and spectra figures use: drop ``prelude`` when it equals ``h0``."""
    if "h0" in stages and "prelude" in stages and torch.equal(stages["prelude"], stages["h0"]):
        return {name: x for name, x in stages.items() if name != "prelude"}
    return dict(stages)


@dataclass
class ProbeReport:
    """All three probes over a fixed set of held-out samples (means over samples)."""

    stages: list[str]  # order of the CKA matrices, see paper_stages
    updates: dict[str, tuple[float, float]]  # block -> (mean, population std)
    cka_rbf: Tensor  # (S, S)
    cka_linear: Tensor  # (S, S)
    spectra: dict[str, Tensor]  # stage -> (top,), NaN-padded
    effective_ranks: dict[str, float]
    samples: int
    top: int = 50
    sigma_fraction: float = 0.5
    debiased: bool = False
    loops: int | None = field(default=None)  # K; None for a vanilla layout

    @property
    def loop_pairs(self) -> list[tuple[str, str]]:
        """Consecutive loop states (h(t), h(t+1)), t = 0..K-1."""
        return [(f"h{t}", f"h{t + 1}") for t in range(self.loops or 0)]

    def cka(self, a: str, b: str, kind: str = "rbf") -> float:
        matrix = self.cka_rbf if kind == "rbf" else self.cka_linear
        return matrix[self.stages.index(a), self.stages.index(b)].item()

    def last_singular_value(self, stage: str) -> float:
        """The ``top``-th normalised singular value, or the last one the stage has."""
        values = self.spectra[stage]
        values = values[~values.isnan()]
        return values[-1].item() if len(values) else float("nan")

    def as_metrics(self) -> dict[str, float]:
        """Flat MLflow metric names: ``probe/update/<block>/{mean,std}``, ``probe/cka_{rbf,linear}/<a>/<b>``
        (upper triangle), ``probe/erank/<stage>``, ``probe/sv<top>/<stage>``; for looped layouts also
        ``probe/cka_{rbf,linear}/loop_mean`` (mean CKA of h(t), h(t+1)) and ``probe/update/core_balance``
        (min / max of the core iterations' mean updates, 1 = balanced)."""
        metrics: dict[str, float] = {"probe/samples": float(self.samples)}
        for block, (mean, std) in self.updates.items():
            metrics[f"probe/update/{block}/mean"] = mean
            metrics[f"probe/update/{block}/std"] = std
        for kind in ("rbf", "linear"):
            for i, a in enumerate(self.stages):
                for b in self.stages[i + 1 :]:
                    metrics[f"probe/cka_{kind}/{a}/{b}"] = self.cka(a, b, kind)
            if self.loops:
                pairs = [self.cka(a, b, kind) for a, b in self.loop_pairs]
                metrics[f"probe/cka_{kind}/loop_mean"] = sum(pairs) / len(pairs)
        for stage in self.stages:
            metrics[f"probe/erank/{stage}"] = self.effective_ranks[stage]
            metrics[f"probe/sv{self.top}/{stage}"] = self.last_singular_value(stage)
        if self.loops:
            cores = [self.updates[f"core{t}"][0] for t in range(1, self.loops + 1)]
            metrics["probe/update/core_balance"] = min(cores) / max(cores) if max(cores) > 0 else 1.0
        return metrics


@torch.no_grad()
def probe_report(
    model: nn.Module,
    batches: Iterable[Tensor],
    top: int = 50,
    sigma_fraction: float = 0.5,
    debiased: bool = False,
) -> ProbeReport:
    """Run ``model`` (eval mode, no grad) on each batch of input ids and collect all three probes.

    Per-sample values are gathered batch by batch (hidden states are dropped after each batch), so
    the result is the same however the samples are split into batches. The model's training mode
    is restored afterwards.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    names: list[str] | None = None
    loops: int | None = None
    updates: dict[str, list[Tensor]] = {}
    collected: dict[str, list[Tensor]] = {"rbf": [], "linear": [], "spectra": [], "erank": []}
    try:
        for input_ids in batches:
            hidden = model(input_ids.to(device), return_hidden_states=True).hidden_states
            if hidden is None:
                raise ValueError("the model returned no hidden states (return_hidden_states=True)")
            for block, values in _per_sample_updates(hidden).items():
                updates.setdefault(block, []).append(values.cpu())
            if names is None:  # fixed by the first batch, so every batch yields the same stages
                names, loops = list(paper_stages(hidden)), _loops(hidden)
            stages = {name: hidden[name] for name in names}
            collected["rbf"].append(_per_sample_cka(stages, "rbf", sigma_fraction, debiased).cpu())
            collected["linear"].append(_per_sample_cka(stages, "linear", sigma_fraction, debiased).cpu())
            svs = [_singular_values(x) for x in stages.values()]
            collected["spectra"].append(torch.stack([_normalised_top(sv, top) for sv in svs], 1).cpu())
            collected["erank"].append(torch.stack([_entropy_rank(sv) for sv in svs], 1).cpu())
    finally:
        model.train(was_training)
    if names is None:
        raise ValueError("probe_report needs at least one batch")
    spectrum, erank, rbf, linear = (torch.cat(collected[k]).mean(0) for k in ("spectra", "erank", "rbf", "linear"))
    return ProbeReport(
        stages=names,
        updates={block: _mean_std(torch.cat(values)) for block, values in updates.items()},
        cka_rbf=rbf,
        cka_linear=linear,
        spectra={name: spectrum[i] for i, name in enumerate(names)},
        effective_ranks={name: erank[i].item() for i, name in enumerate(names)},
        samples=sum(len(v) for v in updates["prelude"]),
        top=top,
        sigma_fraction=sigma_fraction,
        debiased=debiased,
        loops=loops,
    )


__all__ = [
    "ProbeReport",
    "effective_ranks",
    "linear_cka",
    "pairwise_cka",
    "paper_stages",
    "probe_report",
    "rbf_cka",
    "relative_update",
    "spectra",
    "update_blocks",
    "update_magnitudes",
]
