"""The state-passing equations, checked against plain re-implementations of each recurrence."""

import dataclasses

import pytest
import torch

from mesh_model import ModelConfig, build_model, schemes
from mesh_model.layers import rotary_tables

LAYOUTS = ["1+2R3+1", "0+2R2+1", "1+2+2+2+1"]


def reference_logits(model, ids, recurrence, begin=None):
    """Run ``model``'s own blocks with an explicitly written recurrence
    h(t+1) = recurrence(f(h(t)), h(t), h(0), h_emb)."""
    rope = rotary_tables(ids.shape[1], model.config.rotary_dims, model.config.rotary_base, ids.device)
    h_emb = model.embed_in(ids) * model.embedding_scale
    h_pre = model.prelude(h_emb, rope)
    h0 = begin(h_pre, h_emb) if begin else h_pre
    h = h0
    for index in model.core_schedule:
        h = recurrence(model.cores[index](h, rope), h, h0, h_emb)
    return model.embed_out(model.final_layer_norm(model.coda(h, rope)))


@pytest.fixture
def ids():
    return torch.randint(0, 2048, (2, 12))


FIXED = {
    "base": lambda f, h, h0, e: f,
    "residual": lambda f, h, h0, e: f + h,
    "anchor": lambda f, h, h0, e: f + h0,
    "anchor_emb": lambda f, h, h0, e: f + e,
    "residual+anchor": lambda f, h, h0, e: f + h + h0,
    "residual+anchor+anchor_emb": lambda f, h, h0, e: f + h + h0 + e,
    "anchor+anchor_emb": lambda f, h, h0, e: f + h0 + e,
    "0.5*core+0.25*anchor": lambda f, h, h0, e: 0.5 * f + 0.25 * h0,
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("scheme", list(FIXED))
def test_fixed_schemes_follow_their_equations(scheme, layout, ids):
    model = build_model(ModelConfig.from_preset("tiny", layout=layout, scheme=scheme))
    torch.testing.assert_close(model(ids).logits, reference_logits(model, ids, FIXED[scheme]), rtol=0, atol=0)


def test_static_combination_uses_its_per_step_scalars(ids):
    model = build_model(ModelConfig.from_preset("tiny", layout="1+2R3+1", scheme="static"))
    a = torch.tensor([[0.5, 2.0, -1.0], [1.5, 0.0, 0.25], [1.0, -0.5, 3.0]])
    with torch.no_grad():
        model.state_passing.coefficients.copy_(a)
    steps = iter(range(3))

    def recurrence(f, h, h0, e):
        t = next(steps)
        return a[t, 0] * f + a[t, 1] * h0 + a[t, 2] * e

    torch.testing.assert_close(model(ids).logits, reference_logits(model, ids, recurrence))


def test_static_and_dynamic_start_as_the_anchor_plus_anchor_emb_sum(ids):
    fixed = build_model(ModelConfig.from_preset("tiny", scheme="anchor+anchor_emb"))
    for scheme in ("static", "dynamic"):
        model = build_model(ModelConfig.from_preset("tiny", scheme=scheme))
        model.load_state_dict(fixed.state_dict(), strict=False)
        torch.testing.assert_close(model(ids).logits, fixed(ids).logits)


def test_dynamic_coefficients_are_per_token_functions_of_the_entering_state(ids):
    model = build_model(ModelConfig.from_preset("tiny", layout="1+2R2+1", scheme="dynamic"))
    torch.nn.init.normal_(model.state_passing.coefficient_routers[0].weight, std=0.3)
    torch.nn.init.normal_(model.state_passing.coefficient_routers[1].weight, std=0.3)
    routers = iter(model.state_passing.coefficient_routers)

    def recurrence(f, h, h0, e):
        a = next(routers)(h)
        return a[..., 0:1] * f + a[..., 1:2] * h0 + a[..., 2:3] * e

    torch.testing.assert_close(model(ids).logits, reference_logits(model, ids, recurrence))


# --- MeSH on constructed routers -------------------------------------------------------------
# A router with zero weights and bias 0 on a set S of slots and -1e4 elsewhere gives exactly
# 1/|S| on S and exactly 0 elsewhere (exp(-1e4) underflows to 0 in float32). With such routers
# MeSH must reproduce simpler recurrences.


def route(router, slots):
    with torch.no_grad():
        router.weight.zero_()
        router.bias.fill_(-1e4)
        router.bias[list(slots)] = 0.0


def mesh_model(layout, slots=None):
    return build_model(ModelConfig.from_preset("tiny", layout=layout, scheme="mesh", buffer_slots=slots))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mesh_reproduces_base_with_one_fresh_slot_per_step(layout, ids):
    model = mesh_model(layout)
    mesh = model.state_passing
    for index in range(model.config.loops + 1):  # write and read slot index+1 at every step
        route(mesh.write_routers[index], [index + 1])
        route(mesh.read_routers[index], [index + 1])
    torch.testing.assert_close(model(ids).logits, reference_logits(model, ids, FIXED["base"]), rtol=0, atol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mesh_reproduces_residual_by_accumulating_in_one_slot(layout, ids):
    model = mesh_model(layout)
    for router in (*model.state_passing.write_routers, *model.state_passing.read_routers):
        route(router, [1])
    torch.testing.assert_close(model(ids).logits, reference_logits(model, ids, FIXED["residual"]))


@pytest.mark.parametrize(
    ("read_also", "recurrence"),
    [
        ([1], lambda f, h, h0, e: (f + h0) / 2),  # mean anchor: h0 kept in slot 1
        ([0], lambda f, h, h0, e: (f + e) / 2),  # mean anchor*: h_emb is slot 0
        ([0, 1], lambda f, h, h0, e: (f + h0 + e) / 3),
    ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mesh_reproduces_averaged_anchors(layout, read_also, recurrence, ids):
    model = mesh_model(layout)
    mesh = model.state_passing
    route(mesh.write_routers[0], [1])
    route(mesh.read_routers[0], [1])
    for step in range(model.config.loops):
        route(mesh.write_routers[step + 1], [step + 2])
        route(mesh.read_routers[step + 1], [*read_also, step + 2])
    torch.testing.assert_close(model(ids).logits, reference_logits(model, ids, recurrence))


def test_mesh_with_one_slot_is_a_residual_stream_seeded_with_the_embedding(ids):
    model = mesh_model("1+2R3+1", slots=1)
    expected = reference_logits(model, ids, FIXED["residual"], begin=lambda h_pre, e: h_pre + e)
    torch.testing.assert_close(model(ids).logits, expected)


def test_mesh_buffer_starts_with_embedding_in_slot_zero_and_routers_see_the_entering_state(ids, monkeypatch):
    model = mesh_model("1+2R2+1")
    mesh = model.state_passing
    seen = []
    routing = schemes.route

    def recording(write, read, h, options):
        index = next(i for i, router in enumerate(mesh.write_routers) if router is write)
        assert read is mesh.read_routers[index]  # the write and read routers of the same step
        seen.append((index, h))
        return routing(write, read, h, options)

    monkeypatch.setattr(schemes, "route", recording)
    out = model(ids, return_hidden_states=True)
    stages = out.hidden_states
    assert [index for index, _ in seen] == [0, 1, 2]
    entering = [stages["prelude"], stages["h0"], stages["h1"]]  # transition routes on the prelude output
    for index, routed_on in seen:  # step t routes on h(t), the state entering it
        torch.testing.assert_close(routed_on, entering[index], rtol=0, atol=0)
    state = mesh.begin(stages["embedding"], stages["prelude"])
    buffer = mesh.buffer(state)
    assert buffer.shape == (5, 2, 12, 64)
    torch.testing.assert_close(state.h, stages["h0"])
    # Slot 0 = h_emb plus its share of the transitional write; the others hold only the write.
    w = torch.softmax(mesh.write_routers[0](stages["prelude"]), -1)
    torch.testing.assert_close(buffer[0], stages["embedding"] + w[..., 0:1] * stages["prelude"])
    torch.testing.assert_close(buffer[3], w[..., 3:4] * stages["prelude"])


def test_only_mesh_carries_more_than_the_shared_loop_state(ids):
    # final: set by the model during the pass's last core step (mesh_model/depth.py)
    assert [f.name for f in dataclasses.fields(schemes.LoopState)] == ["h", "h_emb", "h0", "final"]
    h_emb, h_prelude = torch.randn(2, 2, 12, 64).unbind(0)
    for scheme in ("base", "residual+anchor", "static", "dynamic"):
        model = build_model(ModelConfig.from_preset("tiny", scheme=scheme))
        assert type(model.state_passing.begin(h_emb, h_prelude)) is schemes.LoopState, scheme
    state = mesh_model("1+2R2+1").state_passing.begin(h_emb, h_prelude)
    assert type(state) is schemes.MeshState and len(state.written) == len(state.write_weights) == 1


def test_model_reset_reinitialises_the_scheme_parameters():
    model = build_model(ModelConfig.from_preset("tiny", scheme="dynamic"))
    with torch.no_grad():
        for p in model.state_passing.parameters():
            p.fill_(7.0)
    model.reset_parameters()  # the generic normal init, then the scheme's own (zero weights, unit biases)
    for router in model.state_passing.coefficient_routers:
        assert router.weight.abs().sum() == 0 and torch.equal(router.bias, torch.ones(3))
    schemes.StatePassing().reset_parameters()  # the base class has none, and says so without raising


@pytest.mark.parametrize("text", ["foo", "residual+foo", "mesh+anchor"])
def test_an_unknown_scheme_lists_every_name_a_run_takes_vanilla_included(text):
    from experiments.identity import model_config_for

    for build in (
        lambda: schemes.SchemeSpec.parse(text),
        lambda: ModelConfig.from_preset("tiny", scheme=text),
        lambda: model_config_for({"model": "tiny", "scheme": text, "buffer_slots": None, "layout": None}),
    ):
        with pytest.raises(schemes.ConfigError) as error:
            build()
        message = str(error.value)
        assert message.startswith(f"scheme={text!r} is invalid: ") and "\n" not in message
        for name in ("vanilla", "base", "mesh", "static", "dynamic", "residual", "anchor", "anchor_emb"):
            assert name in message, name
