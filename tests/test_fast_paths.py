"""The fast paths compute the same function: lean MeSH, the rotary Function, activation
checkpointing, torch.compile without recompiles, bf16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing

from mesh_model import ModelConfig, build_model
from mesh_model.layers import RotaryQKV, rotary_qkv_functional, rotary_tables
from mesh_model.schemes import MeSH, MeSHExplicitBuffer


def _randomised_mesh(layout: str, slots: int):
    torch.manual_seed(0)
    model = build_model(ModelConfig(layout=layout, scheme="mesh", buffer_slots=slots, vocab_size=128))
    for router in (*model.state_passing.write_routers, *model.state_passing.read_routers):
        torch.nn.init.normal_(router.weight, std=0.5)  # far from uniform routing
        torch.nn.init.normal_(router.bias, std=1.0)
    return model


@pytest.mark.parametrize(("layout", "slots"), [("1+2R2+1", 5), ("1+1R4+1", 2), ("0+2R3+1", 1), ("1+2+2+1", 7)])
def test_lean_mesh_equals_the_explicit_buffer(layout: str, slots: int) -> None:
    model = _randomised_mesh(layout, slots)
    ids = torch.randint(0, 128, (2, 10))
    lean = model(ids, labels=ids, return_hidden_states=True)
    lean_grads = torch.autograd.grad(lean.loss, list(model.parameters()))
    explicit_passing = MeSHExplicitBuffer(model.config.parsed_layout.loops, 64, slots, 0.02)
    explicit_passing.load_state_dict(model.state_passing.state_dict())
    assert isinstance(model.state_passing, MeSH)
    model.state_passing = explicit_passing
    explicit = model(ids, labels=ids, return_hidden_states=True)
    explicit_grads = torch.autograd.grad(explicit.loss, list(model.parameters()))
    for name, h in explicit.hidden_states.items():
        torch.testing.assert_close(lean.hidden_states[name], h, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(lean.logits, explicit.logits, rtol=1e-5, atol=1e-5)
    for got, want in zip(lean_grads, explicit_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_lean_mesh_materialises_the_same_slots() -> None:
    model = _randomised_mesh("1+2R2+1", 5)
    ids = torch.randint(0, 128, (2, 10))
    stages = model(ids, return_hidden_states=True).hidden_states
    explicit = MeSHExplicitBuffer(2, 64, 5, 0.02)
    explicit.load_state_dict(model.state_passing.state_dict())
    lean_state = model.state_passing.begin(stages["embedding"], stages["prelude"])
    explicit_state = explicit.begin(stages["embedding"], stages["prelude"])
    torch.testing.assert_close(model.state_passing.buffer(lean_state), explicit.buffer(explicit_state))


def test_rotary_function_gradients_are_exact() -> None:
    torch.manual_seed(0)
    cos, sin = rotary_tables(6, 4, 10000.0, torch.device("cpu"))
    qkv = torch.randn(2, 6, 3, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: RotaryQKV.apply(x, cos.double(), sin.double()), (qkv,))


def test_rotary_function_equals_its_functional_form() -> None:
    torch.manual_seed(0)
    cos, sin = rotary_tables(6, 4, 10000.0, torch.device("cpu"))
    qkv = torch.randn(2, 6, 3, 3, 8)
    for got, want in zip(RotaryQKV.apply(qkv, cos, sin).unbind(3), rotary_qkv_functional(qkv, cos, sin), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # fused multiply-add rounding


def test_rotary_rotates_pairs_by_position() -> None:
    cos, sin = rotary_tables(3, 2, 10000.0, torch.device("cpu"))
    qkv = torch.zeros(1, 3, 1, 3, 4)
    qkv[..., 0, 0] = 1.0  # q = e0 at every position; rotary dims (0, 1) pair up
    q, k, v = RotaryQKV.apply(qkv, cos, sin).unbind(3)
    positions = torch.arange(3.0)
    torch.testing.assert_close(q[0, :, 0, 0], positions.cos())
    torch.testing.assert_close(q[0, :, 0, 1], positions.sin())
    assert q[..., 2:].abs().sum() == 0 and k.abs().sum() == 0 and v.abs().sum() == 0


@pytest.mark.parametrize("scheme", ["base", "mesh", "dynamic"])
def test_activation_checkpointing_gives_the_same_gradients(scheme: str) -> None:
    torch.manual_seed(0)
    config = ModelConfig(layout="1+2R3+1", scheme=scheme, vocab_size=128)
    plain, checkpointed = build_model(config), build_model(config, activation_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 128, (2, 16))
    grads = [
        torch.autograd.grad(m(ids, labels=ids, return_logits=False).loss, list(m.parameters()))
        for m in (plain, checkpointed)
    ]
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_compiled_loop_has_no_graph_breaks_or_recompiles() -> None:
    torch._dynamo.reset()
    model = build_model(ModelConfig(layout="1+2R3+1", scheme="mesh", vocab_size=128))
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for _ in range(3):
        ids = torch.randint(0, 128, (2, 16))
        compiled(ids, labels=ids, return_logits=False).loss.backward()
    assert counter.frame_count == 1  # one graph for the whole looped forward, compiled once
    torch._dynamo.reset()


def test_bf16_autocast_trains_with_the_fused_loss() -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(scheme="mesh", vocab_size=128))
    ids = torch.randint(0, 128, (2, 16))
    reference = model(ids, labels=ids, return_logits=False).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids, return_logits=False)
    assert out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, reference, rtol=2e-2, atol=2e-2)
    out.loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
