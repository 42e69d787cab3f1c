"""Parameter, FLOP and memory accounting: read off the built modules (meta-device models work),
or, for :func:`estimate_step_memory`, computed from the config before anything is built.

Conventions:

* ``embedding`` = input embedding + output projection (untied); ``non_embedding`` = the rest,
  which is what the paper reports. ``router`` = parameters of the state-passing module (MeSH's
  read/write routers, or the static/dynamic coefficients); they are part of ``non_embedding``.
* Mixture of experts: ``expert`` = every expert's weights and biases, ``moe_router`` = the MoE
  gates (Linear(D -> E) per MoE block), both part of ``non_embedding``. ``active_non_embedding``
  counts top_k / E of the expert parameters (what one token's forward pass applies through
  each distinct block) and everything else whole; ``active_total`` adds the embeddings (OLMoE's
  "active parameters" convention). A dense model's active counts equal its counts.
* ``flops_per_token`` counts matrix multiplies only (the MFU convention of PaLM, Chowdhery et
  al. 2022): 6 x (weights applied per token, every loop iteration counted) plus attention's
  QK^T and AV at 12 x layers x seq_len x d_model, counted as if non-causal. A MoE block counts
  its router and its top_k active experts only. LayerNorms, softmaxes, GELUs, rotary, the MoE
  gathers and gate products and the MeSH buffer mixing (O(B*D) per token) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from mesh_model.config import ModelConfig, MoESpec
from mesh_model.model import MeshTransformer
from mesh_model.moe import ExpertLinear, MoE
from mesh_model.schemes import mesh_router_parameters


def _numel(module: nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(p.numel() for p in module.parameters())


def _matmul_weights(module: nn.Module) -> int:
    """Matmul weights one token applies through ``module``: every Linear, a MoE's active share."""
    if isinstance(module, MoE):
        return module.active_matmul_weights()
    if isinstance(module, nn.Linear):
        return module.weight.numel()
    return sum(_matmul_weights(child) for child in module.children())


def non_embedding_of(layers: int, d_model: int, mlp_ratio: int = 4) -> int:
    """Closed form for a plain GPT-NeoX stack of ``layers`` blocks plus the final LayerNorm.

    Per block: QKV 3d^2+3d, dense d^2+d, MLP 2dh+h+d (h = mlp_ratio*d), two LayerNorms 4d. With
    the 4x MLP this is the paper's ``layers * (12 d^2 + 13 d) + 2 d``.
    """
    return layers * block_parameters(d_model, mlp_ratio * d_model) + 2 * d_model


def block_parameters(d_model: int, hidden: int, moe: MoESpec | None = None, active: bool = False) -> int:
    """One GPT-NeoX block: attention 4d^2+4d, two LayerNorms 4d, and the dense MLP 2dh+h+d or the
    MoE feed-forward: router dE plus E experts of 2dH+H+d (H = moe.hidden), of which ``active``
    counts top_k."""
    attention_and_norms = 4 * d_model * d_model + 8 * d_model
    if moe is None:
        return attention_and_norms + 2 * d_model * hidden + hidden + d_model
    experts = moe.top_k if active else moe.experts
    return attention_and_norms + d_model * moe.experts + experts * (2 * d_model * moe.hidden + moe.hidden + d_model)


def blocks_non_embedding(config: ModelConfig, active: bool = False) -> int:
    """Closed form of the distinct blocks and the final LayerNorm of ``config`` (MoE blocks
    included, state passing excluded); ``active`` counts top_k of each MoE block's experts."""
    d, hidden, moe = config.d_model, config.mlp_ratio * config.d_model, config.moe
    moe_blocks = set(moe.blocks) if moe is not None else set()
    blocks = sum(
        block_parameters(d, hidden, moe if i in moe_blocks else None, active) for i in range(config.distinct_layers)
    )
    return blocks + 2 * d


def flops_per_token(
    model: MeshTransformer,
    seq_len: int | None = None,
    loops: float | None = None,
    grad_loops: float | None = None,
) -> float:
    """Training (forward + backward) matmul FLOPs per token at ``seq_len`` (default max_seq_len).

    ``loops`` core steps run (default K; an expectation when K is sampled, experiments/loops.py),
    of which ``grad_loops`` backpropagate (default all; truncated backprop runs the others forward
    only). A core step costs its forward, 2 x (its weights) + 4 x (its layers) x seq_len x d_model
    of attention, always, and its backward (twice that) only when it backpropagates; the prelude,
    coda, head and MeSH's transition count forward and backward. Per-step weights (MeSH's write and
    read routers, the dynamic coefficients' Linear) count once per step run, whichever parameter
    set it uses. Only a one-core layout runs another ``loops`` than K. An int when the counts are."""
    config = model.config
    seq_len = seq_len or config.max_seq_len
    layout, d = config.parsed_layout, config.d_model
    fixed = sum(_matmul_weights(s) for s in (model.prelude, model.coda)) + model.embed_out.weight.numel()
    total: float = 6 * fixed + 12 * (layout.prelude + layout.coda) * seq_len * d
    if layout.is_vanilla:
        return int(total)
    step_weights, transition = _state_passing_weights(model)
    total += 6 * transition
    if loops is None and grad_loops is None or not config.loopable:
        model.loop_schedule(None if loops is None else int(loops))  # refuses another count in one line
        steps = [(_matmul_weights(model.cores[i]), layout.cores[i]) for i in layout.core_schedule]
        return int(total + sum(6 * (w + step_weights) + 12 * n * seq_len * d for w, n in steps))
    loops = layout.loops if loops is None else loops
    grad_loops = loops if grad_loops is None else min(grad_loops, loops)
    forward = 2 * (_matmul_weights(model.cores[0]) + step_weights) + 4 * layout.cores[0] * seq_len * d
    total += (loops + 2 * grad_loops) * forward
    return int(total) if float(total).is_integer() else total


def _state_passing_weights(model: MeshTransformer) -> tuple[int, int]:
    """(matmul weights the scheme applies per core step, those it applies once: MeSH's transition)."""
    passing, config = model.state_passing, model.config
    if passing is None:
        return 0, 0
    weights = _matmul_weights(passing)
    if config.scheme_spec.kind == "mesh":  # one write/read pair per parameter set, and the transition's
        pair = weights // (config.parameter_loops + 1)
        return pair, pair
    return weights // config.parameter_loops, 0


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
    vanilla = blocks_non_embedding(config.vanilla())
    experts = [m for m in model.modules() if isinstance(m, ExpertLinear)]
    expert = sum(_numel(m) for m in experts)
    inactive = sum(_numel(m) * (m.weight.shape[0] - m.active) // m.weight.shape[0] for m in experts)
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
        "expert": expert,
        "moe_router": sum(m.router.weight.numel() for m in model.modules() if isinstance(m, MoE)),
        "active_non_embedding": non_embedding - inactive,
        "active_total": total - inactive,
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
    d = config.d_model
    total = 2 * config.vocab_size * d + blocks_non_embedding(config)
    kind = config.scheme_spec.kind
    if config.parsed_layout.is_vanilla:
        return total
    sets = config.parameter_loops  # per-step parameter sets: K, max_loops, or 1 (shared routers)
    if kind == "mesh":
        total += mesh_router_parameters(sets, d, config.slots or 0)
    elif kind == "static":
        total += 3 * sets
    elif kind == "dynamic":
        total += sets * (3 * d + 3)
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
    keeps only each core iteration's input and recomputes one iteration at a time. A MoE block
    keeps, per token, k rows of its experts' activations (k x (2 x moe_hidden + 3 x d_model))
    instead of the dense MLP's 2 x hidden, plus its router's fp32 logits and probabilities.
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
    layer_bytes = [per_layer] * layout.distinct_layers  # per distinct block, in moe_layers order
    moe = config.moe
    if moe is not None:
        # A MoE block keeps per assignment (tokens x k rows) the gathered input, both expert
        # activations and the output before and after unsorting, in place of the dense MLP's
        # 2 x hidden; and per token the fp32 router logits and probabilities and int64 indices.
        moe_layer = (
            per_layer
            + tokens * moe.top_k * (2 * moe.hidden + 3 * d) * activation_bytes
            - tokens * 2 * hidden * activation_bytes
            + tokens * (2 * moe.experts * 4 + 3 * moe.top_k * 8)
        )
        for i in moe.blocks:
            layer_bytes[i] = moe_layer
    prelude = sum(layer_bytes[: layout.prelude])
    coda = sum(layer_bytes[layout.distinct_layers - layout.coda :])
    starts = [layout.prelude + sum(layout.cores[:c]) for c in range(len(layout.cores))]
    cores = [sum(layer_bytes[start : start + n]) for start, n in zip(starts, layout.cores, strict=True)]
    if activation_checkpointing and loops:
        saved = prelude + coda + max(cores) + loops * stream  # each iteration's input; one recomputed
    else:
        saved = prelude + sum(cores[i] for i in layout.core_schedule) + coda
    saved += loops * stream  # what a scheme keeps per step (h(t+1) beside the core output)
    saved += 4 * stream + config.vocab_size * d * 4  # h_emb (scaled), final LN, the loss's gradients
    mesh = 0
    if config.scheme_spec.kind == "mesh" and loops:
        mesh = mesh_coefficient_elements(loops, config.slots or 0, d, tokens) * param_bytes
    chunk = _LOSS_CHUNK["accelerator" if accelerator else "cpu"]
    rows = min(tokens, max(128, chunk // config.vocab_size))
    workspace = rows * config.vocab_size * (4 + (2 if mixed else 0))  # one chunk of logits
    mlp_backward = 2 * max(hidden, moe.top_k * moe.hidden if moe is not None else 0)
    workspace += tokens * mlp_backward * activation_bytes + 4 * stream  # a block's backward
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
