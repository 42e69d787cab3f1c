import math
import re
import statistics

import pytest
import torch

from experiments.probing.figures import plot_comparison, plot_report, updates_figure
from mesh_model import ModelConfig, build_model
from mesh_model.probe_names import scheme_color
from mesh_model.probes import (
    ESTIMATORS,
    _centred_gram,
    _cka_floors,
    _nonzero_median,
    cka_floors,
    cka_permutation_floor,
    effective_ranks,
    linear_cka,
    normalised_update,
    normalised_update_magnitudes,
    pairwise_cka,
    paper_stages,
    probe_report,
    rbf_cka,
    relative_update,
    row_permutations,
    spectra,
    stage_norms,
    state_update_blocks,
    state_update_magnitudes,
    token_rms_norm,
    update_blocks,
    update_magnitudes,
)

F64 = torch.float64
CKA = {
    "linear": linear_cka,
    "rbf": rbf_cka,
    "linear_debiased": lambda x, y: linear_cka(x, y, debiased=True),
    "rbf_debiased": lambda x, y: rbf_cka(x, y, debiased=True),
}


def random_orthogonal(d: int) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, dtype=F64))
    return q * torch.sign(torch.diagonal(r))


# ---------------------------------------------------------------- CKA


@pytest.mark.parametrize("kind", CKA)
def test_cka_of_a_matrix_with_itself_is_one(kind):
    x = torch.randn(3, 64, 16, dtype=F64)
    torch.testing.assert_close(CKA[kind](x, x), torch.ones(3, dtype=F64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", CKA)
def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scaling(kind):
    x = torch.randn(128, 32, dtype=F64)
    z = torch.tanh(x @ torch.randn(32, 24, dtype=F64) / 4) + 0.3 * torch.randn(128, 24, dtype=F64)
    moved = 3.7 * x @ random_orthogonal(32)
    reference = CKA[kind](x, z)
    assert 0.1 < reference < 0.99  # a dependent, non-trivial pair
    # Linear: exact algebra. RBF: distances move with the transform, and so does the median bandwidth.
    torch.testing.assert_close(CKA[kind](moved, z), reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(CKA[kind](z, moved), reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(CKA[kind](x, moved), torch.tensor(1.0, dtype=F64), rtol=0, atol=1e-6)


def null_cka(x, y, kind):
    """The plain estimator's expected value for independent x, y with exchangeable rows.

    E[HKH] = (mean diagonal - mean off-diagonal of K) H =: a H, and a = L/(L-1) x the mean diagonal of
    HKH, so E<HKxH, HKyH> = a_x a_y (L - 1) and CKA ~ a_x a_y (L - 1) / (|HKxH| |HKyH|).
    """
    length = x.shape[-2]
    grams = [_centred_gram(t, kind, 0.5) for t in (x, y)]
    a = [g.diagonal(dim1=-2, dim2=-1).mean(-1) * length / (length - 1) for g in grams]
    return a[0] * a[1] * (length - 1) / (torch.linalg.matrix_norm(grams[0]) * torch.linalg.matrix_norm(grams[1]))


def test_cka_of_independent_random_matrices_sits_at_the_estimators_null():
    length, dim = 256, 64
    x, y = torch.randn(2, 4, length, dim, dtype=F64)
    linear, rbf = linear_cka(x, y), rbf_cka(x, y)
    # Linear: E||X^T Y||^2 / (E||X^T X|| E||Y^T Y||) = D / (L + D + 1) for Gaussians, ~0.2 here,
    # so "< 0.2" would fail about half the time; the value is pinned to the closed form instead.
    assert (linear - dim / (length + dim + 1)).abs().max() < 0.02
    assert linear.max() < 0.25
    # RBF with the median rule: the Gram is mostly its diagonal (far points get kernel ~ e^-2), so the
    # plain estimator's null is high (~0.70 here); it matches the prediction above per sample.
    predicted = null_cka(x, y, "rbf")
    assert (rbf - predicted).abs().max() < 0.02
    assert rbf.max() < predicted.max() + 0.02 < 0.75
    torch.testing.assert_close(linear, null_cka(x, y, "linear"), rtol=0, atol=0.02)
    # The debiased estimator removes the floor: |CKA| within a few 1/L of 0.
    assert linear_cka(x, y, debiased=True).abs().max() < 0.05
    assert rbf_cka(x, y, debiased=True).abs().max() < 0.05
    # ... and still sees a dependence.
    dependent = torch.tanh(x @ torch.randn(dim, dim, dtype=F64) / 8)
    assert rbf_cka(x, dependent, debiased=True).min() > 0.5


def test_rbf_bandwidth_is_half_the_median_of_nonzero_distances():
    x = torch.tensor([[0.0], [0.0], [1.0], [3.0]], dtype=F64)  # distances 0, 1, 3, 1, 3, 2: median 2
    y = torch.tensor([[0.0], [1.0], [1.0], [4.0]], dtype=F64)  # distances 1, 1, 4, 0, 3, 3: median 3
    assert _nonzero_median(torch.cdist(x, x)).item() == 2.0  # the zero of the repeated point is left out
    assert _nonzero_median(torch.cdist(y, y)).item() == 3.0

    def centred_rbf(points, sigma):
        gram = torch.exp(-(torch.cdist(points, points) ** 2) / (2 * sigma**2))
        return gram - gram.mean(0) - gram.mean(1, keepdim=True) + gram.mean()

    kx, ky = centred_rbf(x, 0.5 * 2.0), centred_rbf(y, 0.5 * 3.0)
    expected = (kx * ky).sum() / (kx.norm() * ky.norm())
    torch.testing.assert_close(rbf_cka(x, y), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(pairwise_cka({"x": x, "y": y}, kind="rbf")[1][0, 1], expected, rtol=0, atol=1e-12)
    kx = centred_rbf(x, 0.8 * 2.0)
    wider = (kx * centred_rbf(y, 0.8 * 3.0)).sum() / (kx.norm() * centred_rbf(y, 0.8 * 3.0).norm())
    torch.testing.assert_close(rbf_cka(x, y, sigma_fraction=0.8), wider, rtol=0, atol=1e-12)


def test_rbf_bandwidth_option_the_default_is_half_the_median_and_one_is_the_median():
    x, y = torch.randn(2, 3, 48, 8, dtype=F64)
    stages = {"x": x, "y": y}
    assert torch.equal(rbf_cka(x, y), rbf_cka(x, y, sigma_fraction=0.5))  # the current rule, bit for bit
    assert torch.equal(pairwise_cka(stages)[1], pairwise_cka(stages, sigma_fraction=0.5)[1])
    medians = [_nonzero_median(torch.cdist(t, t)) for t in (x, y)]

    def centred_rbf(points, sigma):
        gram = torch.exp(-(torch.cdist(points, points) ** 2) / (2 * sigma[:, None, None] ** 2))
        return gram - gram.mean(-2, keepdim=True) - gram.mean(-1, keepdim=True) + gram.mean((-1, -2), keepdim=True)

    kx, ky = centred_rbf(x, medians[0]), centred_rbf(y, medians[1])
    expected = (kx * ky).sum((-1, -2)) / (torch.linalg.matrix_norm(kx) * torch.linalg.matrix_norm(ky))
    torch.testing.assert_close(rbf_cka(x, y, sigma_fraction=1.0), expected, rtol=0, atol=1e-10)
    assert (rbf_cka(x, y, sigma_fraction=1.0) - rbf_cka(x, y)).abs().min() > 1e-3  # the option changes it


# ---------------------------------------------------------------- CKA permutation floor


@pytest.mark.parametrize("kind", CKA)
def test_permutation_floor_of_a_matrix_and_itself_is_well_below_one_and_seeded(kind):
    x = torch.randn(2, 96, 16, dtype=F64)
    base, debiased = kind.removesuffix("_debiased"), kind.endswith("_debiased")
    torch.testing.assert_close(CKA[kind](x, x), torch.ones(2, dtype=F64), rtol=0, atol=1e-12)
    floor = cka_permutation_floor(x, x, base, debiased=debiased)
    assert floor.shape == (2,) and floor.max() < (0.3 if "linear" in kind else 0.8)
    assert torch.equal(cka_permutation_floor(x, x, base, debiased=debiased), floor)  # reproducible
    assert not torch.equal(cka_permutation_floor(x, x, base, debiased=debiased, seed=1), floor)
    # By hand: CKA against shuffled copies, both ways round, averaged over the same permutations.
    perms = row_permutations(96)
    assert perms.shape == (4, 96) and all(torch.equal(p.sort().values, torch.arange(96)) for p in perms)
    y = torch.tanh(x @ torch.randn(16, 12, dtype=F64))
    by_hand = torch.stack([CKA[kind](x, y[:, p]) + CKA[kind](x[:, p], y) for p in perms]).mean(0) / 2
    torch.testing.assert_close(cka_permutation_floor(x, y, base, debiased=debiased), by_hand, rtol=0, atol=1e-10)


def test_permutation_floor_matches_the_gaussian_floor_on_gaussians_and_follows_the_rank():
    """On Gaussian states a shuffle changes nothing in distribution, so both floors agree; on
    unrelated states of rank 2 the shuffle keeps the low rank and the floor falls far below the
    Gaussian one, which knows only the shape."""
    length, dim = 128, 64
    gaussian = cka_floors(length, dim)
    x, y = torch.randn(2, 4, length, dim, dtype=F64)
    for kind in ("rbf", "linear"):
        assert cka_permutation_floor(x, y, kind).mean().item() == pytest.approx(gaussian[kind], abs=0.03)
    low = torch.randn(2, 4, length, 2, dtype=F64) @ torch.randn(2, 4, 2, dim, dtype=F64)
    assert cka_permutation_floor(low[0], low[1], "linear").max() < gaussian["linear"] - 0.2


# ---------------------------------------------------------------- norms and the normalised update


def test_token_rms_norm_is_the_frobenius_norm_over_root_l():
    h = torch.tensor([[[3.0, 4.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])
    torch.testing.assert_close(token_rms_norm(h), torch.tensor([5 / math.sqrt(2), 1.0], dtype=F64))
    assert stage_norms({"h": h})["h"] == pytest.approx(((5 / math.sqrt(2) + 1) / 2, (5 / math.sqrt(2) - 1) / 2))


def test_normalised_update_known_values_and_scale_invariance():
    h = torch.randn(3, 8, 16, dtype=F64)
    f = torch.randn(3, 8, 16, dtype=F64)
    assert normalised_update(h, h).abs().max() < 1e-12
    torch.testing.assert_close(normalised_update(h, -h), torch.full((3,), 2.0, dtype=F64))
    e1, e2 = torch.zeros(1, 2, 2, dtype=F64), torch.zeros(1, 2, 2, dtype=F64)
    e1[0, 0, 0], e2[0, 1, 1] = 1.0, 1.0
    torch.testing.assert_close(normalised_update(e1, e2), torch.tensor([math.sqrt(2)], dtype=F64))
    torch.testing.assert_close(normalised_update(e1, 7 * e2), torch.tensor([math.sqrt(2)], dtype=F64))
    zero = torch.zeros(1, 2, 2, dtype=F64)
    assert normalised_update(zero, zero).item() == 0.0 and normalised_update(zero, e1).item() == 1.0
    for c in (1e-3, 0.5, 3.0, 1e4):
        torch.testing.assert_close(normalised_update(h, c * f), normalised_update(h, f), rtol=0, atol=1e-12)
        torch.testing.assert_close(normalised_update(c * h, f), normalised_update(h, f), rtol=0, atol=1e-12)
        # ... while the paper's measure moves with the scale of f(h) alone.
        assert c == 1.0 or (relative_update(h, c * f) - relative_update(h, f)).abs().min() > 1e-3
    # Equal norms: the two measures agree.
    g = f * (torch.linalg.matrix_norm(h) / torch.linalg.matrix_norm(f))[:, None, None]
    torch.testing.assert_close(normalised_update(h, g), relative_update(h, g), rtol=0, atol=1e-12)


def test_the_paper_measure_is_the_norm_ratio_and_the_normalised_update_together():
    h = torch.randn(5, 8, 16, dtype=F64)
    f = 0.7 * h + torch.randn(5, 8, 16, dtype=F64) * torch.tensor([0.1, 0.5, 1.0, 2.0, 8.0], dtype=F64)[:, None, None]
    a = token_rms_norm(f) / token_rms_norm(h)
    cos = 1 - normalised_update(h, f) ** 2 / 2
    torch.testing.assert_close(relative_update(h, f) ** 2, 4 * (a**2 + 1 - 2 * a * cos) / (1 + a) ** 2)


def test_pairwise_cka_averages_per_sample_values_and_has_unit_diagonal():
    stages = {name: torch.randn(3, 40, 8, dtype=F64) for name in ("a", "b", "c")}
    names, matrix = pairwise_cka(stages, kind="linear")
    assert names == ["a", "b", "c"]
    torch.testing.assert_close(matrix, matrix.T, rtol=0, atol=0)
    assert torch.equal(matrix.diagonal(), torch.ones(3, dtype=F64))
    torch.testing.assert_close(matrix[0, 2], linear_cka(stages["a"], stages["c"]).mean())


# ---------------------------------------------------------------- update magnitude


def test_relative_update_identity_negation_and_a_hand_value():
    h = torch.randn(4, 8, 16)
    assert torch.equal(relative_update(h, h), torch.zeros(4, dtype=F64))
    torch.testing.assert_close(relative_update(h, -h), torch.full((4,), 2.0, dtype=F64))
    # |f - h| = 2, |f| = sqrt(5), |h| = 1: 2 * 2 / (sqrt(5) + 1) = sqrt(5) - 1.
    h_in = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    h_out = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    assert relative_update(h_in, h_out).item() == pytest.approx(math.sqrt(5) - 1, abs=1e-15)
    assert relative_update(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)).item() == 0.0


def test_update_magnitudes_mean_and_population_std_per_block():
    h = torch.randn(2, 8, 4)
    f1 = torch.stack([3 * h[0], -3 * h[1]])
    # A residual step h1 = f1 + h0, then a core that does nothing (f2 = h1) and a state passing that
    # doubles its output (h2 = 2 f2); the coda negates.
    stages = {"embedding": h, "prelude": h, "h0": h, "f1": f1, "h1": f1 + h, "f2": f1 + h}
    stages |= {"h2": 2 * (f1 + h), "coda": -2 * (f1 + h)}
    assert update_blocks(stages) == {
        "prelude": ("embedding", "prelude"),
        "core1": ("h0", "f1"),
        "core2": ("h1", "f2"),
        "coda": ("h2", "coda"),
    }
    assert state_update_blocks(stages) == {"core1": ("h0", "h1"), "core2": ("h1", "h2")}
    updates = update_magnitudes(stages)
    assert updates["prelude"] == (0.0, 0.0)
    assert updates["core1"] == pytest.approx((1.5, 0.5))  # 2*2/(3+1) = 1 and 2*4/(3+1) = 2
    assert updates["core2"] == (0.0, 0.0)  # the core itself did nothing
    assert updates["coda"] == pytest.approx((2.0, 0.0))
    normed = normalised_update_magnitudes(stages)
    assert normed["prelude"] == (0.0, 0.0) and normed["core2"] == (0.0, 0.0)
    assert normed["core1"] == pytest.approx((1.0, 1.0))  # 3h: the same direction; -3h: the opposite
    assert normed["coda"] == pytest.approx((2.0, 0.0))
    assert normalised_update_magnitudes(stages, state=True)["core2"] == pytest.approx((0.0, 0.0))  # h2 = 2 h1
    states = state_update_magnitudes(stages)
    assert states["core1"] == pytest.approx((1.6, 0.4))  # h -> 4h: 2*3/5; h -> -2h: 2*3/3
    assert states["core2"] == pytest.approx((2 / 3, 0.0))  # h2 = 2 h1, whatever f did
    vanilla = {"embedding": h, "prelude": f1, "coda": f1}
    assert update_blocks(vanilla) == {"prelude": ("embedding", "prelude"), "coda": ("prelude", "coda")}
    assert state_update_blocks(vanilla) == {} and state_update_magnitudes(vanilla) == {}
    assert update_magnitudes({"embedding": h[:1], "prelude": 2 * h[:1], "coda": h[:1]})["prelude"][1] == 0.0
    with pytest.raises(ValueError, match=r"update probes need the stages \['f1', 'f2'\]"):
        update_magnitudes({k: v for k, v in stages.items() if not k.startswith("f")})


# ---------------------------------------------------------------- spectra


def matrix_with_singular_values(values, rows, cols):
    u = random_orthogonal(rows)[:, : len(values)]
    v = random_orthogonal(cols)[:, : len(values)]
    return (u * torch.tensor(values, dtype=F64)) @ v.T


def test_spectrum_and_effective_rank_of_constructed_low_rank_matrices():
    x = matrix_with_singular_values([5.0, 4.0, 3.0, 2.0, 1.0], 40, 30)
    spectrum = spectra({"x": x[None]}, top=50)["x"]
    assert spectrum.shape == (50,)
    torch.testing.assert_close(spectrum[:5], torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2], dtype=F64))
    assert spectrum[5:30].abs().max() < 1e-12  # exactly rank 5
    assert spectrum[30:].isnan().all()  # min(L, D) = 30 < 50: padded
    for rank in (1, 3, 7):
        equal = matrix_with_singular_values([2.5] * rank, 32, 16)
        assert effective_ranks({"x": equal[None]})["x"] == pytest.approx(rank, abs=1e-9)
    p = torch.tensor([4.0, 2.0, 1.0], dtype=F64) / 7
    expected = math.exp(-(p * p.log()).sum().item())
    uneven = matrix_with_singular_values([4.0, 2.0, 1.0], 20, 10)
    assert effective_ranks({"x": uneven[None]})["x"] == pytest.approx(expected, abs=1e-9)


# ---------------------------------------------------------------- the report on real models

METRIC_NAME = re.compile(r"^[A-Za-z0-9_\-. /]+$")


@pytest.fixture(scope="module")
def reports():
    torch.manual_seed(0)
    ids = torch.randint(0, 2048, (2, 32))
    out = {}
    for scheme in ("base", "mesh"):
        model = build_model(ModelConfig.from_preset("tiny", layout="1+2R3+1", scheme=scheme))
        model.train()
        out[scheme] = (model, ids, probe_report(model, [ids[:1], ids[1:]]))
    return out


@pytest.mark.parametrize("scheme", ["base", "mesh"])
def test_probe_report_on_tiny_looped_models(reports, scheme):
    model, ids, report = reports[scheme]
    assert model.training  # restored
    loops = ["h0", "h1", "h2", "h3"]
    expected = ["embedding", "prelude", *loops, "coda"] if scheme == "mesh" else ["embedding", *loops, "coda"]
    assert report.stages == expected and report.loops == 3 and report.samples == 2 and report.seq_len == 32
    assert list(report.updates) == ["prelude", "core1", "core2", "core3", "coda"]
    assert list(report.state_updates) == ["core1", "core2", "core3"]
    assert list(report.cka_matrices) == list(ESTIMATORS)
    for name, matrix in report.cka_matrices.items():
        assert matrix.shape == (len(expected), len(expected))
        torch.testing.assert_close(matrix, matrix.T, rtol=0, atol=1e-12)
        assert torch.equal(matrix.diagonal(), torch.ones(len(expected), dtype=F64))
        assert ((matrix > (-0.1 if "debiased" in name else 0)) & (matrix <= 1 + 1e-12)).all()
    assert report.cka_floors == cka_floors(32, 64)

    # The same numbers as the functions on the whole batch at once (batching does not matter).
    model.eval()
    with torch.no_grad():
        out = model(ids, return_hidden_states=True)
    model.train()
    hidden = out.hidden_states
    assert list(paper_stages(hidden)) == expected
    assert list(paper_stages({**hidden, **out.core_outputs})) == expected  # core outputs are not stages
    for block, (mean, std) in update_magnitudes({**hidden, **out.core_outputs}).items():
        assert report.updates[block] == pytest.approx((mean, std), rel=1e-9, abs=1e-12)
    for block, (mean, std) in state_update_magnitudes(hidden).items():
        assert report.state_updates[block] == pytest.approx((mean, std), rel=1e-9, abs=1e-12)
    for kind in ("rbf", "linear"):
        for debiased in (False, True):
            name = f"{kind}_debiased" if debiased else kind
            expected_matrix = pairwise_cka(paper_stages(hidden), kind, debiased=debiased)[1]
            torch.testing.assert_close(report.cka_matrices[name], expected_matrix)
    for name, values in spectra(paper_stages(hidden)).items():
        torch.testing.assert_close(report.spectra[name], values, equal_nan=True)
    assert report.effective_ranks == pytest.approx(effective_ranks(paper_stages(hidden)))
    everything = {**hidden, **out.core_outputs}
    for got, expected_values in (
        (report.norms, stage_norms(everything)),
        (report.normed_updates, normalised_update_magnitudes(everything)),
        (report.state_normed_updates, normalised_update_magnitudes(hidden, state=True)),
    ):
        assert list(got) == list(expected_values)
        for key, value in expected_values.items():
            assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    stages = paper_stages(hidden)
    for estimator in ESTIMATORS:
        kind, debiased = estimator.removesuffix("_debiased"), estimator.endswith("_debiased")
        floors = report.cka_perm_floors[estimator]
        torch.testing.assert_close(floors, floors.T, rtol=0, atol=0)
        for a, b in (("h0", "h1"), ("embedding", "coda"), ("h2", "h2")):
            # Sample i is shuffled once, by the permutation of seed i, whichever batch it came in.
            per_sample = [
                cka_permutation_floor(stages[a][i], stages[b][i], kind, debiased=debiased, shuffles=1, seed=i)
                for i in range(2)
            ]
            assert report.perm_floor(a, b, estimator) == pytest.approx(sum(per_sample).item() / 2, rel=1e-9, abs=1e-12)

    metrics = report.as_metrics()
    assert all(METRIC_NAME.match(k) for k in metrics)
    assert all(math.isfinite(v) for v in metrics.values())
    n = len(expected)
    # samples, seq_len; updates and state updates, each plain and normalised, with their balances;
    # norms in and out of the 5 blocks; per estimator: pairs, loop mean, floor, perm floor and loop
    # perm floor; erank and sv per stage, and the loop states' mean erank.
    assert len(metrics) == 2 + 2 * (2 * 5 + 1) + 2 * (2 * 3 + 1) + 2 * 5 + 4 * (n * (n - 1) // 2 + 4) + 2 * n + 1
    assert metrics["probe/update_normed/core2/mean"] == report.normed_updates["core2"][0]
    assert metrics["probe/state_update_normed/core1/std"] == report.state_normed_updates["core1"][1]
    cores = [report.normed_updates[f"core{t}"][0] for t in (1, 2, 3)]
    assert metrics["probe/update_normed/core_balance"] == pytest.approx(min(cores) / max(cores))
    # in/core<t> is the state h(t-1) entering iteration t, out/core<t> its f(h(t-1)), in/coda h(K).
    assert metrics["probe/norm/in/prelude"] == report.norms["embedding"][0]
    assert metrics["probe/norm/out/prelude"] == report.norms["prelude"][0]
    assert [metrics[f"probe/norm/in/core{t}"] for t in (1, 2, 3)] == [report.norms[f"h{t}"][0] for t in (0, 1, 2)]
    assert (
        metrics["probe/norm/out/core2"] == report.norms["f2"][0]
        and metrics["probe/norm/in/coda"] == report.norms["h3"][0]
    )
    # MeSH reads h(0) from its buffer, which changes the norm; every other scheme hands the prelude on.
    assert (metrics["probe/norm/out/prelude"] == metrics["probe/norm/in/core1"]) == (scheme != "mesh")
    for estimator in ESTIMATORS:
        pairs = [(a, b) for i, a in enumerate(report.stages) for b in report.stages[i + 1 :]]
        assert metrics[f"probe/cka_{estimator}/perm_floor"] == pytest.approx(
            sum(report.perm_floor(a, b, estimator) for a, b in pairs) / len(pairs)
        )
        assert metrics[f"probe/cka_{estimator}/loop_perm_floor"] == pytest.approx(
            sum(report.perm_floor(f"h{t}", f"h{t + 1}", estimator) for t in range(3)) / 3
        )
    assert metrics["probe/seq_len"] == 32.0
    assert metrics["probe/update/core1/mean"] == report.updates["core1"][0]
    assert metrics["probe/state_update/core2/std"] == report.state_updates["core2"][1]
    assert metrics["probe/update/coda/std"] == report.updates["coda"][1]
    assert metrics["probe/cka_rbf/h1/h2"] == report.cka("h1", "h2")
    assert metrics["probe/cka_linear/embedding/coda"] == report.cka("embedding", "coda", "linear")
    assert metrics["probe/cka_rbf_debiased/h0/h3"] == report.cka("h0", "h3", "rbf_debiased")
    assert "probe/cka_rbf/h2/h1" not in metrics  # upper triangle only
    for estimator in ESTIMATORS:
        assert metrics[f"probe/cka_{estimator}/loop_mean"] == pytest.approx(
            sum(report.cka(f"h{t}", f"h{t + 1}", estimator) for t in range(3)) / 3
        )
        assert metrics[f"probe/cka_{estimator}/floor"] == report.cka_floors[estimator]
    for prefix, updates in (("update", report.updates), ("state_update", report.state_updates)):
        cores = [updates[f"core{t}"][0] for t in (1, 2, 3)]
        assert metrics[f"probe/{prefix}/core_balance"] == pytest.approx(min(cores) / max(cores))
    # L = 32 < 50 singular values: sv50 reports the 32nd, the last one there is.
    assert metrics["probe/sv50/h1"] == report.spectra["h1"][31].item()
    assert report.spectra["h1"][32:].isnan().all()
    assert metrics["probe/erank/h3"] == report.effective_ranks["h3"]
    # h1..hK, not h0 (results.rows.aggregate reads the same mean from runs that did not log it)
    assert metrics["probe/erank/loop_mean"] == statistics.fmean(report.effective_ranks[f"h{t}"] for t in (1, 2, 3))


def test_probe_report_on_a_vanilla_layout():
    model = build_model(ModelConfig.from_preset("tiny", layout="6"))
    report = probe_report(model, [torch.randint(0, 2048, (2, 16))])
    assert report.stages == ["embedding", "prelude", "coda"] and report.loops is None
    assert list(report.updates) == ["prelude", "coda"] and report.state_updates == {}
    assert report.updates["coda"] == (0.0, 0.0)  # a vanilla layout's coda is empty
    metrics = report.as_metrics()
    assert not [k for k in metrics if "core_balance" in k or "loop_" in k or "state_update" in k]
    assert metrics["probe/norm/in/coda"] == metrics["probe/norm/out/coda"] == report.norms["prelude"][0]  # empty coda
    assert report.normed_updates["coda"] == (0.0, 0.0) and {f"probe/cka_{e}/perm_floor" for e in ESTIMATORS} <= set(
        metrics
    )
    assert metrics["probe/cka_linear/prelude/coda"] == pytest.approx(1.0)
    assert {f"probe/cka_{e}/floor" for e in ESTIMATORS} <= set(metrics)


# ---------------------------------------------------------------- the core's own update

LOOPED_SCHEMES = ["base", "residual", "anchor", "anchor_emb", "static", "dynamic", "mesh"]


def with_core(model, core):
    """``model`` with every core stack replaced by ``core(h)``: the state passing is left as it is."""
    for stack in model.cores:
        stack.forward = lambda h, rope: core(h)
    return model


@pytest.mark.parametrize("scheme", LOOPED_SCHEMES)
def test_core_update_is_the_cores_own_whatever_the_scheme(scheme):
    ids = torch.randint(0, 2048, (2, 24))
    config = ModelConfig.from_preset("tiny", layout="1+2R3+1", scheme=scheme)
    identity = probe_report(with_core(build_model(config), lambda h: h), [ids])
    for t in (1, 2, 3):
        assert identity.updates[f"core{t}"] == (0.0, 0.0), t  # f(h) = h: no update of the core's own
    if scheme in ("residual", "anchor"):  # ... while the states still move: h(t) = h(t-1) + (h(t-1) or h(0))
        assert identity.state_updates["core1"][0] == pytest.approx(2 / 3)
        assert all(identity.state_updates[f"core{t}"][0] > 0.25 for t in (1, 2, 3))  # anchor's h3 = 4 h0: 2/7
    negated = probe_report(with_core(build_model(config), lambda h: -h), [ids])
    # f(h) = -h: 2 wherever h(t-1) is not 0 (residual and anchor make h(1) = -h(0) + h(0) = 0; from
    # there on the core maps 0 to 0, which is no update).
    for t in (1,) if scheme in ("residual", "anchor") else (1, 2, 3):
        assert negated.updates[f"core{t}"] == pytest.approx((2.0, 0.0), abs=1e-12)


def test_a_row_longer_than_the_window_is_read_in_windows():
    """window=16: the model reads each 64-token row as four 16-token sequences, the rows stacked."""
    model = build_model(ModelConfig.from_preset("tiny", layout="1+2R2+1", scheme="mesh"))
    ids = torch.randint(0, 2048, (3, 64))
    report = probe_report(model, [ids], window=16)
    assert report.seq_len == 64 and report.samples == 3
    model.eval()
    with torch.no_grad():
        parts = [model(chunk, return_hidden_states=True) for chunk in ids.split(16, dim=1)]
    hidden = {name: torch.cat([p.hidden_states[name] for p in parts], 1) for name in parts[0].hidden_states}
    cores = {name: torch.cat([p.core_outputs[name] for p in parts], 1) for name in parts[0].core_outputs}
    for block, value in update_magnitudes({**hidden, **cores}).items():
        assert report.updates[block] == pytest.approx(value, rel=1e-9, abs=1e-12)
    torch.testing.assert_close(report.cka_matrices["rbf"], pairwise_cka(paper_stages(hidden))[1])
    whole = probe_report(model, [ids])  # without a window: one 64-token sequence, other numbers
    assert whole.updates["core1"] != pytest.approx(report.updates["core1"], rel=1e-6)


# ---------------------------------------------------------------- CKA floors


def test_cka_floors_are_seeded_and_sit_where_the_estimators_null_is():
    state = torch.get_rng_state()
    floors = cka_floors(128, 64)
    assert torch.equal(torch.get_rng_state(), state)  # its own generator: the global RNG is untouched
    assert list(floors) == list(ESTIMATORS)
    _cka_floors.cache_clear()
    assert cka_floors(128, 64) == floors  # recomputed, not only cached: the same numbers
    assert 0.78 < floors["rbf"] < 0.86  # the paper's estimator at 128 tokens x 64 dims (tiny)
    assert floors["linear"] == pytest.approx(64 / (128 + 64 + 1), abs=0.02)
    assert abs(floors["rbf_debiased"]) < 0.02 and abs(floors["linear_debiased"]) < 0.02
    assert cka_floors(128, 64, seed=1) != floors  # other draws
    longer = cka_floors(512, 64)
    assert longer["rbf"] < 0.6 and abs(longer["rbf_debiased"]) < 0.02  # more rows, lower floor


# ---------------------------------------------------------------- figures


def test_plots_write_png_and_svg_and_leave_no_figure_open(reports, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    single = plot_report(reports["mesh"][2], tmp_path / "mesh")
    compare = plot_comparison({label: r for label, (_, _, r) in reports.items()}, tmp_path / "compare")
    assert set(single) == set(compare) == {"updates", "cka_rbf", "cka_linear", "spectra"}
    paths = [p for group in (single, compare) for ps in group.values() for p in ps]
    assert len(paths) == 16 and len(set(paths)) == 16
    for path in paths:
        assert path.stat().st_size > 1024, path
        head = path.read_bytes()[:64]
        if path.suffix == ".png":
            assert head.startswith(b"\x89PNG\r\n\x1a\n")
        else:
            assert path.suffix == ".svg" and b"<svg" in path.read_bytes()[:2048]
    assert plt.get_fignums() == before


def test_update_figure_shows_a_real_vanilla_model_as_one_stack_in_its_schemes_colour(reports):
    from matplotlib.colors import to_hex

    vanilla = probe_report(build_model(ModelConfig.from_preset("tiny", layout="6")), [torch.randint(0, 2048, (2, 16))])
    fig = updates_figure({"vanilla 6": vanilla, "mesh 1+2R3+1": reports["mesh"][2]})
    own, state = fig.axes
    assert [t.get_text() for t in own.get_xticklabels()] == ["stack", "prelude", "core1", "core2", "core3", "coda"]
    bars = {c.get_label(): c for c in own.containers if hasattr(c, "patches")}
    assert len(bars["vanilla 6"].patches) == 1  # its stack: no prelude, no coda of 0 layers
    assert bars["vanilla 6"].patches[0].get_height() == pytest.approx(vanilla.updates["prelude"][0])
    assert len(bars["mesh 1+2R3+1"].patches) == 5
    for label, scheme in (("vanilla 6", "vanilla"), ("mesh 1+2R3+1", "mesh")):
        assert to_hex(bars[label].patches[0].get_facecolor()) == scheme_color(scheme)
    assert [h.get_label() for h in state.get_legend_handles_labels()[0]] == ["mesh 1+2R3+1"]  # no state update
