import pytest
import torch

from mesh_model import ConfigError, ModelConfig, build_model, from_hf_gpt_neox, to_hf_gpt_neox

transformers = pytest.importorskip("transformers")


def random_hf_model(layers=3):
    config = transformers.GPTNeoXConfig(
        vocab_size=97,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=256,
        rotary_pct=0.25,
        rotary_emb_base=10000,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = transformers.GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():  # HF zero-inits biases; make every tensor matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def test_hf_to_ours_same_logits():
    hf = random_hf_model()
    ours = from_hf_gpt_neox(hf)
    assert ours.config.layout == "3" and not ours.config.scale_embeddings
    assert ours.config.rotary_dims == 4
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-5)


def test_ours_to_hf_same_logits_and_round_trip():
    ours = build_model(
        ModelConfig(layout="3", d_model=64, n_heads=4, vocab_size=97, max_seq_len=64, scale_embeddings=False)
    )
    hf = to_hf_gpt_neox(ours)
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids).logits, rtol=1e-4, atol=1e-5)
        back = from_hf_gpt_neox(hf)
        torch.testing.assert_close(back(ids).logits, ours(ids).logits, rtol=1e-4, atol=1e-5)
    for (name, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


def test_looped_base_model_exports_unrolled_with_the_embedding_scale_folded_in():
    ours = build_model(ModelConfig(layout="1+2R2+1", d_model=64, n_heads=4, vocab_size=97, max_seq_len=64))
    hf = to_hf_gpt_neox(ours)
    assert hf.config.num_hidden_layers == 6
    ids = torch.randint(0, 97, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids).logits, rtol=1e-4, atol=1e-5)


def test_only_base_scheme_exports():
    ours = build_model(ModelConfig(layout="1+2R2+1", scheme="mesh", d_model=64, n_heads=4, vocab_size=97))
    with pytest.raises(ConfigError, match="only scheme=base has a GPT-NeoX equivalent"):
        to_hf_gpt_neox(ours)
