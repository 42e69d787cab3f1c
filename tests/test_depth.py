"""The loop count as an axis, in the model (mesh_model/depth.py, mesh_model/stability.py):

* at its own K every scheme computes what it did before, bit for bit;
* a shared-weight model run at K' equals the model built with layout K' from the same weights
  (MeSH: routers placed by the rule, B kept), and MeSH's rules follow a hand-written recurrence;
* a layout without one shared core refuses another loop count in one line;
* the per-token exit at eps = 0 is the full pass, and with every token out after one step it is
  the K' = 1 pass; truncated backprop leaves the loss as it is and cuts the gradient;
* parameter and FLOP accounting of max_loops, shared routers, K' and truncated backprop, exact;
* the stability monitor on maps whose answer is known.
"""

from __future__ import annotations

import pytest
import torch

from mesh_model import ConfigError, ModelConfig, build_model, count_parameters, flops_per_token
from mesh_model.accounting import parameter_count
from mesh_model.depth import Depth, ExitRule, step_parameters
from mesh_model.layers import rotary_tables
from mesh_model.stability import change_ratios, loop_map, loop_stability, spectral_radius

SHARED = ("base", "anchor", "anchor_emb", "residual+anchor", "mesh", "static", "dynamic")


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, 2048, (2, 12), generator=torch.Generator().manual_seed(3))


def model_of(scheme: str, layout: str = "1+2R2+1", seed: int = 0, **overrides) -> torch.nn.Module:
    return build_model(
        ModelConfig.from_preset("tiny", layout=layout, scheme=scheme, **overrides), init_seed=seed
    ).eval()


def randomised(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter drawn again (biases, coefficients and routers too): no rule hides behind a zero."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2 + (1.0 if param.ndim == 1 else 0.0))
    return model


@pytest.mark.parametrize("scheme", SHARED)
def test_at_its_own_loop_count_a_model_computes_what_it_did(scheme, ids):
    model = model_of(scheme)
    with torch.no_grad():
        plain = model(ids).logits
        for rule in ("last", "cycle"):
            assert torch.equal(model(ids, depth=Depth(loops=2, rule=rule)).logits, plain)


def test_the_rules_pick_these_parameter_sets():
    # K = 2 trained sets (0 and 1), the last one feeding the coda
    assert [step_parameters(t, 4, 2, "last") for t in range(4)] == [0, 1, 1, 1]
    assert [step_parameters(t, 1, 2, "last") for t in range(1)] == [1]  # K' < K: the final read's routers
    assert [step_parameters(t, 5, 2, "cycle") for t in range(5)] == [0, 1, 0, 1, 0]
    assert [step_parameters(t, 1, 2, "cycle") for t in range(1)] == [0]
    assert [step_parameters(t, 3, 6, "last") for t in range(3)] == [0, 1, 5]  # routers up to a cap of 6
    assert [step_parameters(t, 3, 1, rule) for t in range(3) for rule in ("last", "cycle")] == [0] * 6  # shared


@pytest.mark.parametrize("scheme", ["base", "anchor", "anchor_emb", "residual+anchor"])
@pytest.mark.parametrize("loops", [1, 3, 5])
def test_a_shared_core_at_k_prime_is_the_model_built_with_layout_k_prime(scheme, loops, ids):
    trained = randomised(model_of(scheme))
    built = model_of(scheme, layout=f"1+2R{loops}+1")
    built.load_state_dict(trained.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(trained(ids, depth=Depth(loops=loops)).logits, built(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("rule", ["last", "cycle"])
@pytest.mark.parametrize("loops", [1, 3, 4])
def test_mesh_at_k_prime_is_the_mesh_built_with_k_prime_routers_placed_by_the_rule(rule, loops, ids):
    trained = randomised(model_of("mesh"))
    built = model_of("mesh", layout=f"1+2R{loops}+1", buffer_slots=5)  # B as trained
    state = {k: v for k, v in trained.state_dict().items() if not k.startswith("state_passing.")}
    source = trained.state_passing
    for kind in ("write_routers", "read_routers"):
        routers = [getattr(source, kind)[0]]  # the transition's own
        routers += [getattr(source, kind)[step_parameters(t, loops, 2, rule) + 1] for t in range(loops)]
        for i, router in enumerate(routers):
            state[f"state_passing.{kind}.{i}.weight"] = router.weight
            state[f"state_passing.{kind}.{i}.bias"] = router.bias
    built.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(
            trained(ids, depth=Depth(loops=loops, rule=rule)).logits, built(ids).logits, rtol=0, atol=0
        )


@pytest.mark.parametrize(("rule", "routers"), [("last", [1, 2, 2]), ("cycle", [1, 2, 1])])
def test_mesh_rules_follow_the_hand_written_buffer(rule, routers, ids):
    """K = 2 run at K' = 3: the buffer written and read by hand, the routers of each step listed."""
    model = randomised(model_of("mesh"))
    mesh = model.state_passing
    rope = rotary_tables(ids.shape[1], model.config.rotary_dims, model.config.rotary_base, ids.device)

    def route(i, h):
        return torch.softmax(mesh.write_routers[i](h), -1), torch.softmax(mesh.read_routers[i](h), -1)

    with torch.no_grad():
        h_emb = model.embed_in(ids) * model.embedding_scale
        prelude = model.prelude(h_emb, rope)
        buffer = torch.zeros(5, *h_emb.shape)
        buffer[0] = h_emb
        w, r = route(0, prelude)
        buffer = buffer + w.movedim(-1, 0).unsqueeze(-1) * prelude
        h = (buffer * r.movedim(-1, 0).unsqueeze(-1)).sum(0)
        for i in routers:
            f = model.cores[0](h, rope)
            w, r = route(i, h)
            buffer = buffer + w.movedim(-1, 0).unsqueeze(-1) * f
            h = (buffer * r.movedim(-1, 0).unsqueeze(-1)).sum(0)
        expected = model.embed_out(model.final_layer_norm(model.coda(h, rope)))
        torch.testing.assert_close(model(ids, depth=Depth(loops=3, rule=rule)).logits, expected, rtol=1e-4, atol=1e-4)
        other = "cycle" if rule == "last" else "last"  # the two rules differ at K' = 3: the check can fail
        assert (model(ids, depth=Depth(loops=3, rule=other)).logits - expected).abs().max() > 1e-2


def test_mesh_residual_final_read_acts_on_the_pass_last_step(ids):
    """final_read=residual: f(h(K'-1)) + the last read, at whatever K' the pass runs."""
    model = randomised(model_of("mesh", mesh_final_read="residual"))
    with torch.no_grad():
        out = model(ids, return_hidden_states=True, depth=Depth(loops=3))
        plain = model_of("mesh")
        plain.load_state_dict(model.state_dict())
        reads = plain(ids, return_hidden_states=True, depth=Depth(loops=3))
    torch.testing.assert_close(out.hidden_states["h2"], reads.hidden_states["h2"], rtol=0, atol=0)
    torch.testing.assert_close(out.hidden_states["h3"], reads.hidden_states["h3"] + out.core_outputs["f3"])


@pytest.mark.parametrize("layout", ["1+2+2+1", "6"])
def test_a_layout_without_one_shared_core_refuses_another_loop_count(layout, ids):
    model = model_of("base", layout=layout)
    with torch.no_grad():
        model(ids, depth=Depth(loops=2 if layout != "6" else None))  # its own K (or none) runs
    if layout == "6":
        return
    with pytest.raises(ConfigError) as error:
        model(ids, depth=Depth(loops=3))
    assert "\n" not in str(error.value) and "1+2+2+1" in str(error.value) and str(error.value).startswith("loops=3")
    with pytest.raises(ConfigError, match="max_loops"):
        ModelConfig.from_preset("tiny", layout=layout, max_loops=4)


@pytest.mark.parametrize("scheme", ["base", "anchor", "mesh", "dynamic"])
@pytest.mark.parametrize("criterion", ["state", "output"])
def test_exit_at_eps_zero_is_the_full_pass_and_with_every_token_out_it_is_one_loop(scheme, criterion, ids):
    model = randomised(model_of(scheme))
    with torch.no_grad():
        full = model(ids, labels=ids, return_logits=False)
        zero = model(ids, labels=ids, return_logits=False, depth=Depth(exit=ExitRule(criterion, 0.0)))
        assert torch.equal(zero.loss, full.loss)
        assert torch.equal(zero.loops_used, torch.full(ids.shape, 2.0))
        out = model(ids, depth=Depth(exit=ExitRule(criterion, 1e30)))  # every token stops after step 1
        assert torch.equal(out.loops_used, torch.ones(ids.shape))
        # frozen at h(1): the one-loop pass whose step runs the trained first step's parameters
        torch.testing.assert_close(out.logits, model(ids, depth=Depth(loops=1, rule="cycle")).logits, rtol=0, atol=0)


def test_exit_freezes_each_token_at_its_own_step(ids):
    model = randomised(model_of("anchor"))
    with torch.no_grad():
        states = model(ids, return_hidden_states=True, depth=Depth(loops=4)).hidden_states
        change = [(states[f"h{t + 1}"] - states[f"h{t}"]).norm(dim=-1) / states[f"h{t}"].norm(dim=-1) for t in range(4)]
        eps = change[1].median().item()  # about half the tokens stop after their second step
        out = model(ids, return_hidden_states=True, depth=Depth(loops=4, exit=ExitRule("state", eps)))
    stopped_at_1 = change[0] < eps
    expected = torch.where(stopped_at_1, 1.0, torch.where(change[1] < eps, 2.0, 0.0))
    assert torch.equal(out.loops_used[expected > 0], expected[expected > 0])
    assert (out.loops_used[expected == 0] >= 3).all()
    h2 = out.hidden_states["h2"]
    torch.testing.assert_close(h2[stopped_at_1], states["h1"][stopped_at_1], rtol=0, atol=0)  # frozen


@pytest.mark.parametrize("scheme", ["base", "anchor"])
def test_truncated_backprop_keeps_the_loss_and_cuts_the_gradient(scheme, ids):
    model = model_of(scheme, layout="1+2R3+1")
    model.train()
    full = model(ids, labels=ids, return_logits=False)
    truncated = model(ids, labels=ids, return_logits=False, depth=Depth(grad_loops=1))
    assert torch.equal(full.loss, truncated.loss)
    truncated.loss.backward()
    prelude = [p.grad for p in model.prelude.parameters()]
    reached = any(g is not None and g.abs().sum() > 0 for g in prelude)
    assert reached == (scheme == "anchor")  # h(0) enters the last step only through the anchor
    assert all(p.grad is not None for p in model.cores.parameters())


def test_parameters_of_every_new_setting_counted_exactly():
    d, b = 64, 5
    cases = {
        ("mesh", ()): 2 * 3 * (d * b + b),
        ("mesh", (("max_loops", 6),)): 2 * 7 * (d * b + b),  # 4,550: routers up to a cap of 6
        ("mesh", (("mesh_routers", "shared"),)): 2 * 2 * (d * b + b),  # 1,300 whatever the loop count
        ("static", (("max_loops", 6),)): 3 * 6,
        ("dynamic", (("max_loops", 6),)): 6 * (3 * d + 3),
        ("base", (("max_loops", 6),)): 0,
    }
    for (scheme, overrides), router in cases.items():
        config = ModelConfig.from_preset("tiny", scheme=scheme, **dict(overrides))
        model = build_model(config)
        assert count_parameters(model)["router"] == router, (scheme, overrides)
        assert parameter_count(config) == count_parameters(model)["total"], (scheme, overrides)
    assert ModelConfig.from_preset("tiny", scheme="mesh", max_loops=6).to_dict()["max_loops"] == 6
    assert "max_loops" not in ModelConfig.from_preset("tiny", scheme="mesh").to_dict()  # default: hash unchanged
    with pytest.raises(ConfigError, match="only scheme=mesh"):
        ModelConfig.from_preset("tiny", scheme="base", mesh_routers="shared")
    with pytest.raises(ConfigError, match="max_loops=1"):
        ModelConfig.from_preset("tiny", scheme="mesh", max_loops=1)


@pytest.mark.parametrize(
    ("scheme", "overrides"), [("base", {}), ("anchor", {}), ("mesh", {"buffer_slots": 5}), ("dynamic", {})]
)
def test_flops_at_k_prime_are_the_flops_of_the_model_built_at_k_prime(scheme, overrides):
    with torch.device("meta"):
        trained = build_model(ModelConfig.from_preset("tiny", scheme=scheme, max_loops=8, **overrides))
        for loops in (1, 3, 8):
            built = build_model(ModelConfig.from_preset("tiny", layout=f"1+2R{loops}+1", scheme=scheme, **overrides))
            assert flops_per_token(trained, 128, loops) == flops_per_token(built, 128), (scheme, loops)


def test_truncated_and_expected_flops_by_hand():
    d, s, b = 64, 128, 5
    core = 2 * 12 * d * d  # two blocks' matmul weights
    forward = {"base": 2 * core + 2 * 4 * s * d, "mesh": 2 * (core + 2 * d * b) + 2 * 4 * s * d}
    with torch.device("meta"):
        for scheme, step in forward.items():
            model = build_model(
                ModelConfig.from_preset("tiny", scheme=scheme, buffer_slots=5 if scheme == "mesh" else None)
            )
            full = flops_per_token(model, s)
            assert flops_per_token(model, s, 2, 1) == full - 2 * step  # one step's backward (2x forward) saved
            assert flops_per_token(model, s, 2.5, 2.0) == full + 0.5 * step  # half a forward-only step more
            assert flops_per_token(model, s, 3) - full == 3 * step


# --- the stability monitor -------------------------------------------------------------------------


def test_spectral_radius_and_change_ratios_of_linear_maps():
    a = torch.diag(torch.tensor([0.5, 0.9, -0.3], dtype=torch.float64))
    assert spectral_radius(lambda h: a @ h, torch.ones(3, dtype=torch.float64), 40) == pytest.approx(0.9, abs=1e-6)
    rotation = torch.tensor([[0.0, -0.8], [0.8, 0.0]], dtype=torch.float64)  # a complex pair of modulus 0.8
    assert spectral_radius(lambda h: rotation @ h, torch.ones(2, dtype=torch.float64), 40) == pytest.approx(
        0.8, abs=1e-6
    )
    expanding = torch.diag(torch.tensor([1.5, 0.2], dtype=torch.float64))
    assert spectral_radius(lambda h: expanding @ h + 3.0, torch.ones(2, dtype=torch.float64), 40) == pytest.approx(1.5)
    states = [torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)]
    for _ in range(60):
        states.append(a @ states[-1] + 2.0)  # an affine contraction: the steps shrink by 0.9
    assert change_ratios(states)[-1] == pytest.approx(0.9, abs=1e-6)
    assert change_ratios([torch.zeros(2), torch.ones(2), 3 * torch.ones(2)]) == [2.0]


def test_a_model_whose_loop_map_is_known(ids):
    """An identity core (zero output projections and biases): 0.5*core gives h(t+1) = h(t)/2, a
    map with Jacobian I/2; anchor gives h(t+1) = h(t) + h(0), Jacobian I, constant steps."""
    for scheme, rho in (("0.5*core", 0.5), ("anchor", 1.0)):
        model = model_of(scheme)
        with torch.no_grad():
            for block in model.cores[0]:
                for module in block.output_projections():
                    module.weight.zero_()
                    module.bias.zero_()
        numbers = loop_stability(model, ids, iterations=6)
        assert numbers["spectral_radius"] == pytest.approx(rho, rel=1e-3), scheme
        assert numbers["change_ratio"] == pytest.approx(rho, rel=1e-4), scheme
        assert numbers["change_ratio_trained"] == pytest.approx(rho, rel=1e-4), scheme


def test_the_loop_map_is_the_step_the_pass_takes(ids):
    model = randomised(model_of("mesh"))
    with torch.no_grad():
        states = model(ids, return_hidden_states=True, depth=Depth(loops=4)).hidden_states
        step, h = loop_map(model, ids, 2, 4)
        torch.testing.assert_close(h, states["h2"])
        torch.testing.assert_close(step(h), states["h3"])
        torch.testing.assert_close(step(h), states["h3"])  # the map does not change the state it holds


@pytest.mark.parametrize(
    ("scheme", "overrides"),
    [
        ("mesh", {"max_loops": 6}),
        ("mesh", {"mesh_routers": "shared"}),
        ("static", {"max_loops": 4}),
        ("dynamic", {"max_loops": 3}),
    ],
)
def test_state_coefficients_follow_the_parameter_sets_a_pass_uses(scheme, overrides, ids):
    """The routing probes read per-step parameters as the pass does: routers up to a cap or shared."""
    from mesh_model.state_coefficients import reconstruct, state_coefficients

    model = randomised(model_of(scheme, **overrides))
    with torch.no_grad():
        out = model(ids, return_hidden_states=True)
        for name, c in state_coefficients(model, out.hidden_states).items():
            rebuilt = reconstruct(c, out.hidden_states, out.core_outputs)
            torch.testing.assert_close(rebuilt, out.hidden_states[name].float(), rtol=1e-4, atol=1e-4)
