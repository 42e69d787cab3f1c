"""Parameter, FLOP and memory accounting: read off the built modules (meta-device models work),
or, for :func:`estimate_step_memory`, computed from the config before anything is built.

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

from dataclasses import dataclass

from torch import nn

from mesh_model.config import ModelConfig
from mesh_model.model import MeshTransformer
from mesh_model.schemes import mesh_router_parameters


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


# --- Memory of one training step -------------------------------------------------------------

# Logits per chunk of the training loss (mesh_model/loss.py): the transient it adds.
_LOSS_CHUNK = {"cpu": 1 << 20, "accelerator": 1 << 26}
GB = 1e9
# The first training step of a process allocates about 0.1 GB that no tensor accounts for
# (measured on the CPU: OpenMP/oneDNN thread pools and kernels; on a GPU, cuBLAS workspaces).
RUNTIME_BYTES = 150_000_000
# Allocators hold more than the live tensors (glibc's heap fragments between the many small
# tensors of a loop; CUDA's caching allocator rounds blocks): this share of the activations more.
ALLOCATOR_OVERHEAD = 0.2


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training step (forward, backward, AdamW) holds at its peak, by part.

    ``activations`` includes ``mesh_coefficients`` (what MeSH's lean buffer keeps for backward)
    and the backward pass's own transients; it is what grows with batch, seq_len and K.
    """

    parameters: int  # the weights (and, under mixed precision, autocast's low-precision copy)
    gradients: int
    optimizer: int  # AdamW's two moments
    activations: int
    mesh_coefficients: int
    runtime: int = RUNTIME_BYTES  # what torch allocates on first use (thread pools, kernels, workspaces)

    @property
    def params_and_optimizer(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.params_and_optimizer + self.activations + self.runtime

    def describe(self) -> str:
        """``21.3 GB (params+optimizer 0.01, activations 21.2 incl. MeSH coefficients 0.4, runtime 0.15)``."""
        parts = f"params+optimizer {_gb(self.params_and_optimizer)}, activations {_gb(self.activations)}"
        if self.mesh_coefficients:
            parts += f" incl. MeSH coefficients {_gb(self.mesh_coefficients)}"
        return f"{_gb(self.total)} GB ({parts}, runtime {_gb(self.runtime)})"


def _gb(n: int) -> str:
    value = n / GB
    return f"{value:.1f}" if value >= 0.95 else f"{value:.2f}" if value >= 0.01 else "<0.01"


def parameter_count(config: ModelConfig) -> int:
    """Every parameter of ``build_model(config)``, from the config alone (no model is built)."""
    d, loops = config.d_model, config.loops
    total = 2 * config.vocab_size * d + non_embedding_of(config.distinct_layers, d, config.mlp_ratio)
    kind = config.scheme_spec.kind
    if config.parsed_layout.is_vanilla:
        return total
    if kind == "mesh":
        total += mesh_router_parameters(loops, d, config.slots or 0)
    elif kind == "static":
        total += 3 * loops
    elif kind == "dynamic":
        total += loops * (3 * d + 3)
    return total


def mesh_coefficient_elements(loops: int, slots: int, d_model: int, tokens: int) -> int:
    """What MeSH's lean form keeps for backward beyond the core outputs, in elements.

    The read of step i (i = 1..K+1, the transition first) stacks the i write weights written so
    far into a (tokens, i, B) tensor and multiplies it with its read weights; autograd keeps that
    stack, the (tokens, i) coefficients, the step's (tokens, B) softmaxes and the (2B, D+1)
    concatenated router weights. Summed over the steps:
    tokens * ((K+1)(K+2)/2 * (B+1) + 4B(K+1)) + 2B(D+1)(K+1). With MeSH's default B = K+3 the
    first term grows as K^3/2 per token (K^2 at a fixed B).
    """
    reads = loops + 1
    per_token = reads * (reads + 1) // 2 * (slots + 1) + 4 * slots * reads
    return tokens * per_token + 2 * slots * (d_model + 1) * reads


def estimate_step_memory(
    config: ModelConfig,
    batch: int,
    seq_len: int,
    activation_bytes: int = 4,
    param_bytes: int = 4,
    activation_checkpointing: bool = False,
    accelerator: bool = False,
    param_shards: int = 1,
) -> MemoryEstimate:
    """Peak memory of one training step of ``build_model(config)`` on ``batch`` x ``seq_len``
    tokens, as ``mesh-train`` runs it (chunked loss, AdamW), before anything is allocated.

    ``activation_bytes`` is the size of a matmul output (2 under bf16/fp16 autocast, else
    ``param_bytes``); the residual stream, LayerNorm inputs and MeSH's routing stay in
    ``param_bytes`` under autocast. Per layer run, autograd keeps 16 (tokens x d_model) tensors
    (the block input, both LayerNorm outputs, q/k/v, attention output and its copy, the 4x MLP
    input and GELU output) plus the rotary tables and softmax statistics; ``activation_checkpointing``
    keeps only each core iteration's input and recomputes one iteration at a time.
    ``param_shards`` > 1 (FSDP) divides parameters, gradients and optimizer state over the
    devices. The estimate is meant to be conservative; ``benchmarks/memory_estimate.py`` checks
    it against measurement.
    """
    params = -(-parameter_count(config) // max(param_shards, 1))
    mixed = activation_bytes < param_bytes
    tokens, d = batch * seq_len, config.d_model
    hidden, heads, head_dim = config.mlp_ratio * d, config.n_heads, config.head_dim
    stream = tokens * d * param_bytes  # one (tokens, d_model) tensor of the residual stream
    per_layer = (
        stream
        + tokens * (7 * d + 2 * hidden) * activation_bytes  # LN outputs 2d, qkv 3d, attention out + copy 2d; MLP
        + 9 * seq_len * head_dim * activation_bytes  # the rotary tables of the fused rotary
        + tokens * (heads + 4) * 4  # attention's logsumexp, LayerNorms' mean and rstd (fp32)
    )
    layout = config.parsed_layout
    loops = layout.loops
    if activation_checkpointing and loops:
        kept_layers = layout.prelude + layout.coda + max(layout.cores)
        saved = kept_layers * per_layer + loops * stream  # each iteration's input; one recomputed
    else:
        saved = layout.compute_depth * per_layer
    saved += loops * stream  # what a scheme keeps per step (h(t+1) beside the core output)
    saved += 4 * stream + config.vocab_size * d * 4  # h_emb (scaled), final LN, the loss's gradients
    mesh = 0
    if config.scheme_spec.kind == "mesh" and loops:
        mesh = mesh_coefficient_elements(loops, config.slots or 0, d, tokens) * param_bytes
    chunk = _LOSS_CHUNK["accelerator" if accelerator else "cpu"]
    rows = min(tokens, max(128, chunk // config.vocab_size))
    workspace = rows * config.vocab_size * (4 + (2 if mixed else 0))  # one chunk of logits
    workspace += tokens * 2 * hidden * activation_bytes + 4 * stream  # a block's backward
    if mesh:  # backward: the last read's stack gradient and a gradient per written value
        workspace += tokens * (loops + 1) * ((config.slots or 0) + 1) * param_bytes + (loops + 1) * stream
    weights = params * param_bytes + (params * activation_bytes if mixed else 0)
    return MemoryEstimate(
        parameters=weights,
        gradients=params * param_bytes,
        optimizer=2 * params * param_bytes,
        activations=round((saved + mesh + workspace) * (1 + ALLOCATOR_OVERHEAD)),
        mesh_coefficients=mesh,
    )
