import pytest
import torch

from mesh_model import ModelConfig, build_model

SCHEMES = [
    "base",
    "residual",
    "anchor",
    "anchor_emb",
    "residual+anchor",
    "anchor+anchor_emb",
    "static",
    "dynamic",
    "mesh",
]
LAYOUTS = ["1+2R2+1", "0+2R3+0", "2+1R1+0", "1+2+2+1"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_and_layout_trains_and_is_causal(scheme, layout):
    config = ModelConfig.from_preset("tiny", layout=layout, scheme=scheme)
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (2, 16))
    out = model(ids, labels=ids, return_hidden_states=True)
    assert out.logits.shape == (2, 16, config.vocab_size)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
    # Every trainable tensor receives signal (routers included).
    assert all(p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "bias" not in n or "router" in n)
    names = list(out.hidden_states)
    assert names == ["embedding", "prelude", *[f"h{t}" for t in range(config.loops + 1)], "coda"]
    changed = ids.clone()
    changed[:, 10] = (changed[:, 10] + 1) % config.vocab_size
    with torch.no_grad():
        before, after = model(ids).logits, model(changed).logits
    torch.testing.assert_close(before[:, :10], after[:, :10], rtol=0, atol=0)
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_vanilla_layout_runs():
    config = ModelConfig.from_preset("tiny", layout="6")
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (1, 8))
    out = model(ids, labels=ids, return_hidden_states=True)
    assert list(out.hidden_states) == ["embedding", "prelude", "coda"]
    assert model.state_passing is None


@pytest.mark.parametrize(
    ("overrides", "variant"),
    [
        ({"layout": "6"}, "vanilla"),
        ({"scheme": "anchor*"}, "anchor_emb"),
        ({"scheme": "base"}, "base"),
        ({"layout": "1+2+2+1", "scheme": "mesh"}, "mesh"),
        ({"scheme": "anchor + residual"}, "residual+anchor"),
    ],
)
def test_variant_names_the_run_vanilla_or_the_canonical_scheme(overrides, variant):
    assert ModelConfig.from_preset("tiny", **overrides).variant == variant


def test_loss_is_mean_next_token_cross_entropy_with_labels_shifted_inside():
    config = ModelConfig.from_preset("tiny", scheme="mesh")
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (2, 10))
    out = model(ids, labels=ids)
    logp = torch.log_softmax(out.logits, -1)
    expected = -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(out.loss, expected)
    labels = ids.clone()
    labels[:, 5:] = -100
    masked = model(ids, labels=labels).loss
    torch.testing.assert_close(masked, -logp[:, :4].gather(-1, ids[:, 1:5, None]).mean())


def test_embeddings_are_scaled_by_sqrt_d_unless_switched_off():
    ids = torch.randint(0, 2048, (1, 4))
    for scale, factor in ((True, 8.0), (False, 1.0)):
        model = build_model(ModelConfig.from_preset("tiny", scale_embeddings=scale))
        h_emb = model(ids, return_hidden_states=True).hidden_states["embedding"]
        torch.testing.assert_close(h_emb, model.embed_in(ids) * factor)


def test_depth_aware_init_of_output_projections():
    torch.manual_seed(1)
    config = ModelConfig.from_preset("small", layout="2+4R2+2", init_std=0.02)
    model = build_model(config)
    expected = 0.02 / (2 * 12) ** 0.5
    for block in model.blocks():
        dense, down = block.output_projections()
        assert dense.weight.std().item() == pytest.approx(expected, rel=0.05)
        assert down.weight.std().item() == pytest.approx(expected, rel=0.05)
        assert block.attention.query_key_value.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.embed_out.weight is not model.embed_in.weight


def test_looped_core_shares_the_same_tensors_on_every_iteration():
    model = build_model(ModelConfig.from_preset("tiny", layout="1+2R3+1", scheme="mesh"))
    stacks = model.unrolled_stacks()
    assert len(stacks) == 1 + 3 + 1
    cores = stacks[1:4]
    assert cores[0] is cores[1] is cores[2]
    pointers = [[p.data_ptr() for p in core.parameters()] for core in cores]
    assert pointers[0] == pointers[1] == pointers[2]
    assert len(model.cores) == 1


@pytest.mark.parametrize("scheme", ["base", "anchor", "mesh"])
def test_shared_core_gradient_is_the_sum_over_iterations(scheme):
    """A looped model and its unrolled twin (distinct copies of the core) compute the same
    function; the shared core's gradient equals the sum of the copies' gradients."""
    looped = build_model(ModelConfig.from_preset("tiny", layout="1+2R3+1", scheme=scheme))
    unrolled = build_model(ModelConfig.from_preset("tiny", layout="1+2+2+2+1", scheme=scheme))
    state = {k: v for k, v in looped.state_dict().items() if not k.startswith("cores.")}
    for i in range(3):
        state.update(
            {
                k.replace("cores.0.", f"cores.{i}.", 1): v
                for k, v in looped.state_dict().items()
                if k.startswith("cores.0.")
            }
        )
    unrolled.load_state_dict(state, strict=True)
    ids = torch.randint(0, 2048, (2, 12))
    loss_looped = looped(ids, labels=ids).loss
    loss_unrolled = unrolled(ids, labels=ids).loss
    torch.testing.assert_close(loss_looped, loss_unrolled)
    loss_looped.backward()
    loss_unrolled.backward()
    per_iteration = [dict(unrolled.cores[i].named_parameters()) for i in range(3)]
    for name, p in looped.cores[0].named_parameters():
        contributions = [per_iteration[i][name].grad for i in range(3)]
        assert all(c.abs().sum() > 0 for c in contributions), name
        torch.testing.assert_close(p.grad, sum(contributions), rtol=1e-4, atol=1e-7)


def test_sequence_longer_than_max_seq_len_is_refused():
    model = build_model(ModelConfig.from_preset("tiny", max_seq_len=8))
    with pytest.raises(ValueError, match="input length 9 exceeds max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_meta_device_builds_the_largest_preset_without_memory():
    with torch.device("meta"):
        model = build_model(ModelConfig.from_preset("pythia-6.9b", scheme="mesh"))
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("scheme", ["base", "residual", "anchor_emb", "dynamic", "mesh"])
@pytest.mark.parametrize("layout", ["1+2R3+1", "1+2+2+1"])
def test_core_outputs_are_each_iterations_core_applied_to_its_input(scheme, layout):
    """``f{t}`` is what core iteration t returned for h(t-1), before the state passing made h(t)."""
    from mesh_model.layers import rotary_tables

    config = ModelConfig.from_preset("tiny", layout=layout, scheme=scheme)
    model = build_model(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 12))
    with torch.no_grad():
        out = model(ids, return_hidden_states=True)
        rope = rotary_tables(12, config.rotary_dims, config.rotary_base, ids.device)
        for t, core_index in enumerate(model.core_schedule, start=1):
            expected = model.cores[core_index](out.hidden_states[f"h{t - 1}"], rope)
            torch.testing.assert_close(out.core_outputs[f"f{t}"], expected, rtol=0, atol=0)
    assert list(out.core_outputs) == [f"f{t}" for t in range(1, config.loops + 1)]
    assert not set(out.core_outputs) & set(out.hidden_states)  # the stages of the CKA figure are unchanged
    if scheme == "base":
        assert all(
            torch.equal(out.core_outputs[f"f{t}"], out.hidden_states[f"h{t}"]) for t in range(1, config.loops + 1)
        )
    if scheme == "residual":
        h, f = out.hidden_states, out.core_outputs
        torch.testing.assert_close(h["h2"], f["f2"] + h["h1"], rtol=0, atol=0)
    assert model(ids).core_outputs is None


def test_vanilla_layout_has_no_core_outputs():
    model = build_model(ModelConfig.from_preset("tiny", layout="6"))
    assert model(torch.zeros(1, 4, dtype=torch.long), return_hidden_states=True).core_outputs == {}


def test_a_model_built_on_the_meta_device_draws_nothing_and_imports_no_torch_dynamo():
    """A model only counted (mesh-sweep's estimate, mesh-model params) is built on meta: nn.Embedding's
    own Normal init ran torch's reference normal_ there, whose wrapper imports torch._dynamo (1.5-3.5 s
    of every mesh-sweep start). A fresh process shows what it imports."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from mesh_model import ModelConfig, build_model\n"
        "with torch.device('meta'):\n"
        "    model = build_model(ModelConfig(layout='1+2R2+1', scheme='mesh', d_model=64, n_heads=4))\n"
        "assert all(p.is_meta for p in model.parameters())\n"
        "print(sum(p.numel() for p in model.parameters()), 'torch._dynamo' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, dynamo = done.stdout.split()
    config = ModelConfig(layout="1+2R2+1", scheme="mesh", d_model=64, n_heads=4)
    assert int(count) == sum(p.numel() for p in build_model(config).parameters())
    assert dynamo == "False"
