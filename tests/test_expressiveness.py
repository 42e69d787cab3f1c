"""What MeSH can express (mesh_model/expressiveness.py): the coefficient reading equals the model's
probes, schemes MeSH expresses exactly fit to ~0, hand-computed and brute-forced cases, and the
residual does not increase with B."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from mesh_model import ConfigError, ModelConfig, build_model
from mesh_model.expressiveness import (
    closest_routing,
    fit_table,
    pad_slot,
    routing_coefficients,
    scheme_coefficients,
)
from mesh_model.state_coefficients import state_coefficients

TINY = {"d_model": 32, "n_heads": 4, "vocab_size": 97, "max_seq_len": 32}
EXACT = 1e-8  # a squared error this small is an exact fit approached as logits grow
STEPS = 600  # Adam steps per fit here (the table: 2,000); L-BFGS polishes the best start after


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The fits are thousands of tiny ops: a second thread only adds waiting (on a busy machine, a lot)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _forward(model):
    ids = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(ids, return_hidden_states=True)


@pytest.mark.parametrize("scheme", ["base", "residual", "anchor", "anchor_emb", "residual+anchor", "0.5*anchor"])
@pytest.mark.parametrize("layout", ["1+2R2+1", "1+1R3+1"])
def test_scheme_coefficients_are_what_the_probes_read_from_the_model(scheme: str, layout: str) -> None:
    model = build_model(ModelConfig(layout=layout, scheme=scheme, **TINY), init_seed=0)
    probed = state_coefficients(model, _forward(model).hidden_states)
    target = scheme_coefficients(scheme, model.config.loops)
    for t, c in enumerate(probed.values()):
        torch.testing.assert_close(c, target[t].float().expand_as(c))


@pytest.mark.parametrize("final_read", ["read", "residual"])
def test_routing_coefficients_are_what_the_probes_read_from_a_mesh_model(final_read: str) -> None:
    """Routers with zero weights and bias = logits route every token so; the probes' coefficients of
    that model are routing_coefficients(logits)."""
    model = build_model(ModelConfig(layout="1+2R2+1", scheme="mesh", mesh_final_read=final_read, **TINY), init_seed=0)
    logits = 2.0 * torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        for kind, routers in enumerate((model.state_passing.write_routers, model.state_passing.read_routers)):
            for i, router in enumerate(routers):
                router.weight.zero_()
                router.bias.copy_(logits[kind, i])
    probed = state_coefficients(model, _forward(model).hidden_states)
    expected = routing_coefficients(logits, final_read)
    for t, c in enumerate(probed.values()):
        torch.testing.assert_close(c, expected[t].float().expand_as(c), rtol=1e-5, atol=1e-6)


def test_the_paper_s_schemes_as_matrices() -> None:
    assert scheme_coefficients("base", 2).tolist() == [[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    assert scheme_coefficients("residual", 2).tolist() == [[0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 1, 1]]
    assert scheme_coefficients("anchor", 2).tolist() == [[0, 1, 0, 0], [0, 1, 1, 0], [0, 1, 0, 1]]
    assert scheme_coefficients("anchor*", 2).tolist() == [[0, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    for learned in ("mesh", "static", "dynamic"):
        with pytest.raises(ConfigError, match="constant coefficients"):
            scheme_coefficients(learned, 2)


@pytest.mark.parametrize(("scheme", "slots"), [("base", 4), ("residual", 2), ("anchor_emb", 2)])
def test_schemes_mesh_expresses_fit_to_zero(scheme: str, slots: int) -> None:
    """base: one-hot routing to K+1 own slots (B >= K+2 with slot 0 holding h_emb); residual: every
    router writes and reads slot 1; anchor* at K = 1: prelude to slot 1, f1 and the read to slot 0."""
    loops = 1 if scheme == "anchor_emb" else 2
    fit = closest_routing(scheme_coefficients(scheme, loops), slots, starts=8, steps=STEPS)
    assert fit.squared_error < EXACT
    torch.testing.assert_close(fit.coefficients, fit.target, rtol=0, atol=1e-4)


def test_one_slot_leaves_nothing_to_choose_hand_computed() -> None:
    """B = 1: every softmax is [1], so h(i) = h_emb + prelude + f1 + .. + fi (the buffer's one slot
    sums everything). Against base at K = 2 the squared error is 1 + 2 + 3 = 6 (h_emb in every row,
    the earlier values in each row); with the residual final read f2 counts twice: 1 + 2 + 4 = 7."""
    base = scheme_coefficients("base", 2)
    fit = closest_routing(base, 1, starts=2, steps=10, polish=5)
    assert fit.coefficients.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert fit.squared_error == pytest.approx(6.0)
    assert closest_routing(base, 1, "residual", starts=2, steps=10, polish=5).squared_error == pytest.approx(7.0)


def test_base_at_k1_with_two_slots_hand_computed_and_brute_forced() -> None:
    """K = 1, B = 2, base (h(0) = prelude, h(1) = f1). Slot 0 holds h_emb, so the two values cannot
    both get a slot of their own: the best is to write the prelude into slot 0 beside h_emb and f1
    into slot 1, so h(1) = f1 exactly, and read h(0) with (a, 1 - a) from [h_emb + prelude, 0]:
    coefficients (a, a) against (0, 1), error a^2 + (1 - a)^2, least at a = 1/2: 0.5. A 41^4 grid
    over the four two-slot softmaxes (each one weight in [0, 1]) finds nothing lower."""
    target = scheme_coefficients("base", 1).numpy()
    p = np.linspace(0.0, 1.0, 41)
    w0, w1, r0, r1 = (g.ravel() for g in np.meshgrid(p, p, p, p, indexing="ij"))  # slot-0 weights

    def dot(r: np.ndarray, w: np.ndarray) -> np.ndarray:
        return r * w + (1 - r) * (1 - w)

    rows = [
        np.stack([r0, dot(r0, w0), np.zeros_like(r0)], -1),
        np.stack([r1, dot(r1, w0), dot(r1, w1)], -1),
    ]
    grid = sum(((row - target[i]) ** 2).sum(-1) for i, row in enumerate(rows)).min()
    assert grid == pytest.approx(0.5)
    fit = closest_routing(torch.from_numpy(target), 2, starts=8, steps=STEPS)
    assert fit.squared_error == pytest.approx(0.5, abs=1e-9)
    torch.testing.assert_close(fit.read[0], torch.tensor([0.5, 0.5], dtype=torch.float64), rtol=0, atol=1e-4)


def test_pad_slot_keeps_the_routing() -> None:
    logits = 3.0 * torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    padded = pad_slot(logits)
    assert padded.shape == (2, 3, 5)
    torch.testing.assert_close(routing_coefficients(padded), routing_coefficients(logits), rtol=0, atol=1e-11)


@pytest.mark.parametrize("scheme", ["base", "anchor"])
def test_residual_is_non_increasing_in_slots(scheme: str) -> None:
    rows = fit_table(
        [scheme], loops=[2], slots=[1, 2, 3, 4, 5], starts=6, steps=STEPS
    )  # each B warm-started from B - 1
    errors = [row.fit.squared_error for row in rows]
    assert [row.slots for row in rows] == [1, 2, 3, 4, 5]
    assert all(later <= earlier + 1e-10 for earlier, later in itertools.pairwise(errors))
    if scheme == "base":
        assert errors[2] > 0.1 and errors[3] < EXACT  # base needs K+2 = 4 slots (slot 0 holds h_emb)


def test_anchor_is_out_of_reach_at_k2_as_issue_49_measured() -> None:
    """Issue 49: closest fit to anchor at K = 2 has squared error 0.465, 0.419 with the residual read.
    The fit puts prelude and f1 in one slot for h(1) and cannot take f1 out of h(2) again."""
    anchor = scheme_coefficients("anchor", 2)
    assert closest_routing(anchor, 5, starts=8, steps=STEPS).squared_error == pytest.approx(0.46435, abs=1e-4)
    assert closest_routing(anchor, 5, "residual", starts=8, steps=STEPS).squared_error == pytest.approx(
        0.41859, abs=1e-4
    )
