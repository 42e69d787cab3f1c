"""Pythia / GPT-NeoX checkpoints in and out (``transformers`` is an optional dependency).

Our parameter names inside a block are Hugging Face's, so conversion is a key rename:
``gpt_neox.layers.{i}.*`` <-> the i-th block of the unrolled layer order. The output projection
is ``embed_out`` in transformers 4 and ``lm_head`` in 5; both are handled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from mesh_model.config import ModelConfig
from mesh_model.errors import ConfigError
from mesh_model.model import MeshTransformer, build_model

if TYPE_CHECKING:
    from transformers import GPTNeoXForCausalLM


def _rope_settings(hf_config: Any) -> tuple[float, float]:
    rope = getattr(hf_config, "rope_parameters", None) or {}
    pct = rope.get("partial_rotary_factor", getattr(hf_config, "rotary_pct", 0.25))
    base = rope.get("rope_theta", getattr(hf_config, "rotary_emb_base", 10000.0))
    return float(pct), float(base)


def from_hf_gpt_neox(hf_model: GPTNeoXForCausalLM, **overrides: Any) -> MeshTransformer:
    """A vanilla MeshTransformer with the weights of a Hugging Face GPTNeoXForCausalLM.

    The sqrt(d) embedding scale is switched off (Pythia has none), so logits match exactly.
    ``overrides`` set other ModelConfig fields (``max_seq_len``...).
    """
    c = hf_model.config
    unsupported = {
        "use_parallel_residual": (c.use_parallel_residual, True),
        "hidden_act": (c.hidden_act, "gelu"),
        "tie_word_embeddings": (getattr(c, "tie_word_embeddings", False), False),
        "attention_bias": (getattr(c, "attention_bias", True), True),
    }
    for name, (value, needed) in unsupported.items():
        if value != needed:
            raise ConfigError(f"hf config.{name}", value, f"only {needed!r} is supported (the Pythia architecture)")
    if c.intermediate_size % c.hidden_size:
        raise ConfigError("hf config.intermediate_size", c.intermediate_size, "must be a multiple of hidden_size")
    rotary_pct, rotary_base = _rope_settings(c)
    values: dict[str, Any] = {
        "layout": str(c.num_hidden_layers),
        "scheme": "base",
        "d_model": c.hidden_size,
        "n_heads": c.num_attention_heads,
        "vocab_size": c.vocab_size,
        "max_seq_len": c.max_position_embeddings,
        "mlp_ratio": c.intermediate_size // c.hidden_size,
        "rotary_pct": rotary_pct,
        "rotary_base": rotary_base,
        "layer_norm_eps": c.layer_norm_eps,
        "scale_embeddings": False,
    }
    values.update(overrides)
    config = ModelConfig(**values)
    with torch.device("meta"):
        model = build_model(config)
    state = {}
    for key, tensor in hf_model.state_dict().items():
        name = key.removeprefix("gpt_neox.")
        if name == "lm_head.weight":  # transformers >= 5 names the output projection lm_head
            name = "embed_out.weight"
        if name.startswith("layers."):
            name = "prelude." + name.removeprefix("layers.")
        if name.startswith("rotary_emb.") or name.endswith(("attention.bias", "attention.masked_bias")):
            continue
        state[name] = tensor
    model.load_state_dict(state, strict=True, assign=True)
    return model


def to_hf_gpt_neox(model: MeshTransformer) -> GPTNeoXForCausalLM:
    """A GPTNeoXForCausalLM computing the same logits as ``model``.

    Works for every dense layout with ``scheme='base'``: a looped core is unrolled (its weights copied
    into each of the K positions), and an embedding scale is folded into the input embedding.
    """
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = model.config
    if config.scheme_spec.kind != "base":
        raise ConfigError("scheme", config.scheme, "only scheme=base has a GPT-NeoX equivalent")
    if config.moe is not None:
        raise ConfigError("moe_experts", config.moe_experts, "only a dense model has a GPT-NeoX equivalent")
    blocks = [block for stack in model.unrolled_stacks() for block in stack]
    hf_config = GPTNeoXConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        num_hidden_layers=len(blocks),
        num_attention_heads=config.n_heads,
        intermediate_size=config.mlp_ratio * config.d_model,
        hidden_act="gelu",
        rotary_pct=config.rotary_pct,
        rotary_emb_base=config.rotary_base,
        max_position_embeddings=config.max_seq_len,
        layer_norm_eps=config.layer_norm_eps,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        attention_bias=True,
    )
    hf_model = GPTNeoXForCausalLM(hf_config).to(model.embed_out.weight.dtype)
    state = {
        "gpt_neox.embed_in.weight": model.embed_in.weight.detach() * model.embedding_scale,
        "gpt_neox.final_layer_norm.weight": model.final_layer_norm.weight.detach(),
        "gpt_neox.final_layer_norm.bias": model.final_layer_norm.bias.detach(),
    }
    output_key = "lm_head.weight" if hasattr(hf_model, "lm_head") else "embed_out.weight"
    state[output_key] = model.embed_out.weight.detach()
    for i, block in enumerate(blocks):
        for name, tensor in block.state_dict().items():
            state[f"gpt_neox.layers.{i}.{name}"] = tensor.detach().clone()
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k and not k.endswith(("attention.bias", "masked_bias"))]
    if missing or unexpected:
        raise RuntimeError(f"GPT-NeoX conversion mismatch: missing {missing}, unexpected {unexpected}")
    return hf_model.eval()
