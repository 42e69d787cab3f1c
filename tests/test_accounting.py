import pytest
import torch

from mesh_model import PRESETS, ModelConfig, build_model, count_parameters, flops_per_token


def counts(preset, **overrides):
    with torch.device("meta"):
        return count_parameters(build_model(ModelConfig.from_preset(preset, **overrides)))


def test_pythia_1p4b_matches_the_paper_exactly():
    vanilla = counts("pythia-1.4b", layout="24")
    base = counts("pythia-1.4b", layout="4+8R2+4")
    mesh = counts("pythia-1.4b", layout="4+8R2+4", scheme="mesh", buffer_slots=5)
    assert vanilla["non_embedding"] == 1_208_602_624
    assert base["non_embedding"] == 805_736_448
    assert mesh["non_embedding"] == 805_797_918
    assert mesh["router"] == 61_470
    assert base["router"] == 0
    assert round(100 - base["pct_of_vanilla"], 3) == 33.333
    assert vanilla["embedding"] == 2 * 50304 * 2048
    assert mesh["total"] == mesh["embedding"] + mesh["non_embedding"]


PAPER_ROWS = [
    ("pythia-160m", "2+4R2+2"),
    ("pythia-410m", "4+8R2+4"),
    ("pythia-410m", "3+6R3+3"),
    ("pythia-1b", "3+5R2+3"),
    ("pythia-1.4b", "4+8R2+4"),
    ("pythia-2.8b", "6+10R2+6"),
    ("pythia-6.9b", "6+10R2+6"),
    ("pythia-70m", "1+2R2+1"),
]


@pytest.mark.parametrize(("preset", "layout"), PAPER_ROWS)
def test_every_preset_and_paper_layout_follows_the_formula(preset, layout):
    d = PRESETS[preset].d_model
    per_layer = 12 * d * d + 13 * d
    config = ModelConfig.from_preset(preset, layout=layout, scheme="mesh")
    k, b = config.loops, config.slots
    assert b == k + 3
    distinct = config.distinct_layers
    base = counts(preset, layout=layout)
    mesh = counts(preset, layout=layout, scheme="mesh")
    vanilla = counts(preset, layout=str(config.compute_depth))
    assert base["non_embedding"] == distinct * per_layer + 2 * d
    assert vanilla["non_embedding"] == config.compute_depth * per_layer + 2 * d
    assert mesh["router"] == 2 * (k + 1) * (d * b + b)
    assert mesh["non_embedding"] == base["non_embedding"] + mesh["router"]
    assert base["vanilla_non_embedding"] == vanilla["non_embedding"]
    # The shared core is counted once, however often it runs.
    assert base["shared_core"] == (distinct - config.parsed_layout.prelude - config.parsed_layout.coda) * per_layer


def test_paper_percentages():
    assert counts("pythia-2.8b", layout="6+10R2+6")["pct_of_vanilla"] == pytest.approx(68.75, abs=1e-3)
    assert counts("pythia-1b", layout="3+5R2+3")["pct_of_vanilla"] == pytest.approx(68.75, abs=1e-3)
    assert counts("pythia-410m", layout="3+6R3+3")["pct_of_vanilla"] == pytest.approx(50.0, abs=1e-3)


def test_static_and_dynamic_coefficient_counts():
    d = PRESETS["pythia-410m"].d_model
    assert counts("pythia-410m", scheme="static")["router"] == 2 * 3
    assert counts("pythia-410m", scheme="dynamic")["router"] == 2 * (3 * d + 3)
    assert counts("pythia-410m", scheme="residual+anchor")["router"] == 0


@pytest.mark.parametrize("preset", ["pythia-160m", "pythia-1.4b"])
def test_vanilla_counts_equal_huggingface_gpt_neox(preset):
    transformers = pytest.importorskip("transformers")
    p = PRESETS[preset]
    hf_config = transformers.GPTNeoXConfig(
        vocab_size=p.vocab_size,
        hidden_size=p.d_model,
        num_hidden_layers=p.layers,
        num_attention_heads=p.n_heads,
        intermediate_size=4 * p.d_model,
        rotary_pct=0.25,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        hf = transformers.GPTNeoXForCausalLM(hf_config)
    hf_total = sum(t.numel() for t in hf.parameters())
    hf_embedding = hf.gpt_neox.embed_in.weight.numel() + hf.get_output_embeddings().weight.numel()
    ours = counts(preset, layout=str(p.layers))
    assert ours["total"] == hf_total
    assert ours["non_embedding"] == hf_total - hf_embedding


def test_flops_per_token_counts_every_loop():
    config = ModelConfig.from_preset("pythia-1.4b", layout="4+8R2+4")
    with torch.device("meta"):
        base = build_model(config)
        vanilla = build_model(config.vanilla())
        mesh = build_model(config.replace(scheme="mesh"))
    d, v, seq = 2048, 50304, 2048
    expected = 6 * (24 * 12 * d * d + d * v) + 12 * 24 * seq * d
    assert flops_per_token(vanilla, seq) == expected
    # Looping the core costs the same compute as the vanilla model it is matched to.
    assert flops_per_token(base, seq) == expected
    assert flops_per_token(mesh, seq) == expected + 6 * 2 * 3 * d * 5
