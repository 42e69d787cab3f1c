"""Parameter and FLOP accounting, read off the built modules (meta-device models work).

Conventions:

* ``embedding`` = input embedding + output projection (untied); ``non_embedding`` = the rest,
  which is what the paper reports. ``router`` = parameters of the state-passing module (MeSH's
  read/write routers, or the static/dynamic coefficients); they are part of ``non_embedding``.
* ``flops_per_token`` counts matrix multiplies only (the MFU convention of PaLM, Chowdhery et
  al. 2022): 6 x (weights applied per token, every loop iteration counted) plus attention's
  QK^T and AV at 12 x layers x seq_len x d_model, counted as if non-causal. LayerNorms,
  softmaxes, GELUs, rotary and the MeSH buffer mixing (O(B*D) per token) are left out.
"""

from __future__ import annotations

from torch import nn

from mesh_model.model import MeshTransformer


def _numel(module: nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(p.numel() for p in module.parameters())


def _matmul_weights(module: nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def non_embedding_of(layers: int, d_model: int, mlp_ratio: int = 4) -> int:
    """Closed form for a plain GPT-NeoX stack of ``layers`` blocks plus the final LayerNorm.

    Per block: QKV 3d^2+3d, dense d^2+d, MLP 2dh+h+d (h = mlp_ratio*d), two LayerNorms 4d. With
    the 4x MLP this is the paper's ``layers * (12 d^2 + 13 d) + 2 d``.
    """
    hidden = mlp_ratio * d_model
    per_layer = 4 * d_model * d_model + 4 * d_model + 2 * d_model * hidden + hidden + d_model + 4 * d_model
    return layers * per_layer + 2 * d_model


def flops_per_token(model: MeshTransformer, seq_len: int | None = None) -> int:
    """Training (forward + backward) matmul FLOPs per token at ``seq_len`` (default max_seq_len)."""
    config = model.config
    seq_len = seq_len or config.max_seq_len
    weights = sum(_matmul_weights(stack) for stack in model.unrolled_stacks())
    weights += model.embed_out.weight.numel()
    if model.state_passing is not None:
        # Every router is applied exactly once per forward pass.
        weights += _matmul_weights(model.state_passing)
    attention = 12 * config.compute_depth * seq_len * config.d_model
    return 6 * weights + attention


def count_parameters(model: MeshTransformer, seq_len: int | None = None) -> dict[str, int | float]:
    """Counts of a built model: ``total``, ``embedding``, ``non_embedding``, ``router`` and more.

    Also ``vanilla_non_embedding`` (the compute-matched plain model of the same shape),
    ``pct_of_vanilla`` (non-embedding, in %), ``compute_depth``, ``distinct_layers`` and
    ``flops_per_token`` (see the module docstring).
    """
    config = model.config
    total = _numel(model)
    embedding = model.embed_in.weight.numel() + model.embed_out.weight.numel()
    non_embedding = total - embedding
    vanilla = non_embedding_of(config.compute_depth, config.d_model, config.mlp_ratio)
    return {
        "total": total,
        "embedding": embedding,
        "non_embedding": non_embedding,
        "router": _numel(model.state_passing),
        "shared_core": sum(_numel(core) for core in model.cores) if model.config.parsed_layout.is_shared else 0,
        "vanilla_non_embedding": vanilla,
        "pct_of_vanilla": 100.0 * non_embedding / vanilla,
        "compute_depth": config.compute_depth,
        "distinct_layers": config.distinct_layers,
        "flops_per_token": flops_per_token(model, seq_len),
    }
