"""The fast paths compute the same function as their references: lean MeSH as the explicit
buffer (``mesh_buffer``), the fused rotary as the plain one, activation checkpointing,
torch.compile without recompiles, bf16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.testing

from mesh_model import ConfigError, ModelConfig, build_model, layers
from mesh_model.fused_rotary import FusedRotaryQKV, fused_rotary_qkv
from mesh_model.layers import rotary_qkv, rotary_tables
from mesh_model.schemes import MeSH, MeSHExplicitBuffer, MeshState


def _randomised_mesh(layout: str, slots: int, mesh_buffer: str = "lean"):
    torch.manual_seed(0)
    config = ModelConfig(layout=layout, scheme="mesh", buffer_slots=slots, vocab_size=128)
    model = build_model(config, mesh_buffer=mesh_buffer)
    for router in (*model.state_passing.write_routers, *model.state_passing.read_routers):
        torch.nn.init.normal_(router.weight, std=0.5)  # far from uniform routing
        torch.nn.init.normal_(router.bias, std=1.0)
    return model


def test_mesh_buffer_is_a_build_option_with_the_same_parameters() -> None:
    lean, explicit = (_randomised_mesh("1+2R2+1", 5, mesh_buffer) for mesh_buffer in ("lean", "explicit"))
    assert type(lean.state_passing) is MeSH and type(explicit.state_passing) is MeSHExplicitBuffer
    assert lean.config == explicit.config  # a build option, not part of the config (or a checkpoint)
    want = lean.state_dict()
    got = explicit.state_dict()
    assert list(got) == list(want)
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=0, msg=name)


def test_unknown_mesh_buffer_is_a_config_error() -> None:
    for config in (ModelConfig(scheme="mesh"), ModelConfig(layout="6")):
        with pytest.raises(ConfigError, match=r"^mesh_buffer='slots' is invalid: use lean .* or explicit .*$"):
            build_model(config, mesh_buffer="slots")


@pytest.mark.parametrize(("layout", "slots"), [("1+2R2+1", 5), ("1+1R4+1", 2), ("0+2R3+1", 1), ("1+2+2+1", 7)])
def test_lean_mesh_equals_the_explicit_buffer(layout: str, slots: int) -> None:
    ids = torch.randint(0, 128, (2, 10))
    outputs, grads = [], []
    for mesh_buffer in ("lean", "explicit"):
        model = _randomised_mesh(layout, slots, mesh_buffer)
        out = model(ids, labels=ids, return_hidden_states=True)
        outputs.append(out)
        grads.append(torch.autograd.grad(out.loss, list(model.parameters())))
    lean, explicit = outputs
    for name, h in explicit.hidden_states.items():
        torch.testing.assert_close(lean.hidden_states[name], h, rtol=1e-5, atol=1e-5, msg=name)
    torch.testing.assert_close(lean.logits, explicit.logits, rtol=1e-5, atol=1e-5)
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_lean_mesh_materialises_the_same_slots() -> None:
    lean, explicit = (_randomised_mesh("1+2R2+1", 5, mesh_buffer).state_passing for mesh_buffer in ("lean", "explicit"))
    h_emb, h_prelude = torch.randn(2, 2, 10, 64).unbind(0)
    lean_state, explicit_state = lean.begin(h_emb, h_prelude), explicit.begin(h_emb, h_prelude)
    assert type(lean_state) is MeshState
    torch.testing.assert_close(lean.buffer(lean_state), explicit.buffer(explicit_state))
    core_out = torch.randn(2, 10, 64)
    lean_state, explicit_state = lean.step(0, core_out, lean_state), explicit.step(0, core_out, explicit_state)
    torch.testing.assert_close(lean.buffer(lean_state), explicit.buffer(explicit_state))
    torch.testing.assert_close(lean_state.h, explicit_state.h)


# --- rotary: the fused Function (eager) against the reference (what torch.compile traces) ----
# head_dim 8 with rotary_pct 0, 0.25, 0.5 and 1: no rotary pairs (half == 0), the Pythia
# fraction, and every dim rotated (nothing passes through).
ROTARY_DIMS = [0, 2, 4, 8]


def _qkv(rotary_dims: int, dtype: torch.dtype = torch.float32, batch: int = 2, seq: int = 6, heads: int = 3):
    torch.manual_seed(rotary_dims)
    cos, sin = rotary_tables(seq, rotary_dims, 10000.0, torch.device("cpu"))
    qkv = torch.randn(batch, seq, heads, 3, 8, dtype=dtype, requires_grad=True)
    return qkv, cos, sin


@pytest.mark.parametrize("rotary_dims", ROTARY_DIMS)
@pytest.mark.parametrize("shape", [(2, 6, 3), (1, 1, 1), (3, 17, 2)])
def test_fused_rotary_equals_the_reference_forward_and_gradients(rotary_dims: int, shape: tuple[int, int, int]) -> None:
    qkv, cos, sin = _qkv(rotary_dims, torch.float32, *shape)
    upstream = [torch.randn(*shape, 8) for _ in range(3)]
    results = []
    for rotary in (fused_rotary_qkv, rotary_qkv):
        q, k, v = rotary(qkv, cos, sin)
        loss = sum((x * g).sum() for x, g in zip((q, k, v), upstream, strict=True))
        results.append(((q, k, v), torch.autograd.grad(loss, qkv)[0]))
    (fused, fused_grad), (reference, reference_grad) = results
    for got, want in zip(fused, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # fused multiply-add rounding
    torch.testing.assert_close(fused_grad, reference_grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rotary_dims", ROTARY_DIMS)
def test_fused_rotary_gradients_are_exact(rotary_dims: int) -> None:
    qkv, cos, sin = _qkv(rotary_dims, torch.float64)
    tables = cos.double(), sin.double()
    assert torch.autograd.gradcheck(lambda x: FusedRotaryQKV.apply(x, *tables), (qkv,))


def test_attention_runs_the_fused_rotary_in_eager_mode_only(monkeypatch) -> None:
    calls = []

    def recording(name, rotary):
        def record(*args):
            calls.append(name)
            return rotary(*args)

        return record

    monkeypatch.setattr(layers, "fused_rotary_qkv", recording("fused", fused_rotary_qkv))
    monkeypatch.setattr(layers, "rotary_qkv", recording("reference", rotary_qkv))
    attention = layers.Attention(d_model=16, n_heads=2)
    x, rope = torch.randn(2, 5, 16), rotary_tables(5, 2, 10000.0, torch.device("cpu"))
    eager = attention(x, rope)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # what Dynamo answers while tracing
    traced = attention(x, rope)
    assert calls == ["fused", "reference"]
    torch.testing.assert_close(eager, traced)


@pytest.mark.parametrize("rotary", [fused_rotary_qkv, rotary_qkv])
def test_rotary_rotates_pairs_by_position(rotary) -> None:
    cos, sin = rotary_tables(3, 2, 10000.0, torch.device("cpu"))
    qkv = torch.zeros(1, 3, 1, 3, 4)
    qkv[..., 0, 0] = 1.0  # q = e0 at every position; rotary dims (0, 1) pair up
    q, k, v = rotary(qkv, cos, sin)
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
