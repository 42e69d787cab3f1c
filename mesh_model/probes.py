"""The paper's hidden-state probes: relative update magnitudes, pairwise CKA, singular-value spectra.

Every function takes hidden states shaped (..., L, D): one sample is the L x D matrix of a stage, the
L token positions are its rows (the examples of CKA). Statistics are computed in float64 without grad.

Choices, made once here:

* Update of a block (:func:`update_blocks`): the paper's 2 ||f(h) - h||_F / (||f(h)||_F + ||h||_F)
  between the block's own input and output. ``prelude`` maps ``embedding -> prelude``; core
  iteration ``core{t}`` maps its input h(t-1) to its output ``f{t}`` = f(h(t-1)) (the model's
  ``core_outputs``), before the state passing; ``coda`` maps ``h{K} -> coda`` (every scheme, MeSH
  included, hands h(K) to the coda). A vanilla layout has ``prelude`` (``embedding -> prelude``) and
  ``coda`` (``prelude -> coda``). An empty stack (0 layers) has update 0.
* State update (:func:`state_update_blocks`): the same measure between consecutive loop states,
  ``core{t}`` maps h(t-1) -> h(t), so it includes what the scheme adds to f (for ``residual``,
  h(t) = f + h(t-1), it is about 2/3 whatever f does). Logged beside the update, never instead of it.
  MeSH's transition ``prelude -> h0`` (the first buffer read) belongs to no block.
* Norms (:func:`token_rms_norm`): ||h||_F / sqrt(L) per sample, the root mean square over the L
  tokens of each token's L2 norm (independent of L, so probes of other lengths compare), mean and
  std over samples, for every stage and core output. A block's relative update moves with the
  norm change across it: MeSH's reads change the state's norm (the prelude's output has 2.5-3x
  the norm of h(0) at init on tiny), so its input and output norms are logged next to each update.
* Normalised update (:func:`normalised_update`): the paper's measure on both matrices scaled to
  unit Frobenius norm, ||f/||f|| - h/||h||||_F = sqrt(2 - 2 cos), cos the cosine between the
  flattened L x D matrices. It is invariant to rescaling either matrix by any c > 0, equals the
  paper's measure whenever ||f(h)|| = ||h||, and with a = ||f(h)|| / ||h|| it and a give the
  paper's back: r^2 = 4 (a^2 + 1 - 2 a cos) / (1 + a)^2. 0: same direction, sqrt(2): orthogonal,
  2: opposite; a zero matrix has no direction (read as the zero vector: 0 against zero, 1 against
  anything else).
* Spread over samples is the population standard deviation (ddof=0): it describes the samples,
  and one sample has std 0.
* Stages (:func:`paper_stages`, used by :func:`probe_report`): the paper's ``embedding, h0..hK, coda``
  (h_emb, h(0)..h(K), h_out), plus ``prelude`` right before ``h0`` only when it differs from ``h0``
  (MeSH reads h(0) from its buffer; every other scheme has h(0) = prelude output). Vanilla:
  ``embedding, prelude, coda``. Core outputs are not stages.
* CKA (Kornblith et al. 2019), four estimators (:data:`ESTIMATORS`): Gram matrices over the L rows,
  RBF or linear, centred with H = I - 11^T/L, CKA = <HKH, HLH>_F / (||HKH||_F ||HLH||_F) (the
  paper's, "biased"), or with the unbiased HSIC of Song et al. (2012) ("debiased"). The RBF
  bandwidth is sigma = sigma_fraction x the median of the non-zero pairwise Euclidean distances
  between rows, taken separately for each matrix (so RBF CKA is invariant to isotropic scaling).
  CKA is NaN where a centred Gram is zero.
* CKA floors (:func:`cka_floors`): the biased estimators are far above 0 for unrelated matrices
  when D is not small against L (RBF ~0.82 at L=128, D=64; ~0.54 at L=512). The floor of an
  estimator is its mean over ``FLOOR_DRAWS`` seeded draws of two independent standard Gaussian
  L x D matrices. Every stage of a model has the same shape L x D, so one floor per estimator
  serves every pair. It is a reference, not an offset: isotropic rows carry much of the bias,
  states of lower effective rank less, so a biased value near (even below) the floor need not mean
  unrelated states; the debiased estimators (floor ~0) say how related they are.
* Permutation floors (:func:`cka_permutation_floor`): CKA of one stage against another whose rows
  (tokens) are shuffled, (CKA(x, Py) + CKA(Px, y)) / 2 averaged over ``PERM_SHUFFLES`` seeded
  permutations P (:func:`row_permutations`). :func:`probe_report` shuffles each sample once, by
  its own permutation (seed ``PERM_SEED`` + the sample's index), so its floors average over as
  many shuffles as there are samples and add about 40% to a probe's time (four shuffles per
  sample doubled the CKA time). A shuffle keeps each matrix's own structure (rank, anisotropy, norms per token)
  and breaks only which token is which, so it is the value of "these states, unrelated token by
  token"; it is computed for every pair of stages (the Gaussian floor only knows the shape).
* Spectra: singular values of the raw (not centred) L x D matrix, normalised sigma_i / sigma_0,
  the first ``top`` kept and padded with NaN when min(L, D) < top. Effective rank: Roy & Vetterli
  (2007), exp of the Shannon entropy of p_i = sigma_i / sum(sigma) over all singular values.
"""

from __future__ import annotations

import functools
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

_LOOP_STAGE = re.compile(r"^h(\d+)$")
_CORE_OUTPUT = re.compile(r"^f\d+$")
ESTIMATORS = ("rbf", "rbf_debiased", "linear", "linear_debiased")  # rbf: the paper's
FLOOR_DRAWS = 8
FLOOR_SEED = 0
PERM_SHUFFLES = 4
PERM_SEED = 0


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


@torch.no_grad()
def normalised_update(h_in: Tensor, h_out: Tensor) -> Tensor:
    """||h_out / ||h_out||_F - h_in / ||h_in||_F||_F per sample (see the module docstring), (..., L, D) -> (...)."""
    return torch.linalg.matrix_norm(_unit(h_out) - _unit(h_in))


def _unit(x: Tensor) -> Tensor:
    """Each sample scaled to unit Frobenius norm; a zero sample stays zero."""
    x = _f64(x)
    norm = torch.linalg.matrix_norm(x)[..., None, None]
    return torch.where(norm > 0, x / norm.clamp_min(torch.finfo(x.dtype).tiny), 0.0)


@torch.no_grad()
def token_rms_norm(h: Tensor) -> Tensor:
    """||h||_F / sqrt(L) per sample: the RMS over the L tokens of their L2 norms, (..., L, D) -> (...)."""
    return torch.linalg.matrix_norm(_f64(h)) / h.shape[-2] ** 0.5


def update_blocks(stages: Mapping[str, Tensor]) -> dict[str, tuple[str, str]]:
    """Block name -> (its input, its output): ``core{t}`` is h{t-1} -> f{t}; see the module docstring."""
    loops = _loops(stages)
    if loops is None:
        return {"prelude": ("embedding", "prelude"), "coda": ("prelude", "coda")}
    blocks = {"prelude": ("embedding", "prelude")}
    blocks.update({f"core{t}": (f"h{t - 1}", f"f{t}") for t in range(1, loops + 1)})
    blocks["coda"] = (f"h{loops}", "coda")
    return blocks


def state_update_blocks(stages: Mapping[str, Tensor]) -> dict[str, tuple[str, str]]:
    """Core iteration -> (h{t-1}, h{t}): the state-to-state step, state passing included."""
    return {f"core{t}": (f"h{t - 1}", f"h{t}") for t in range(1, (_loops(stages) or 0) + 1)}


def _per_sample_updates(
    stages: Mapping[str, Tensor], blocks: Mapping[str, tuple[str, str]], measure: Callable = relative_update
) -> dict[str, Tensor]:
    missing = sorted({name for pair in blocks.values() for name in pair} - set(stages))
    if missing:
        raise ValueError(f"update probes need the stages {missing}: pass {{**out.hidden_states, **out.core_outputs}}")
    return {block: measure(stages[a], stages[b]).reshape(-1) for block, (a, b) in blocks.items()}


def _mean_std(values: Tensor) -> tuple[float, float]:
    return values.mean().item(), values.std(correction=0).item()


def update_magnitudes(stages: Mapping[str, Tensor]) -> dict[str, tuple[float, float]]:
    """Block -> (mean, population std) over samples of the block's own update: ``prelude``,
    ``core1``..``coreK``, ``coda`` (vanilla: ``prelude``, ``coda``). ``stages`` holds the hidden
    states and the core outputs, ``{**out.hidden_states, **out.core_outputs}``."""
    return {block: _mean_std(v) for block, v in _per_sample_updates(stages, update_blocks(stages)).items()}


def state_update_magnitudes(stages: Mapping[str, Tensor]) -> dict[str, tuple[float, float]]:
    """``core{t}`` -> (mean, population std) of the state update h(t-1) -> h(t); {} for vanilla."""
    return {block: _mean_std(v) for block, v in _per_sample_updates(stages, state_update_blocks(stages)).items()}


def normalised_update_magnitudes(stages: Mapping[str, Tensor], state: bool = False) -> dict[str, tuple[float, float]]:
    """:func:`update_magnitudes` (``state``: :func:`state_update_magnitudes`) by :func:`normalised_update`."""
    blocks = state_update_blocks(stages) if state else update_blocks(stages)
    return {block: _mean_std(v) for block, v in _per_sample_updates(stages, blocks, normalised_update).items()}


def stage_norms(stages: Mapping[str, Tensor]) -> dict[str, tuple[float, float]]:
    """Stage -> (mean, population std) over samples of :func:`token_rms_norm`."""
    return {name: _mean_std(token_rms_norm(x).reshape(-1)) for name, x in stages.items()}


# ---------------------------------------------------------------- CKA


def _estimator(kind: str, debiased: bool) -> str:
    return f"{kind}_debiased" if debiased else kind


def _kernel(x: Tensor, kind: str, sigma_fraction: float) -> Tensor:
    """(..., L, D) -> (..., L, L) uncentred Gram matrix over rows."""
    x = _f64(x)
    if kind == "linear":
        return x @ x.transpose(-1, -2)
    if kind == "rbf":
        squared = _squared_distances(x)
        sigma = sigma_fraction * _nonzero_median(squared, squared=True)
        return squared.mul_(-1 / (2 * sigma[..., None, None] ** 2)).exp_()
    raise ValueError(f"unknown CKA kind {kind!r}; use 'rbf' or 'linear'")


def _squared_distances(x: Tensor) -> Tensor:
    """(..., L, D) -> (..., L, L) squared Euclidean distances by one matmul (the probes' hot spot);
    equal rows (a repeated token in the embedding stage) are set exactly 0 apart, so the median
    leaves them out."""
    sq = (x * x).sum(-1)
    squared = (sq[..., :, None] + sq[..., None, :]).sub_(x @ x.transpose(-1, -2), alpha=2).clamp_min_(0)
    for rows, matrix in zip(x.reshape(-1, *x.shape[-2:]), squared.view(-1, *squared.shape[-2:]), strict=True):
        distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
        if len(distinct) < len(rows):
            matrix.masked_fill_(inverse[:, None] == inverse[None, :], 0.0)
        matrix.fill_diagonal_(0.0)
    return squared


def _centre(gram: Tensor, debiased: bool) -> Tensor:
    """H K H (biased) or the U-statistic form of Kornblith's reference code (Szekely & Rizzo 2014):
    zero diagonal, then inner products of these matrices are n(n-3) times the unbiased HSIC."""
    if not debiased:
        centred = gram - gram.mean(-1, keepdim=True)
        return centred.sub_(centred.mean(-2, keepdim=True))
    n = gram.shape[-1]
    if n < 4:
        raise ValueError(f"debiased CKA needs at least 4 rows (tokens), got {n}")
    gram = gram.clone()
    gram.diagonal(dim1=-2, dim2=-1).zero_()
    means = gram.sum(-2) / (n - 2)
    means = means - means.sum(-1, keepdim=True) / (2 * (n - 1))
    gram = gram - means[..., :, None] - means[..., None, :]
    gram.diagonal(dim1=-2, dim2=-1).zero_()
    return gram


def _centred_gram(x: Tensor, kind: str, sigma_fraction: float, debiased: bool = False) -> Tensor:
    """(..., L, D) -> (..., L, L) Gram matrix over rows, centred for the chosen estimator."""
    return _centre(_kernel(x, kind, sigma_fraction), debiased)


def _nonzero_median(dist: Tensor, squared: bool = False) -> Tensor:
    """Median of the non-zero off-diagonal entries of (..., L, L) distance matrices, shape (...);
    ``squared``: the matrices hold squared distances, the median is still of the distances.

    One selection (``kthvalue``) per matrix instead of a sort: zeros come first, so the median of
    the non-zero entries sits at an offset of their count. NaN where there is none (one row)."""
    rows, cols = torch.triu_indices(dist.shape[-1], dist.shape[-1], offset=1, device=dist.device)
    pairs = dist[..., rows, cols].reshape(dist.shape[:-2].numel(), len(rows))
    medians = dist.new_full((pairs.shape[0],), torch.nan)
    for i, values in enumerate(pairs):
        zeros = int((values == 0).sum())
        count = len(values) - zeros
        if count:
            middle = torch.stack([values.kthvalue(zeros + k + 1).values for k in {(count - 1) // 2, count // 2}])
            medians[i] = (middle.sqrt() if squared else middle).mean()
    return medians.reshape(dist.shape[:-2])


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
    small against L (see :func:`cka_floors`).
    """
    kx = _centred_gram(x, "rbf", sigma_fraction, debiased)
    return _cka_from_grams(kx, _centred_gram(y, "rbf", sigma_fraction, debiased))


def _cka_matrix(grams: list[Tensor], perms: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """(S, S) CKA between S centred Gram matrices of one sample, unit diagonal, and with ``perms``
    (P, L) the (S, S) permutation floors (else None): entry (i, j) is the mean over the P
    permutations of (CKA(G_i, P G_j P^T) + CKA(P G_i P^T, G_j)) / 2. Centring commutes with a
    permutation of the rows, so the centred Grams are permuted, not recomputed."""
    flat = torch.stack([g.flatten() for g in grams])
    products = flat @ flat.T
    norms = products.diagonal().sqrt()
    scale = norms[:, None] * norms[None, :]
    cka = (products / scale).fill_diagonal_(1.0)
    if perms is None:
        return cka, None
    floors = torch.zeros_like(scale)
    for perm in perms:
        for j, gram in enumerate(grams):
            floors[:, j] += flat @ gram[perm][:, perm].flatten()
    floors /= len(perms) * scale
    return cka, (floors + floors.T) / 2


def row_permutations(rows: int, shuffles: int = PERM_SHUFFLES, seed: int = PERM_SEED) -> Tensor:
    """(shuffles, rows) seeded permutations of the rows, drawn by a generator of their own."""
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(rows, generator=generator) for _ in range(shuffles)])


def _per_sample_cka(
    stages: Mapping[str, Tensor],
    sigma_fraction: float,
    estimators: Iterable[str] = ESTIMATORS,
    perms: Tensor | None = None,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Estimator -> (N, S, S) CKA matrices, and with ``perms`` (N, P, L), P permutations for each
    sample, estimator -> (N, S, S) permutation floors (else {}). One sample at a time (memory: 2 S
    Gram matrices of L x L); each kind's kernel is computed once per stage and centred for both of
    its estimators."""
    tensors = [_f64(t).reshape(-1, *t.shape[-2:]) for t in stages.values()]
    wanted = list(estimators)
    out: dict[str, list[Tensor]] = {e: [] for e in wanted}
    floors: dict[str, list[Tensor]] = {e: [] for e in wanted} if perms is not None else {}
    for i in range(tensors[0].shape[0]):
        for kind in ("rbf", "linear"):
            names = [e for e in wanted if e in (kind, f"{kind}_debiased")]
            if names:
                kernels = [_kernel(t[i], kind, sigma_fraction) for t in tensors]
                for name in names:
                    cka, floor = _cka_matrix(
                        [_centre(k, name.endswith("_debiased")) for k in kernels], None if perms is None else perms[i]
                    )
                    out[name].append(cka)
                    if floor is not None:
                        floors[name].append(floor)
    stacked = {name: torch.stack(matrices) for name, matrices in out.items()}
    return stacked, {name: torch.stack(matrices) for name, matrices in floors.items()}


def pairwise_cka(
    stages: Mapping[str, Tensor], kind: str = "rbf", sigma_fraction: float = 0.5, debiased: bool = False
) -> tuple[list[str], Tensor]:
    """CKA between every pair of the given stages (each (N, L, D)), averaged over the N samples.

    Returns the stage names and an (S, S) symmetric matrix with unit diagonal. Pass
    :func:`paper_stages` of a model's hidden states for the paper's figure.
    """
    if kind not in ("rbf", "linear"):
        raise ValueError(f"unknown CKA kind {kind!r}; use 'rbf' or 'linear'")
    name = _estimator(kind, debiased)
    with torch.no_grad():
        return list(stages), _per_sample_cka(stages, sigma_fraction, [name])[0][name].mean(0)


@torch.no_grad()
def cka_permutation_floor(
    x: Tensor,
    y: Tensor,
    kind: str = "rbf",
    sigma_fraction: float = 0.5,
    debiased: bool = False,
    shuffles: int = PERM_SHUFFLES,
    seed: int = PERM_SEED,
) -> Tensor:
    """The CKA of (..., L, D) ``x`` and ``y`` with the rows of one shuffled, per sample -> (...):
    (CKA(x, Py) + CKA(Px, y)) / 2 averaged over :func:`row_permutations` (``shuffles``, ``seed``)."""
    if kind not in ("rbf", "linear"):
        raise ValueError(f"unknown CKA kind {kind!r}; use 'rbf' or 'linear'")
    name = _estimator(kind, debiased)
    perms = row_permutations(x.shape[-2], shuffles, seed).expand(x.shape[:-2].numel(), -1, -1)
    floors = _per_sample_cka({"x": x, "y": y}, sigma_fraction, [name], perms)[1][name]
    return floors[:, 0, 1].reshape(x.shape[:-2])


def cka_floors(
    rows: int, dim: int, sigma_fraction: float = 0.5, draws: int = FLOOR_DRAWS, seed: int = FLOOR_SEED
) -> dict[str, float]:
    """Estimator -> its mean over ``draws`` pairs of independent standard Gaussian ``rows`` x ``dim``
    matrices: what CKA reads for unrelated states of the probed shape. Seeded with its own generator
    (the global RNG is left alone) and cached, so a run computes it once per shape."""
    return dict(_cka_floors(rows, dim, sigma_fraction, draws, seed))


@functools.lru_cache(maxsize=32)
@torch.no_grad()
def _cka_floors(rows: int, dim: int, sigma_fraction: float, draws: int, seed: int) -> tuple[tuple[str, float], ...]:
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(2, draws, rows, dim, generator=generator, dtype=torch.float64)
    values = [_per_sample_cka({"x": x[i], "y": y[i]}, sigma_fraction)[0] for i in range(draws)]
    return tuple((e, torch.stack([v[e][0, 0, 1] for v in values]).mean().item()) for e in ESTIMATORS)


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
    """The stages the CKA and spectra figures use: drop ``prelude`` when it equals ``h0``, and core
    outputs ``f{t}`` if the mapping has them."""
    kept = {name: x for name, x in stages.items() if not _CORE_OUTPUT.match(name)}
    if "h0" in kept and "prelude" in kept and torch.equal(kept["prelude"], kept["h0"]):
        return {name: x for name, x in kept.items() if name != "prelude"}
    return kept


def _balance(updates: Mapping[str, tuple[float, float]], loops: int) -> float | None:
    """min / max of the core iterations' mean updates (1 = balanced); None without all of them."""
    cores = [updates[f"core{t}"][0] for t in range(1, loops + 1) if f"core{t}" in updates]
    if len(cores) != loops or not cores:
        return None
    return min(cores) / max(cores) if max(cores) > 0 else 1.0


@dataclass
class ProbeReport:
    """All three probes over a fixed set of held-out samples (means over samples)."""

    stages: list[str]  # order of the CKA matrices, see paper_stages
    updates: dict[str, tuple[float, float]]  # block -> (mean, population std) of its own update
    state_updates: dict[str, tuple[float, float]]  # core{t} -> the same of h(t-1) -> h(t)
    cka_matrices: dict[str, Tensor]  # estimator (ESTIMATORS) -> (S, S)
    cka_floors: dict[str, float]  # estimator -> its value for unrelated L x D matrices
    spectra: dict[str, Tensor]  # stage -> (top,), NaN-padded
    effective_ranks: dict[str, float]
    samples: int
    top: int = 50
    sigma_fraction: float = 0.5
    loops: int | None = field(default=None)  # K; None for a vanilla layout
    seq_len: int | None = None  # L, the rows (tokens) of every probed matrix
    # Empty in reports read from files written before they were measured:
    norms: dict[str, tuple[float, float]] = field(default_factory=dict)  # stage or f{t} -> token_rms_norm
    normed_updates: dict[str, tuple[float, float]] = field(default_factory=dict)  # block -> normalised_update
    state_normed_updates: dict[str, tuple[float, float]] = field(default_factory=dict)  # core{t} -> the same
    cka_perm_floors: dict[str, Tensor] = field(default_factory=dict)  # estimator -> (S, S) permutation floors

    @property
    def loop_pairs(self) -> list[tuple[str, str]]:
        """Consecutive loop states (h(t), h(t+1)), t = 0..K-1."""
        return [(f"h{t}", f"h{t + 1}") for t in range(self.loops or 0)]

    def cka(self, a: str, b: str, estimator: str = "rbf") -> float:
        """CKA of stages ``a`` and ``b`` by ``estimator`` (one of :data:`ESTIMATORS`)."""
        return self.cka_matrices[estimator][self.stages.index(a), self.stages.index(b)].item()

    def loop_mean(self, estimator: str = "rbf") -> float:
        """Mean CKA of consecutive loop states h(t), h(t+1); NaN for a vanilla layout."""
        pairs = [self.cka(a, b, estimator) for a, b in self.loop_pairs]
        return sum(pairs) / len(pairs) if pairs else float("nan")

    def loop_erank(self) -> float:
        """Mean effective rank of the loop states h1..hK (the claim that MeSH keeps them flatter than
        base reads it); NaN for a vanilla layout or without all of them."""
        states = [f"h{t}" for t in range(1, (self.loops or 0) + 1)]
        if not states or not all(s in self.effective_ranks for s in states):
            return float("nan")
        return statistics.fmean(self.effective_ranks[s] for s in states)

    def perm_floor(self, a: str, b: str, estimator: str = "rbf") -> float:
        """The permutation floor of stages ``a`` and ``b`` by ``estimator``."""
        return self.cka_perm_floors[estimator][self.stages.index(a), self.stages.index(b)].item()

    def last_singular_value(self, stage: str) -> float:
        """The ``top``-th normalised singular value, or the last one the stage has."""
        values = self.spectra[stage]
        values = values[~values.isnan()]
        return values[-1].item() if len(values) else float("nan")

    def as_metrics(self) -> dict[str, float]:
        """Flat MLflow metric names (``<est>`` is each of :data:`ESTIMATORS`: ``rbf`` (the paper's),
        ``rbf_debiased``, ``linear``, ``linear_debiased``):

        * ``probe/samples``; ``probe/seq_len`` (L, when known);
        * ``probe/update/<block>/{mean,std}``, block = ``prelude``, ``core1``..``coreK``, ``coda``:
          the block's own update, core update f(h) vs h;
        * ``probe/state_update/core<t>/{mean,std}``: the state update h(t-1) -> h(t);
        * ``probe/update/core_balance``, ``probe/state_update/core_balance``: min / max of the core
          iterations' mean (state) updates, 1 = balanced (looped layouts);
        * ``probe/update_normed/<block>/{mean,std}``, ``probe/state_update_normed/core<t>/{mean,std}``
          and their ``core_balance``: the same by :func:`normalised_update` (scale-invariant);
        * ``probe/norm/in/<block>``, ``probe/norm/out/<block>``: mean :func:`token_rms_norm` of the
          block's input and output (``in/core<t>`` is the state h(t-1) entering iteration t,
          ``out/core<t>`` is f(h(t-1)), ``in/coda`` is h(K));
        * ``probe/cka_<est>/<a>/<b>`` for every pair of stages (upper triangle), ``probe/cka_<est>/loop_mean``
          (mean CKA of h(t), h(t+1); looped layouts) and ``probe/cka_<est>/floor`` (the estimator on
          unrelated L x D Gaussian matrices);
        * ``probe/cka_<est>/perm_floor``: the mean permutation floor over every pair of distinct
          stages, and ``probe/cka_<est>/loop_perm_floor`` over the pairs h(t), h(t+1) (looped), to
          read beside ``loop_mean``;
        * ``probe/erank/<stage>`` and ``probe/sv<top>/<stage>`` (the ``top``-th normalised singular value),
          ``probe/erank/loop_mean`` (:meth:`loop_erank`; looped layouts).
        """
        metrics: dict[str, float] = {"probe/samples": float(self.samples)}
        if self.seq_len is not None:
            metrics["probe/seq_len"] = float(self.seq_len)
        groups = {
            "update": self.updates,
            "state_update": self.state_updates,
            "update_normed": self.normed_updates,
            "state_update_normed": self.state_normed_updates,
        }
        for prefix, updates in groups.items():
            for block, (mean, std) in updates.items():
                metrics[f"probe/{prefix}/{block}/mean"] = mean
                metrics[f"probe/{prefix}/{block}/std"] = std
            balance = _balance(updates, self.loops or 0)
            if balance is not None:
                metrics[f"probe/{prefix}/core_balance"] = balance
        if self.norms:
            for block, (a, b) in update_blocks(self.norms).items():
                metrics[f"probe/norm/in/{block}"] = self.norms[a][0]
                metrics[f"probe/norm/out/{block}"] = self.norms[b][0]
        for estimator in self.cka_matrices:
            for i, a in enumerate(self.stages):
                for b in self.stages[i + 1 :]:
                    metrics[f"probe/cka_{estimator}/{a}/{b}"] = self.cka(a, b, estimator)
            if self.loops:
                metrics[f"probe/cka_{estimator}/loop_mean"] = self.loop_mean(estimator)
        for estimator, floor in self.cka_floors.items():
            metrics[f"probe/cka_{estimator}/floor"] = floor
        pairs = [(a, b) for i, a in enumerate(self.stages) for b in self.stages[i + 1 :]]
        for estimator in self.cka_perm_floors:
            floors = [self.perm_floor(a, b, estimator) for a, b in pairs]
            metrics[f"probe/cka_{estimator}/perm_floor"] = sum(floors) / len(floors)
            if self.loops:
                loop = [self.perm_floor(a, b, estimator) for a, b in self.loop_pairs]
                metrics[f"probe/cka_{estimator}/loop_perm_floor"] = sum(loop) / len(loop)
        for stage in self.stages:
            metrics[f"probe/erank/{stage}"] = self.effective_ranks[stage]
            metrics[f"probe/sv{self.top}/{stage}"] = self.last_singular_value(stage)
        if self.loops:
            metrics["probe/erank/loop_mean"] = self.loop_erank()
        return metrics


def _hidden(model: nn.Module, input_ids: Tensor, window: int | None) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Hidden states and core outputs of (N, P) ids, the model reading each row in consecutive
    windows of at most ``window`` tokens (None: whole), joined back along the rows."""
    parts = [model(chunk, return_hidden_states=True) for chunk in input_ids.split(window or input_ids.shape[1], 1)]
    if parts[0].hidden_states is None:
        raise ValueError("the model returned no hidden states (return_hidden_states=True)")

    def joined(key: str) -> dict[str, Tensor]:
        named = [getattr(p, key) or {} for p in parts]
        return {name: torch.cat([n[name] for n in named], dim=-2) for name in named[0]}

    return joined("hidden_states"), joined("core_outputs")


class _Collected:
    """Per-sample values of every batch, concatenated at the end (so batching does not matter)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, list[Tensor]]] = {}

    def add(self, group: str, values: Mapping[str, Tensor]) -> None:
        for key, value in values.items():
            self.values.setdefault(group, {}).setdefault(key, []).append(value.cpu())

    def get(self, group: str) -> dict[str, Tensor]:
        return {key: torch.cat(parts) for key, parts in self.values.get(group, {}).items()}


@torch.no_grad()
def probe_report(
    model: nn.Module,
    batches: Iterable[Tensor],
    top: int = 50,
    sigma_fraction: float = 0.5,
    window: int | None = None,
) -> ProbeReport:
    """Run ``model`` (eval mode, no grad) on each batch of input ids and collect all three probes.

    Each row of a batch is one sample. ``window`` (e.g. the training length) makes the model read a
    row in consecutive windows of at most that many tokens, so a sample longer than the model was
    trained on stacks the rows of several sequences instead of asking about unseen positions.
    Per-sample values are gathered batch by batch (hidden states are dropped after each batch), so
    the result is the same however the samples are split into batches. The model's training mode
    is restored afterwards.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    names: list[str] | None = None
    loops: int | None = None
    shape: tuple[int, int] = (0, 0)
    samples = 0
    collected = _Collected()
    try:
        for input_ids in batches:
            hidden, cores = _hidden(model, input_ids.to(device), window)
            everything = {**hidden, **cores}
            for group, (stages, blocks) in {
                "updates": (everything, update_blocks(hidden)),
                "state_updates": (hidden, state_update_blocks(hidden)),
            }.items():
                collected.add(group, _per_sample_updates(stages, blocks))
                collected.add(f"{group}_normed", _per_sample_updates(stages, blocks, normalised_update))
            collected.add("norms", {name: token_rms_norm(x).reshape(-1) for name, x in everything.items()})
            if names is None:  # fixed by the first batch, so every batch yields the same stages
                names, loops, shape = list(paper_stages(hidden)), _loops(hidden), tuple(hidden["embedding"].shape[-2:])
            stages = {name: hidden[name] for name in names}
            count = hidden["embedding"].shape[:-2].numel()
            perms = torch.stack([row_permutations(shape[0], 1, PERM_SEED + samples + i) for i in range(count)])
            samples += count
            cka, floors = _per_sample_cka(stages, sigma_fraction, perms=perms)
            collected.add("cka", cka)
            collected.add("cka_perm_floors", floors)
            svs = [_singular_values(x) for x in stages.values()]
            collected.add("spectra", {"top": torch.stack([_normalised_top(sv, top) for sv in svs], 1)})
            collected.add("spectra", {"erank": torch.stack([_entropy_rank(sv) for sv in svs], 1)})
    finally:
        model.train(was_training)
    if names is None:
        raise ValueError("probe_report needs at least one batch")
    updates = collected.get("updates")
    spectrum = {key: values.mean(0) for key, values in collected.get("spectra").items()}

    def mean_std(group: str) -> dict[str, tuple[float, float]]:
        return {key: _mean_std(values) for key, values in collected.get(group).items()}

    return ProbeReport(
        stages=names,
        updates=mean_std("updates"),
        state_updates=mean_std("state_updates"),
        cka_matrices={e: values.mean(0) for e, values in collected.get("cka").items()},
        cka_floors=cka_floors(shape[0], shape[1], sigma_fraction),
        spectra={name: spectrum["top"][i] for i, name in enumerate(names)},
        effective_ranks={name: spectrum["erank"][i].item() for i, name in enumerate(names)},
        samples=len(updates["prelude"]),
        top=top,
        sigma_fraction=sigma_fraction,
        loops=loops,
        seq_len=shape[0],
        norms=mean_std("norms"),
        normed_updates=mean_std("updates_normed"),
        state_normed_updates=mean_std("state_updates_normed"),
        cka_perm_floors={e: values.mean(0) for e, values in collected.get("cka_perm_floors").items()},
    )


__all__ = [
    "ESTIMATORS",
    "ProbeReport",
    "cka_floors",
    "cka_permutation_floor",
    "effective_ranks",
    "linear_cka",
    "normalised_update",
    "normalised_update_magnitudes",
    "pairwise_cka",
    "paper_stages",
    "probe_report",
    "rbf_cka",
    "relative_update",
    "row_permutations",
    "spectra",
    "stage_norms",
    "state_update_blocks",
    "state_update_magnitudes",
    "token_rms_norm",
    "update_blocks",
    "update_magnitudes",
]
