"""MeSH's routers and what every scheme's loop states are made of: the open choices as settings
(defaults unchanged bit for bit, parameters counted exactly), and the state coefficients, which
reproduce the forward pass's states and give the closed forms of uniform and one-hot routing."""

from __future__ import annotations

import math

import pytest
import torch

from mesh_model import ConfigError, ModelConfig, build_model, count_parameters
from mesh_model.mesh_router import RouterOptions, own_slot, own_slot_bias
from mesh_model.schemes import MeSH, mesh_router_parameters
from mesh_model.state_coefficients import mesh_routings, reconstruct, source_names, state_coefficients

TINY = {"d_model": 32, "n_heads": 4, "vocab_size": 97, "max_seq_len": 32}


def config(scheme: str = "mesh", layout: str = "1+2R2+1", **fields) -> ModelConfig:
    return ModelConfig(layout=layout, scheme=scheme, **TINY, **fields)


def forward(model, seed: int = 0):
    ids = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids, return_hidden_states=True)


# The default model, as it was before the options existed: loss and sum of squared logits at init
# (init_seed 3, ids from seed 0), recorded with the code of commit 8c665eb. Compared to 1e-6 relative:
# another CPU's float32 kernels round the last bits differently (seen: 58.392709 against 58.392708),
# while an option that changed the computation moves them by far more (tests below).
BEFORE_OPTIONS = {"lean": (4.604713439941406, 58.392708081449015), "explicit": (4.604713439941406, 58.39270665646045)}


@pytest.mark.parametrize("buffer", ["lean", "explicit"])
def test_the_default_mesh_is_the_model_it_was_before_the_options(buffer):
    model = build_model(config(), mesh_buffer=buffer, init_seed=3)
    ids = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(ids, labels=ids)
    measured = (out.loss.item(), out.logits.double().square().sum().item())
    assert measured == pytest.approx(BEFORE_OPTIONS[buffer], rel=1e-6, abs=0)
    assert out.mesh_z is None and out.aux_loss is None


def test_default_options_leave_the_config_dict_and_so_the_hash_as_they_were():
    values = config().to_dict()
    assert not any(key.startswith("mesh_") for key in values)
    changed = config(mesh_router_norm="rmsnorm", mesh_final_read="residual").to_dict()
    assert changed["mesh_router_norm"] == "rmsnorm" and changed["mesh_final_read"] == "residual"
    assert ModelConfig(**changed) == config(mesh_router_norm="rmsnorm", mesh_final_read="residual")


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"mesh_router_init": "own_slot"},
        {"mesh_router_init": "own_slot", "mesh_router_own_weight": 0.6},
        {"mesh_router_norm": "layernorm"},
        {"mesh_router_norm": "rmsnorm"},
        {"mesh_router_temperature": 4.0},
        {"mesh_router_z_coef": 1e-3},
        {"mesh_final_read": "residual"},
    ],
)
def test_no_option_adds_a_parameter(fields):
    model = build_model(config(**fields))
    counts = count_parameters(model)
    assert counts["router"] == mesh_router_parameters(2, 32, 5) == 2 * 3 * (32 * 5 + 5)
    assert counts["total"] == count_parameters(build_model(config()))["total"]


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"mesh_router_init": "base"}, "mesh_router_init"),
        ({"mesh_router_norm": "batchnorm"}, "mesh_router_norm"),
        ({"mesh_router_temperature": 0.0}, "mesh_router_temperature"),
        ({"mesh_router_temperature": float("inf")}, "mesh_router_temperature"),
        ({"mesh_router_z_coef": -1.0}, "mesh_router_z_coef"),
        ({"mesh_final_read": "sum"}, "mesh_final_read"),
        ({"mesh_router_init": "own_slot", "mesh_router_own_weight": 1.0}, "mesh_router_own_weight"),
        ({"mesh_router_own_weight": 0.5}, "mesh_router_own_weight"),  # without own_slot
    ],
)
def test_a_bad_router_option_is_one_config_error_naming_its_field(fields, name):
    with pytest.raises(ConfigError) as error:
        config(**fields)
    assert str(error.value).startswith(name) and "\n" not in str(error.value)


def test_only_mesh_takes_router_options():
    with pytest.raises(ConfigError, match="mesh_router_norm.*only scheme=mesh has routers"):
        config(scheme="base", mesh_router_norm="rmsnorm")


SCHEMES = ["base", "residual", "anchor", "anchor_emb", "residual+anchor+anchor_emb", "0.2*core+residual", "static"]


@pytest.mark.parametrize("scheme", [*SCHEMES, "dynamic"])
@pytest.mark.parametrize("layout", ["1+2R2+1", "1+1R3+1", "1+2+2+1"])
def test_the_coefficients_reproduce_every_loop_state_of_a_fixed_or_learned_combination(scheme, layout):
    model = build_model(config(scheme, layout), init_seed=1)
    with torch.no_grad():  # move the learned coefficients off their start (static: 1, dynamic: bias 1, weight 0)
        for p in model.state_passing.parameters():
            p.add_(0.3 * torch.randn_like(p))
    out = forward(model)
    for name, c in state_coefficients(model, out.hidden_states).items():
        torch.testing.assert_close(
            reconstruct(c, out.hidden_states, out.core_outputs), out.hidden_states[name], rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("buffer", ["lean", "explicit"])
@pytest.mark.parametrize(
    "fields",
    [{}, {"mesh_final_read": "residual"}, {"mesh_router_init": "own_slot"}, {"mesh_router_norm": "rmsnorm"}],
)
@pytest.mark.parametrize("layout", ["1+2R2+1", "1+1R3+1"])
def test_the_coefficients_reproduce_mesh_s_loop_states_and_coda_input(buffer, fields, layout):
    model = build_model(config(layout=layout, **fields), mesh_buffer=buffer, init_seed=2)
    with torch.no_grad():  # routing far from uniform
        for p in model.state_passing.parameters():
            p.normal_(0, 0.5)
    out = forward(model)
    coefficients = state_coefficients(model, out.hidden_states)
    loops = model.config.loops
    assert list(coefficients) == [f"h{t}" for t in range(loops + 1)]
    for name, c in coefficients.items():
        assert c.shape == (3, 16, loops + 2)
        torch.testing.assert_close(
            reconstruct(c, out.hidden_states, out.core_outputs), out.hidden_states[name], rtol=1e-5, atol=1e-5
        )


def _set_routing(model, targets):
    """Router i: zero weights, bias 60 on slot targets[i] for both write and read: one-hot routing."""
    scheme: MeSH = model.state_passing
    with torch.no_grad():
        for i, slot in enumerate(targets):
            for router in (scheme.write_routers[i], scheme.read_routers[i]):
                router.weight.zero_()
                router.bias.zero_()
                if slot is not None:
                    router.bias[slot] = 60.0


def test_uniform_routing_is_a_residual_damped_by_one_over_b():
    model = build_model(config(), init_seed=0)
    _set_routing(model, [None, None, None])  # all logits 0
    c = state_coefficients(model, forward(model).hidden_states)
    b = 5
    torch.testing.assert_close(c["h0"][0, 0], torch.tensor([1 / b, 1 / b, 0, 0]))
    torch.testing.assert_close(c["h1"][0, 0], torch.tensor([1 / b, 1 / b, 1 / b, 0]))  # h1 = h0 + f1/B
    torch.testing.assert_close(c["h2"][0, 0], torch.tensor([1 / b] * 4))


def test_one_hot_routing_to_own_slots_is_base_and_to_one_slot_is_residual():
    mesh = build_model(config(), init_seed=0)
    _set_routing(mesh, [1, 2, 3])  # each step writes and reads its own slot: h(t+1) = f(h(t))
    base = build_model(config("base"), init_seed=0)
    mesh_c = state_coefficients(mesh, forward(mesh).hidden_states)
    base_c = state_coefficients(base, forward(base).hidden_states)
    for name in mesh_c:
        torch.testing.assert_close(mesh_c[name], base_c[name])
    assert base_c["h2"][0, 0].tolist() == [0, 0, 0, 1]

    _set_routing(mesh, [1, 1, 1])  # every step adds to slot 1 and reads it: h(t+1) = f(h(t)) + h(t)
    residual = build_model(config("residual"), init_seed=0)
    mesh_c = state_coefficients(mesh, forward(mesh).hidden_states)
    res_c = state_coefficients(residual, forward(residual).hidden_states)
    for name in mesh_c:
        torch.testing.assert_close(mesh_c[name], res_c[name])
    assert res_c["h2"][0, 0].tolist() == [0, 1, 1, 1]


def test_the_residual_final_read_adds_the_last_core_output_once():
    plain = build_model(config(), init_seed=4)
    residual = build_model(config(mesh_final_read="residual"), init_seed=4)
    residual.load_state_dict(plain.state_dict())
    a, b = (
        state_coefficients(plain, forward(plain).hidden_states),
        state_coefficients(residual, forward(residual).hidden_states),
    )
    torch.testing.assert_close(a["h1"], b["h1"])  # the first loop's state is the same read
    torch.testing.assert_close(b["h2"][..., 3] - a["h2"][..., 3], torch.ones_like(a["h2"][..., 3]))


def test_own_slot_init_puts_the_stated_weight_on_each_router_s_own_slot():
    assert own_slot_bias(0.9, 5) == pytest.approx(math.log(36))
    assert [own_slot(i, 5) for i in range(5)] == [1, 2, 3, 4, 1]
    model = build_model(config(mesh_router_init="own_slot"), init_seed=0)
    routings = mesh_routings(model, forward(model).hidden_states)
    for i, routing in enumerate(routings):
        for weights in (routing.write, routing.read):
            assert weights[..., own_slot(i, 5)].mean().item() == pytest.approx(0.9, abs=0.03)
    # so the coda input starts close to base's h(K) = f_K: 0.9 x 0.9 of it
    c = state_coefficients(model, forward(model).hidden_states)["h2"]
    assert c[..., 3].mean().item() == pytest.approx(0.81, abs=0.05)


def test_temperature_divides_the_logits_and_norms_make_routing_scale_free():
    plain = build_model(config(), init_seed=5)
    hot = build_model(config(mesh_router_temperature=4.0), init_seed=5)
    h = torch.randn(2, 7, 32)
    a, b = plain.state_passing.routing(1, h), hot.state_passing.routing(1, h)
    torch.testing.assert_close(b.logits, a.logits / 4)
    torch.testing.assert_close(b.read, torch.softmax(a.logits[..., 5:] / 4, -1))
    for norm in ("layernorm", "rmsnorm"):
        normed = build_model(config(mesh_router_norm=norm), init_seed=5)
        x, y = normed.state_passing.routing(1, h), normed.state_passing.routing(1, 25 * h)
        torch.testing.assert_close(x.read, y.read)
        assert not torch.allclose(a.read, plain.state_passing.routing(1, 25 * h).read)  # raw input: not


def test_the_router_z_loss_is_the_weighted_mean_logsumexp_squared_and_trains_the_routers():
    model = build_model(config(mesh_router_z_coef=0.01), init_seed=6)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    out = model(ids, labels=ids, return_hidden_states=True)
    routings = mesh_routings(model, out.hidden_states)
    expected = (
        0.01
        * torch.stack(
            [
                (torch.logsumexp(r.logits[..., :5], -1) ** 2 + torch.logsumexp(r.logits[..., 5:], -1) ** 2).mean()
                for r in routings
            ]
        ).mean()
    )
    torch.testing.assert_close(out.mesh_z, expected)
    torch.testing.assert_close(out.aux_loss, out.mesh_z)
    out.mesh_z.backward()
    assert model.state_passing.read_routers[0].bias.grad.abs().sum() > 0


def test_source_names_follow_the_loop():
    assert source_names(3) == ["h_emb", "prelude", "f1", "f2", "f3"]
    assert RouterOptions().changed == {}
