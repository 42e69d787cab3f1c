"""The mixture-of-experts feed-forward: routing, gates, grouped computation, router losses over
loop iterations, routing statistics, accounting, presets and bad input."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F

import mesh_model.moe as moe_module
from mesh_model import ConfigError, ModelConfig, build_model, count_parameters, flops_per_token
from mesh_model.__main__ import main as model_cli
from mesh_model.accounting import estimate_step_memory, parameter_count
from mesh_model.layers import MLP
from mesh_model.moe import MoE, RouterCall, combine, grouped_mm_available, jaccard

PATHS = ["grouped", "loop"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Run a test on the grouped matmul and again on the per-expert loop (the fallback)."""
    if request.param == "grouped" and not grouped_mm_available("cpu", torch.float32):
        pytest.skip("torch._grouped_mm does not run on this CPU build")
    if request.param == "loop":
        monkeypatch.setattr(moe_module, "grouped_mm_available", lambda *args: False)
    return request.param


def moe_layer(d=16, hidden=8, experts=4, top_k=2, seed=0) -> MoE:
    torch.manual_seed(seed)
    layer = MoE(d, hidden, experts, top_k)
    for parameter in layer.parameters():
        torch.nn.init.normal_(parameter, std=0.5)
    return layer


def reference(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token: the softmax router's top-k experts, each weighted by its probability."""
    rows = []
    for token in x.reshape(-1, x.shape[-1]):
        probs = torch.softmax(layer.router(token).float(), -1)
        gates, chosen = probs.topk(layer.top_k)
        out = 0
        for gate, e in zip(gates, chosen.tolist(), strict=True):
            up, down = layer.dense_h_to_4h, layer.dense_4h_to_h
            out = out + gate * F.linear(F.gelu(F.linear(token, up.weight[e], up.bias[e])), down.weight[e], down.bias[e])
        rows.append(out)
    return torch.stack(rows).view_as(x)


# --- the layer ------------------------------------------------------------------------------


def test_one_expert_top_1_is_the_dense_mlp_forward_and_backward(path):
    torch.manual_seed(0)
    mlp, layer = MLP(16, 64), MoE(16, 64, experts=1, top_k=1)
    with torch.no_grad():
        layer.dense_h_to_4h.weight[0].copy_(mlp.dense_h_to_4h.weight)
        layer.dense_h_to_4h.bias[0].copy_(mlp.dense_h_to_4h.bias)
        layer.dense_4h_to_h.weight[0].copy_(mlp.dense_4h_to_h.weight)
        layer.dense_4h_to_h.bias[0].copy_(mlp.dense_4h_to_h.bias)
    x = torch.randn(3, 7, 16, requires_grad=True)
    dense, (moe, call) = mlp(x), layer(x)
    torch.testing.assert_close(moe, dense, rtol=1e-6, atol=1e-6)
    grad = torch.randn_like(dense)
    dense_grads = torch.autograd.grad(dense, [x, *mlp.parameters()], grad)
    moe_grads = torch.autograd.grad(moe, [x, *layer.parameters()], grad, allow_unused=True)
    x_grad, router_grad, *expert_grads = moe_grads
    torch.testing.assert_close(x_grad, dense_grads[0], rtol=1e-6, atol=1e-6)
    for got, want in zip(expert_grads, [dense_grads[1], dense_grads[2], dense_grads[3], dense_grads[4]], strict=True):
        torch.testing.assert_close(got[0], want, rtol=1e-6, atol=1e-6)
    assert router_grad is None or not router_grad.any()  # softmax over one expert is constant 1
    assert call.load.tolist() == [1.0] and call.balance.item() == pytest.approx(1.0)


def test_a_model_with_one_expert_equals_the_dense_model():
    dense_config = ModelConfig.from_preset("tiny", layout="1+2R2+1", scheme="mesh")
    dense = build_model(dense_config)
    moe = build_model(dense_config.replace(moe_experts=1, moe_top_k=1))
    moe_state = moe.state_dict()
    for name, tensor in dense.state_dict().items():  # the same names; an expert's have an E=1 axis
        moe_state[name].copy_(tensor.view_as(moe_state[name]))
    ids = torch.randint(0, dense_config.vocab_size, (2, 12))
    torch.testing.assert_close(moe(ids, labels=ids).loss, dense(ids, labels=ids).loss, rtol=1e-6, atol=1e-6)


def test_every_token_reaches_exactly_top_k_experts_weighted_by_its_unnormalised_probabilities(path):
    """Expert e outputs the unit vector e (zero weights, down bias = e_e), so a token's output
    lists the gate of each expert it reached."""
    layer = moe_layer(d=8, hidden=4, experts=6, top_k=3)
    with torch.no_grad():
        for p in (layer.dense_h_to_4h.weight, layer.dense_h_to_4h.bias, layer.dense_4h_to_h.weight):
            p.zero_()
        layer.dense_4h_to_h.bias.copy_(torch.eye(6, 8))
    x = torch.randn(5, 8)
    out, call = layer(x)
    probs = torch.softmax(x @ layer.router.weight.T, -1)
    gates = out[:, :6]
    assert ((gates > 0).sum(-1) == 3).all()  # exactly k experts per token
    top = probs.topk(3).indices
    torch.testing.assert_close(gates, torch.zeros_like(probs).scatter(1, top, probs.gather(1, top)))
    assert (gates.sum(-1) < 1).all()  # not renormalised over the k (norm_topk_prob=False)
    torch.testing.assert_close(call.load.sum(), torch.tensor(1.0))


@pytest.mark.parametrize(("experts", "top_k"), [(4, 2), (5, 1), (3, 3), (8, 2)])
def test_grouped_computation_equals_the_per_token_loop(path, experts, top_k):
    layer = moe_layer(experts=experts, top_k=top_k)
    x = torch.randn(2, 9, 16, requires_grad=True)
    got, _ = layer(x)
    want = reference(layer, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(got)
    params = [x, *layer.parameters()]
    for g, w in zip(torch.autograd.grad(got, params, grad), torch.autograd.grad(want, params, grad), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)  # sums over tokens in another order


def test_an_expert_no_token_chose_is_skipped_and_gets_zero_gradient(path):
    layer = moe_layer(experts=4, top_k=1)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[2, 0] = 10.0  # every token with x_0 > 0 picks expert 2
    x = torch.randn(6, 16).abs()
    out, call = layer(x)
    assert call.load.tolist() == [0.0, 0.0, 1.0, 0.0]
    out.sum().backward()
    assert not layer.dense_h_to_4h.weight.grad[[0, 1, 3]].any() and layer.dense_h_to_4h.weight.grad[2].any()


# --- router losses --------------------------------------------------------------------------


def constructed_router(logits: torch.Tensor, top_k: int) -> tuple[MoE, torch.Tensor]:
    """A layer whose router logits are ``logits`` (tokens, E): one-hot tokens, router = logits^T."""
    tokens, experts = logits.shape
    layer = MoE(tokens, 4, experts, top_k)
    with torch.no_grad():
        layer.router.weight.copy_(logits.T)
    return layer, torch.eye(tokens)


def test_load_balancing_and_z_loss_equal_a_hand_computation():
    logits = torch.tensor(
        [[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 1.0, 0.5], [1.0, 0.0, 2.0, 0.0], [0.5, 0.0, 0.0, 1.5], [3.0, 2.0, 1.0, 0.0]]
    )
    layer, x = constructed_router(logits, top_k=2)
    _, call = layer(x)
    # top-2 sets by hand: {0,1}, {1,2}, {2,0}, {3,0}, {0,1}: expert 0 x4, 1 x3, 2 x2, 3 x1 of 10 assignments
    f = torch.tensor([4, 3, 2, 1]) / 10
    p = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    torch.testing.assert_close(call.load, f)
    torch.testing.assert_close(call.balance, 4 * (f * p.mean(0)).sum())
    z = torch.log(torch.exp(logits).sum(-1)) ** 2
    torch.testing.assert_close(call.z, z.mean())


def test_perfectly_balanced_routing_gives_the_minimum_1():
    experts, tokens = 4, 8
    logits = torch.zeros(tokens, experts)
    for j in range(tokens):  # token j prefers expert j % E, then (j+1) % E: balanced by symmetry
        logits[j, j % experts], logits[j, (j + 1) % experts] = 3.0, 2.0
    _, call = constructed_router(logits, top_k=2)[0](torch.eye(tokens))
    assert call.load.tolist() == [0.25] * 4
    assert call.balance.item() == pytest.approx(1.0, abs=1e-6)
    skewed = logits.clone()
    skewed[:, 0] = 5.0  # every token's first choice is expert 0
    _, unbalanced = constructed_router(skewed, top_k=2)[0](torch.eye(tokens))
    assert unbalanced.balance.item() > 1.2


def test_model_aux_loss_is_the_coefficient_weighted_sum():
    config = ModelConfig.from_preset("tiny-moe", moe_aux_coef=0.5, moe_z_coef=0.25)
    out = build_model(config)(torch.randint(0, 2048, (2, 8)), labels=torch.randint(0, 2048, (2, 8)))
    torch.testing.assert_close(out.aux_loss, 0.5 * out.aux_lb + 0.25 * out.aux_z)
    assert out.aux_lb.item() >= 1.0 - 1e-6  # E * sum f P >= 1 when f and P come from the same router
    default = build_model(ModelConfig.from_preset("tiny-moe"))(torch.zeros(1, 4, dtype=torch.long))
    torch.testing.assert_close(default.aux_loss, 0.01 * default.aux_lb + 0.001 * default.aux_z)


def record_calls(model) -> list[RouterCall]:
    calls: list[RouterCall] = []
    for module in model.modules():
        if isinstance(module, MoE):
            module.register_forward_hook(lambda _m, _args, output: calls.append(output[1]))
    return calls


@pytest.mark.parametrize(("layout", "expected_calls"), [("1+2R1+1", 4), ("1+2R3+1", 8), ("2+1R2+0", 4), ("6", 6)])
def test_aux_losses_average_every_router_call_of_every_loop_iteration(layout, expected_calls):
    model = build_model(ModelConfig.from_preset("tiny-moe", layout=layout))
    calls = record_calls(model)
    ids = torch.randint(0, 2048, (2, 10))
    out = model(ids, labels=ids)
    assert len(calls) == expected_calls  # a core block's router runs once per iteration
    torch.testing.assert_close(out.aux_lb, torch.stack([c.balance for c in calls]).mean())
    torch.testing.assert_close(out.aux_z, torch.stack([c.z for c in calls]).mean())
    assert out.loss.ndim == 0 and out.aux_loss.ndim == 0


def test_aux_losses_reach_the_shared_core_router_from_every_iteration():
    """The looped core's router gradient from the aux loss is the sum over its iterations: the
    same as an unrolled twin's, whose per-iteration routers are distinct copies."""
    looped = build_model(ModelConfig.from_preset("tiny-moe", layout="1+2R3+1", moe_aux_coef=1.0))
    unrolled = build_model(ModelConfig.from_preset("tiny-moe", layout="1+2+2+2+1", moe_aux_coef=1.0))
    state = dict(looped.state_dict())
    for name, tensor in looped.state_dict().items():
        if name.startswith("cores.0."):
            for i in (1, 2):
                state[name.replace("cores.0.", f"cores.{i}.", 1)] = tensor
    unrolled.load_state_dict(state)
    ids = torch.randint(0, 2048, (2, 12))
    a, b = looped(ids, labels=ids), unrolled(ids, labels=ids)
    torch.testing.assert_close(a.aux_loss, b.aux_loss)
    torch.testing.assert_close(a.loss, b.loss)
    (a.loss + a.aux_loss).backward()
    (b.loss + b.aux_loss).backward()
    copies = [dict(unrolled.cores[i].named_parameters()) for i in range(3)]
    for name, p in looped.cores[0].named_parameters():
        if p.grad is None:
            assert all(c[name].grad is None for c in copies), name
            continue
        torch.testing.assert_close(p.grad, sum(c[name].grad for c in copies), rtol=1e-4, atol=1e-7)


def test_activation_checkpointing_gives_the_same_moe_gradients():
    torch.manual_seed(0)
    config = ModelConfig(layout="1+2R3+1", scheme="mesh", vocab_size=128, moe_experts=4, moe_top_k=2)
    plain, checkpointed = build_model(config), build_model(config, activation_checkpointing=True)
    checkpointed.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 128, (2, 16))
    grads = []
    for m in (plain, checkpointed):
        out = m(ids, labels=ids, return_logits=False)
        grads.append(torch.autograd.grad(out.loss + out.aux_loss, list(m.parameters()), allow_unused=True))
    for got, want in zip(*grads, strict=True):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_combine_is_the_mean_over_calls():
    calls = [RouterCall(torch.tensor(v), torch.tensor(2 * v), torch.ones(2) / 2) for v in (1.0, 2.0, 6.0)]
    balance, z = combine(calls)
    assert balance.item() == 3.0 and z.item() == 6.0


# --- every layout and scheme ------------------------------------------------------------------


LAYOUT_SCHEMES = [("6", "base")] + [
    (layout, scheme)
    for layout in ("1+2R2+1", "0+2R3+0", "1+2+2+1")
    for scheme in ("base", "residual+anchor", "dynamic", "mesh")
]


@pytest.mark.parametrize(("layout", "scheme"), LAYOUT_SCHEMES)
def test_every_layout_and_scheme_trains_with_moe_and_stays_causal(layout, scheme):
    config = ModelConfig.from_preset("tiny-moe", layout=layout, scheme=scheme, moe_layers=2)
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    out = model(ids, labels=ids, return_logits=False)
    assert torch.isfinite(out.loss) and torch.isfinite(out.aux_loss)
    (out.loss + out.aux_loss).backward()
    for name, p in model.named_parameters():
        if "router" in name or ".mlp.dense" not in name:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % config.vocab_size
    with torch.no_grad():
        before, after = model(ids).logits, model(changed).logits
    # Causal up to float rounding: a later token changes the size of its experts' groups, and
    # with it how the grouped matmul blocks the rows of earlier tokens (not what they compute).
    torch.testing.assert_close(before[:, :10], after[:, :10], rtol=0, atol=1e-5)
    assert not torch.allclose(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize(
    ("layout", "moe_layers", "blocks"),
    [
        ("1+2R2+1", "all", (0, 1, 2, 3)),
        ("1+2R2+1", 2, (1, 3)),
        ("2+4R2+2", 3, (2, 5)),
        ("1+2+2+1", [0, 4], (0, 4)),
        ("6", (5, 1), (1, 5)),
        ("1+2R2+1", 1, (0, 1, 2, 3)),
    ],
)
def test_moe_layers_index_the_distinct_blocks(layout, moe_layers, blocks):
    config = ModelConfig.from_preset("tiny-moe", layout=layout, moe_layers=moe_layers)
    assert config.moe.blocks == blocks
    model = build_model(config)
    assert [i for i, b in enumerate(model.blocks()) if isinstance(b.mlp, MoE)] == list(blocks)
    assert sorted(model.moe_block_index.values()) == list(blocks)


# --- routing statistics -----------------------------------------------------------------------


def test_routing_statistics_shapes_and_bounds():
    config = ModelConfig.from_preset("tiny-moe", layout="1+2R3+1", scheme="mesh")
    model = build_model(config)
    ids = torch.randint(0, 2048, (2, 12))
    assert model(ids).routing is None  # only when asked
    routing = model(ids, return_routing=True).routing
    assert list(routing) == ["prelude.0", "cores.0.0", "cores.0.1", "coda.0"]
    experts = config.moe.experts
    for name, stats in routing.items():
        calls = 3 if name.startswith("cores") else 1
        assert stats.block == model.moe_block_index[name]
        assert stats.load.shape == (calls, experts) and stats.entropy.shape == (calls,)
        assert stats.jaccard.shape == (calls - 1,)
        torch.testing.assert_close(stats.load.sum(-1), torch.ones(calls))
        assert (stats.entropy >= 0).all() and (stats.entropy <= math.log(experts) + 1e-6).all()
        assert ((stats.jaccard >= 0) & (stats.jaccard <= 1)).all()
        assert not stats.load.requires_grad and not stats.entropy.requires_grad


def test_jaccard_is_1_when_the_core_input_does_not_change():
    """Zero the core's output projections (attention dense, experts' down projections): the core
    is the identity, under base the loop state never changes, so every iteration's router sees
    the same input and chooses the same experts."""
    model = build_model(ModelConfig.from_preset("tiny-moe", layout="1+2R3+1", scheme="base"))
    with torch.no_grad():
        for block in model.cores[0]:
            for projection in block.output_projections():
                projection.weight.zero_()
                projection.bias.zero_()
    routing = model(torch.randint(0, 2048, (2, 12)), return_routing=True).routing
    for name in ("cores.0.0", "cores.0.1"):
        assert routing[name].jaccard.tolist() == [1.0, 1.0]
        assert torch.equal(routing[name].load[0], routing[name].load[2])


def test_jaccard_of_constructed_sets():
    a = torch.tensor([[0, 1], [2, 3], [0, 1]])
    b = torch.tensor([[1, 0], [3, 4], [2, 3]])
    # per token: {0,1} vs {0,1} = 1; {2,3} vs {3,4} = 1/3; {0,1} vs {2,3} = 0
    assert jaccard(a, b).item() == pytest.approx((1 + 1 / 3 + 0) / 3)


def test_a_dense_model_has_no_aux_losses():
    model = build_model(ModelConfig.from_preset("tiny"))
    out = model(torch.zeros(1, 4, dtype=torch.long), return_routing=True)
    assert out.aux_loss is None and out.aux_lb is None and out.aux_z is None and out.routing == {}


# --- compile, autocast ------------------------------------------------------------------------


def test_compiled_bf16_moe_loop_is_one_graph():
    """The GPU path: bf16 autocast, the grouped matmul, no host sync, so one graph for the loop."""
    if not grouped_mm_available("cpu", torch.bfloat16, True):
        pytest.skip("no bf16 grouped matmul (eager and meta) in this torch")
    torch._dynamo.reset()
    model = build_model(ModelConfig(layout="1+2R3+1", scheme="mesh", vocab_size=128, moe_experts=4, moe_top_k=2))
    counter = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    for _ in range(2):
        ids = torch.randint(0, 128, (2, 16))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = compiled(ids, labels=ids, return_logits=False)
        (out.loss + out.aux_loss).backward()
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_bf16_autocast_matches_fp32():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=128, moe_experts=4, moe_top_k=2))
    ids = torch.randint(0, 128, (2, 16))
    reference_out = model(ids, labels=ids, return_logits=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids, return_logits=False)
    torch.testing.assert_close(out.loss, reference_out.loss, rtol=2e-2, atol=2e-2)
    (out.loss + out.aux_loss).backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())


# --- accounting and presets -------------------------------------------------------------------


def moe_block(d: int, experts: int, hidden: int) -> int:
    return 4 * d * d + 8 * d + d * experts + experts * (2 * d * hidden + hidden + d)


def dense_block(d: int) -> int:
    return 12 * d * d + 13 * d


@pytest.mark.parametrize(
    ("layout", "scheme", "experts", "top_k", "hidden", "moe_layers"),
    [
        ("1+2R2+1", "base", 8, 2, 128, "all"),
        ("1+2R3+1", "mesh", 4, 1, 96, 2),
        ("1+2+2+1", "base", 3, 3, 32, [0, 5]),
        ("6", "base", 16, 4, 48, 3),
    ],
)
def test_accounting_equals_the_closed_forms(layout, scheme, experts, top_k, hidden, moe_layers):
    config = ModelConfig.from_preset(
        "tiny",
        layout=layout,
        scheme=scheme,
        moe_experts=experts,
        moe_top_k=top_k,
        moe_hidden=hidden,
        moe_layers=moe_layers,
    )
    d, vocab, seq = config.d_model, config.vocab_size, 64
    with torch.device("meta"):
        model = build_model(config)
    counts = count_parameters(model, seq)
    moe_blocks = config.moe.blocks
    n_moe, n_dense = len(moe_blocks), config.distinct_layers - len(moe_blocks)
    per_expert = 2 * d * hidden + hidden + d
    router = counts["router"]
    non_embedding = n_moe * moe_block(d, experts, hidden) + n_dense * dense_block(d) + 2 * d + router
    assert counts["non_embedding"] == non_embedding
    assert counts["total"] == non_embedding + 2 * vocab * d == parameter_count(config)
    assert counts["expert"] == n_moe * experts * per_expert
    assert counts["moe_router"] == n_moe * d * experts
    assert counts["active_non_embedding"] == non_embedding - n_moe * (experts - top_k) * per_expert
    assert counts["active_total"] == counts["active_non_embedding"] + 2 * vocab * d
    # FLOPs: each unrolled block applies attention 4d^2 and either the dense MLP 8d^2 or the
    # router dE plus k experts of 2dH.
    unrolled = [*range(config.parsed_layout.prelude)]
    starts = [
        config.parsed_layout.prelude + sum(config.parsed_layout.cores[:c])
        for c in range(len(config.parsed_layout.cores))
    ]
    for c in config.parsed_layout.core_schedule:
        unrolled += range(starts[c], starts[c] + config.parsed_layout.cores[c])
    unrolled += range(config.distinct_layers - config.parsed_layout.coda, config.distinct_layers)
    assert len(unrolled) == config.compute_depth
    weights = sum(
        4 * d * d + (d * experts + top_k * 2 * d * hidden if i in moe_blocks else 8 * d * d) for i in unrolled
    )
    if config.scheme_spec.kind == "mesh":
        weights += 2 * (config.loops + 1) * d * config.slots
    assert flops_per_token(model, seq) == 6 * (weights + d * vocab) + 12 * config.compute_depth * seq * d


def test_dense_counts_keep_every_key_and_add_the_moe_ones():
    with torch.device("meta"):
        counts = count_parameters(build_model(ModelConfig.from_preset("pythia-1.4b", scheme="mesh", buffer_slots=5)))
    assert counts["non_embedding"] == 805_797_918 and counts["router"] == 61_470
    assert counts["expert"] == 0 and counts["moe_router"] == 0
    assert counts["active_non_embedding"] == counts["non_embedding"] and counts["active_total"] == counts["total"]


def test_the_paper_budget_preset_is_2p6b_total_512m_active():
    config = ModelConfig.from_preset("olmoe-2.6b")
    assert (config.d_model, config.n_heads, config.layout) == (1152, 18, "4+8R2+4")
    assert (config.moe.experts, config.moe.top_k, config.moe.hidden, config.moe.blocks) == (
        64,
        8,
        1024,
        tuple(range(16)),
    )
    with torch.device("meta"):
        counts = count_parameters(build_model(config))
    assert counts["total"] == 2_620_311_808  # 2.6B (+0.8%), embeddings included as OLMoE counts
    assert counts["active_total"] == 504_432_896  # 512M (-1.5%)
    assert counts["non_embedding"] == 2_504_411_392 and counts["active_non_embedding"] == 388_532_480
    assert counts["total"] == parameter_count(config)


@pytest.mark.parametrize(("moe", "dense"), [("tiny-moe", "tiny"), ("mini-moe", "mini")])
def test_cpu_moe_presets_match_the_dense_active_parameters(moe, dense):
    with torch.device("meta"):
        moe_counts = count_parameters(build_model(ModelConfig.from_preset(moe)))
        dense_counts = count_parameters(build_model(ModelConfig.from_preset(dense)))
    ratio = moe_counts["active_non_embedding"] / dense_counts["non_embedding"]
    assert 1.0 < ratio < 1.02  # the router and the second expert's biases
    assert moe_counts["flops_per_token"] / dense_counts["flops_per_token"] == pytest.approx(1.0, abs=0.01)
    assert moe_counts["embedding"] == dense_counts["embedding"]


def test_memory_estimate_counts_the_experts():
    tiny, tiny_moe = ModelConfig.from_preset("tiny"), ModelConfig.from_preset("tiny-moe")
    dense, moe = estimate_step_memory(tiny, 4, 256), estimate_step_memory(tiny_moe, 4, 256)
    assert moe.parameters == 4 * parameter_count(tiny_moe) > dense.parameters
    assert moe.activations > dense.activations


# --- config: spellings, identity and bad input ------------------------------------------------


def test_a_dense_config_dict_has_no_moe_fields_and_a_moe_one_is_resolved():
    assert not any(k.startswith("moe_") for k in ModelConfig.from_preset("tiny").to_dict())
    short = ModelConfig.from_preset("tiny", moe_experts=8)
    spelled = ModelConfig.from_preset(
        "tiny", moe_experts=8, moe_top_k=2, moe_hidden=128, moe_layers=1, moe_aux_coef=0.01
    )
    assert short.to_dict() == spelled.to_dict()
    assert {k: v for k, v in short.to_dict().items() if k.startswith("moe_")} == {
        "moe_experts": 8,
        "moe_top_k": 2,
        "moe_hidden": 128,
        "moe_layers": "all",
        "moe_aux_coef": 0.01,
        "moe_z_coef": 0.001,
    }
    assert ModelConfig(**short.to_dict()).to_dict() == short.to_dict()
    listed = ModelConfig.from_preset("tiny", moe_experts=4, moe_layers=[3, 1])
    assert listed.moe_layers == (1, 3) and listed.to_dict()["moe_layers"] == [1, 3]
    assert ModelConfig(**listed.to_dict()).moe.blocks == (1, 3)


def test_a_moe_preset_switches_off_and_keeps_experts_in_its_vanilla():
    assert ModelConfig.from_preset("tiny-moe", moe_experts=None).moe is None
    vanilla = ModelConfig.from_preset("tiny-moe").vanilla()
    assert vanilla.layout == "6" and vanilla.moe.blocks == tuple(range(6))


@pytest.mark.parametrize(
    ("kwargs", "start", "fragment"),
    [
        ({"moe_experts": 2, "moe_top_k": 3}, "moe_top_k=3 is invalid", "from 1 to moe_experts=2"),
        ({"moe_experts": 4, "moe_top_k": 0}, "moe_top_k=0 is invalid", "from 1 to moe_experts=4"),
        ({"moe_experts": 0}, "moe_experts=0 is invalid", "at least 1 expert"),
        ({"moe_experts": -3}, "moe_experts=-3 is invalid", "at least 1 expert"),
        ({"moe_experts": 4, "moe_layers": [4]}, "moe_layers=[4] is invalid", "has blocks 0..3 (prelude: 0, core: 1-2"),
        ({"moe_experts": 4, "moe_layers": 5}, "moe_layers=5 is invalid", "from 1 to the 4 blocks"),
        ({"moe_experts": 4, "moe_layers": 0}, "moe_layers=0 is invalid", "'all', a stride n >= 1"),
        ({"moe_experts": 4, "moe_layers": "odd"}, "moe_layers='odd' is invalid", "a list of block indices"),
        ({"moe_experts": 4, "moe_layers": [1, 1]}, "moe_layers=[1, 1] is invalid", "a list of block indices"),
        ({"moe_experts": 4, "moe_hidden": 0}, "moe_hidden=0 is invalid", "positive integer"),
        ({"moe_experts": 4, "moe_aux_coef": -1.0}, "moe_aux_coef=-1.0 is invalid", ">= 0"),
        ({"moe_top_k": 2}, "moe_top_k=2 is invalid", "MoE is off (moe_experts unset)"),
        ({"moe_layers": "all"}, "moe_layers='all' is invalid", "MoE is off"),
        ({"moe_hidden": 64}, "moe_hidden=64 is invalid", "MoE is off"),
        ({"moe_z_coef": 0.1}, "moe_z_coef=0.1 is invalid", "MoE is off"),
    ],
)
def test_bad_moe_config_fails_at_build_with_one_line(kwargs, start, fragment):
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_preset("tiny", **kwargs)
    message = str(info.value)
    assert message.startswith(start) and fragment in message and "\n" not in message


def test_params_cli_prints_moe_rows_and_refuses_bad_moe_input(capsys):
    assert model_cli(["params", "--preset", "tiny", "--moe-experts", "8", "--moe-top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "8/2" in out and "active total" in out
    assert model_cli(["params"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| olmoe-2.6b")]
    assert len(rows) == 3 and any("2,620,311,808" in r and "504,432,896" in r for r in rows)
    assert model_cli(["params", "--preset", "tiny", "--moe-top-k", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: moe_top_k=2 is invalid: MoE is off (moe_experts unset): set moe_experts to use it"
    )


def test_hf_export_refuses_a_moe_model():
    from mesh_model import to_hf_gpt_neox

    with pytest.raises(ConfigError, match=r"^moe_experts=8 is invalid: only a dense model"):
        to_hf_gpt_neox(build_model(ModelConfig.from_preset("tiny-moe", layout="6")))


def test_the_moe_benchmark_dry_runs(capsys):
    """benchmarks/moe_step.py end to end on a tiny cell: three models interleaved, one table row."""
    import shlex
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import moe_step

    moe_step.main(shlex.split("--quick --seqs 32 --batch 1 --pairs 2 --warmup 0"))
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 1 and rows[0].count("(n=2)") == 2
    assert moe_module.grouped_mm_available is grouped_mm_available  # the loop row put it back


def test_grouped_mm_available_carries_torchs_constant_mark():
    """moe.py marks it as ``torch.compiler.assume_constant_result`` would, without importing
    ``torch._dynamo`` at import: the attributes torch sets are the ones it has."""

    def probe() -> bool:
        return True

    marked = torch.compiler.assume_constant_result(probe)
    assert marked is probe and vars(probe)
    assert {k: getattr(grouped_mm_available, k, None) for k in vars(probe)} == vars(probe)


def test_importing_the_model_leaves_torch_dynamo_out():
    import subprocess
    import sys

    code = "import sys, mesh_model.model, mesh_model.accounting; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
