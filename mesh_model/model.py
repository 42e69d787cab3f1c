"""The recursive GPT-NeoX: embeddings, prelude, core(s) with state passing, coda, head; any block's
MLP may be a mixture of experts (``ModelConfig.moe_*``, :mod:`mesh_model.moe`)."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mesh_model.config import ModelConfig
from mesh_model.depth import Depth, TokenExit, step_parameters
from mesh_model.errors import ConfigError
from mesh_model.init import SeededInit
from mesh_model.layers import Block, Stack, rotary_tables
from mesh_model.loss import IGNORE_INDEX, linear_cross_entropy, shifted_targets
from mesh_model.moe import BlockRouting, ExpertLinear, RouterCall, block_routing, combine
from mesh_model.schemes import StatePassing, build_state_passing, check_mesh_buffer


@dataclass
class ModelOutput:
    """``loss`` is the mean next-token cross-entropy when labels were given; ``logits`` is None
    when the forward pass was asked for the loss only (``return_logits=False``).

    ``hidden_states`` (when asked for) maps stage names to (N, L, D) tensors in order:
    ``embedding`` (h_emb), ``prelude``, ``h0`` .. ``hK``, ``coda`` (before the final LayerNorm).
    A vanilla layout has ``embedding``, ``prelude`` (all its layers) and ``coda``.

    ``core_outputs`` (asked for with the hidden states) maps ``f1`` .. ``fK`` to what core iteration
    t returned, f(h(t-1)), before the state passing makes h(t) of it: the block's own output, which
    the update probe compares with its input h(t-1). Empty for a vanilla layout.

    Mixture of experts (None for a dense model): ``loss`` stays the language-model loss alone;
    ``aux_lb`` and ``aux_z`` are the unweighted load-balancing and router z-losses, each the mean
    over every router call of the pass (a shared core's block counts once per loop iteration,
    :func:`mesh_model.moe.combine`); ``aux_loss`` = moe_aux_coef * aux_lb + moe_z_coef * aux_z is
    what training adds to ``loss``. ``mesh_z`` (MeSH with ``mesh_router_z_coef`` > 0, else None) is
    its routers' z-loss times that coefficient, also in ``aux_loss``. ``routing`` (asked for with ``return_routing``) maps each MoE
    block's module name (``prelude.0``, ``cores.0.1``, ``coda.0``) to its
    :class:`~mesh_model.moe.BlockRouting`: expert load, router entropy and the chosen-expert
    Jaccard between consecutive loop iterations; empty for a dense model.
    """

    logits: Tensor | None
    loss: Tensor | None = None
    hidden_states: dict[str, Tensor] | None = None
    core_outputs: dict[str, Tensor] | None = None
    aux_loss: Tensor | None = None
    aux_lb: Tensor | None = None
    aux_z: Tensor | None = None
    mesh_z: Tensor | None = None
    routing: dict[str, BlockRouting] | None = None
    loops_used: Tensor | None = None  # (N, L) core steps each token ran, with a per-token exit


def _embedding(vocab_size: int, d_model: int) -> nn.Embedding:
    """``nn.Embedding(vocab_size, d_model)``; on the meta device (a model built only to be counted)
    without the embedding's own Normal init, which :meth:`MeshTransformer.reset_parameters` redraws
    anyway: on meta that ``normal_`` runs torch's reference implementation, whose wrapper imports
    torch._dynamo, 1.5-3.5 s of a ``mesh-sweep`` or ``mesh-model params`` that has nothing to draw.
    Elsewhere unchanged, so the global generator's draws after a build, which the data order may
    read, stay as they were."""
    if torch.get_default_device().type == "meta":
        return nn.Embedding(vocab_size, d_model, _weight=torch.empty(vocab_size, d_model))
    return nn.Embedding(vocab_size, d_model)


class MeshTransformer(nn.Module):
    """Two build options that leave the math (and the parameter names) unchanged:

    * ``activation_checkpointing``: recompute each core iteration in backward instead of keeping
      its activations (memory of one iteration instead of K).
    * ``mesh_buffer``: MeSH's ``lean`` form (default) or the paper's ``explicit`` (B, N, L, D)
      buffer, the reference that tests and benchmarks compare it with.
    """

    def __init__(
        self,
        config: ModelConfig,
        activation_checkpointing: bool = False,
        mesh_buffer: str = "lean",
        init_seed: int | None = None,
    ) -> None:
        super().__init__()
        check_mesh_buffer(mesh_buffer)
        # Drawn before any module is built, so that a global seed pairs too (mesh_model.init).
        self.seeded_init = SeededInit(init_seed) if init_seed is not None else SeededInit.from_global_rng()
        self.config = config
        self.activation_checkpointing = activation_checkpointing
        layout = config.parsed_layout
        d, heads, hidden = config.d_model, config.n_heads, config.mlp_ratio * config.d_model
        moe_blocks = set(config.moe.blocks) if config.moe is not None else set()
        index = itertools.count()  # distinct blocks in build order: prelude, cores, coda

        def stack(n: int) -> Stack:
            return Stack(
                *(
                    Block(d, heads, hidden, config.layer_norm_eps, config.moe if next(index) in moe_blocks else None)
                    for _ in range(n)
                )
            )

        self.embed_in = _embedding(config.vocab_size, d)
        self.prelude = stack(layout.prelude)
        self.cores = nn.ModuleList(stack(n) for n in layout.cores)
        self.coda = stack(layout.coda)
        self.final_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.embed_out = nn.Linear(d, config.vocab_size, bias=False)
        self.state_passing: StatePassing | None = None
        if not layout.is_vanilla:
            self.state_passing = build_state_passing(
                config.scheme_spec,
                config.parameter_loops,
                d,
                config.slots,
                config.init_std,
                mesh_buffer,
                config.router_options,
            )
        self.core_schedule = layout.core_schedule
        self.embedding_scale = math.sqrt(d) if config.scale_embeddings else 1.0
        # The MoE blocks of each stack by module name, and each one's distinct-block index.
        names = [f"prelude.{i}" for i in range(layout.prelude)]
        names += [f"cores.{c}.{i}" for c, n in enumerate(layout.cores) for i in range(n)]
        names += [f"coda.{i}" for i in range(layout.coda)]
        self.moe_block_index = {name: i for i, name in enumerate(names) if i in moe_blocks}
        self._block_keys = {name: f"block{i}" for i, name in enumerate(names)}
        stacks = ["prelude", *(f"cores.{c}" for c in range(len(layout.cores))), "coda"]
        self._routed_names = {s: tuple(n for n in self.moe_block_index if n.rsplit(".", 1)[0] == s) for s in stacks}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights (MoE routers and experts too), zero biases, unit LayerNorms;
        output projections of every block (attention dense, MLP down or every expert's down) get
        std / sqrt(2 * compute depth). Each weight draws from its own seeded stream, keyed by its
        role (:meth:`init_key`), so variants built with one seed share every common tensor."""
        std = self.config.init_std
        out_std = std / math.sqrt(2 * self.config.compute_depth)
        projections = {id(module) for block in self.blocks() for module in block.output_projections()}
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding, ExpertLinear)):
                module_std = out_std if id(module) in projections else std
                self.seeded_init.normal_(module.weight, module_std, self.init_key(f"{name}.weight"))
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if self.state_passing is not None:
            self.state_passing.reset_parameters(self.seeded_init)

    def init_key(self, name: str) -> str:
        """The role of parameter ``name``: ``block<i>.<rest>`` for the i-th distinct block (build
        order: prelude, cores, coda), ``scheme/<rest>`` for the scheme's own, else ``name``."""
        parts = name.split(".")
        if parts[0] == "state_passing":
            return "scheme/" + ".".join(parts[1:])
        depth = 3 if parts[0] == "cores" else 2
        block = ".".join(parts[:depth])
        if block in self._block_keys:
            return ".".join([self._block_keys[block], *parts[depth:]])
        return name

    def blocks(self) -> list[Block]:
        """Every distinct block once."""
        return [b for s in (self.prelude, *self.cores, self.coda) for b in s]  # type: ignore[misc]

    def unrolled_stacks(self) -> list[Stack]:
        """The stacks in the order the forward pass runs them (a shared core appears K times)."""
        return [self.prelude, *(self.cores[i] for i in self.core_schedule), self.coda]

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        return_hidden_states: bool = False,
        return_logits: bool = True,
        return_routing: bool = False,
        depth: Depth | None = None,
    ) -> ModelOutput:
        """``labels`` (same shape as ``input_ids``, -100 ignored) give the shifted next-token loss.
        With ``return_logits=False`` and labels, the loss comes from the hidden states in chunks
        (:mod:`mesh_model.loss`) and the full logits are never formed: the training path.
        ``return_hidden_states`` also returns each core iteration's output (``core_outputs``);
        ``return_routing`` the MoE blocks' routing statistics (off in training: they cost).
        ``depth`` runs another loop count, truncated backprop or a per-token exit (mesh_model/depth.py)."""
        seq_len = input_ids.shape[1]
        if seq_len > self.config.max_seq_len:
            raise ValueError(f"input length {seq_len} exceeds max_seq_len={self.config.max_seq_len}")
        rope = rotary_tables(seq_len, self.config.rotary_dims, self.config.rotary_base, input_ids.device)
        stages: dict[str, Tensor] = {}
        mesh_z: Tensor | None = None
        core_outputs: dict[str, Tensor] = {}
        calls: list[tuple[str, RouterCall]] = []  # (MoE block name, its call), in the order run

        h_emb = self.embed_in(input_ids)
        if self.embedding_scale != 1.0:
            h_emb = h_emb * self.embedding_scale
        h, routed = self._run_stack("prelude", h_emb, rope, return_routing)
        calls += zip(self._routed_names["prelude"], routed, strict=True)
        if return_hidden_states:
            stages["embedding"], stages["prelude"] = h_emb, h

        loops_used = None
        if self.state_passing is not None:
            depth = depth or Depth()
            schedule = self.loop_schedule(depth.loops)
            rule, sets, last = depth.rule or self.config.loop_rule, self.config.parameter_loops, len(schedule) - 1
            grad_from = len(schedule) - depth.grad_loops if depth.grad_loops is not None else 0
            grad = torch.is_grad_enabled()
            state = self.state_passing.begin(h_emb, h)
            exiting = TokenExit(depth.exit, state.h, partial(self._readout, rope=rope)) if depth.exit else None
            if return_hidden_states:
                stages["h0"] = state.h
            for t, core_index in enumerate(schedule):
                with torch.set_grad_enabled(grad and t >= grad_from):  # truncated backprop
                    core_out, routed = self._run_core(core_index, state.h, rope, return_routing)
                    calls += zip(self._routed_names[f"cores.{core_index}"], routed, strict=True)
                    previous, state.final = state.h, t == last
                    state = self.state_passing.step(step_parameters(t, len(schedule), sets, rule), core_out, state)
                    if exiting is not None:
                        state.h = exiting.update(previous, state.h)
                if return_hidden_states:
                    core_outputs[f"f{t + 1}"], stages[f"h{t + 1}"] = core_out, state.h
            h = self.state_passing.end(state)
            mesh_z = self.state_passing.z_loss(state)
            loops_used = exiting.used if exiting is not None else None

        h, routed = self._run_stack("coda", h, rope, return_routing)
        calls += zip(self._routed_names["coda"], routed, strict=True)
        if return_hidden_states:
            stages["coda"] = h
        h = self.final_layer_norm(h)
        extras = self._router_outputs(calls, return_routing)
        if mesh_z is not None:
            extras.update(
                mesh_z=mesh_z, aux_loss=mesh_z if extras.get("aux_loss") is None else extras["aux_loss"] + mesh_z
            )
        extras.update(
            loops_used=loops_used,
            hidden_states=stages if return_hidden_states else None,
            core_outputs=core_outputs if return_hidden_states else None,
        )
        if labels is not None and not return_logits:
            loss = linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.embed_out.weight, shifted_targets(labels))
            return ModelOutput(logits=None, loss=loss, **extras)
        logits = self.embed_out(h)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), shifted_targets(labels), ignore_index=IGNORE_INDEX
            )
        return ModelOutput(logits=logits, loss=loss, **extras)

    def loop_schedule(self, loops: int | None = None) -> tuple[int, ...]:
        """The core index of every step of a pass of ``loops`` core steps (None: the layout's K).
        Only a layout with one core (``P+CRK+Q``) runs another count; any other refuses in one line."""
        if loops is None or loops == len(self.core_schedule):
            return self.core_schedule
        if not self.config.loopable:
            raise ConfigError(
                "loops",
                loops,
                f"layout {self.config.layout!r} has no single shared-weight core to loop again; "
                "only P+CRK+Q layouts run another loop count",
            )
        return (0,) * loops

    def _readout(self, h: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """Log-probabilities the coda and head give for state ``h`` (a per-token exit's ``output`` criterion)."""
        out, _ = self._run_stack("coda", h, rope, False)
        return F.log_softmax(self.embed_out(self.final_layer_norm(out)).float(), dim=-1)

    def _run_core(
        self, core_index: int, h: Tensor, rope: tuple[Tensor, Tensor], stats: bool
    ) -> tuple[Tensor, tuple[RouterCall, ...]]:
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._run_stack, f"cores.{core_index}", h, rope, stats, use_reentrant=False)
        return self._run_stack(f"cores.{core_index}", h, rope, stats)

    def _run_stack(
        self, name: str, h: Tensor, rope: tuple[Tensor, Tensor], stats: bool
    ) -> tuple[Tensor, tuple[RouterCall, ...]]:
        """A stack's output and its MoE blocks' router calls. A stack without MoE blocks is
        called as a module (its forward, hooks and all) and reports no calls."""
        stack = self.get_submodule(name)
        if not self._routed_names[name]:
            return stack(h, rope), ()
        return stack.run(h, rope, stats)

    def _router_outputs(self, calls: list[tuple[str, RouterCall]], return_routing: bool) -> dict:
        """ModelOutput's MoE fields from the pass's router calls (none in a dense model)."""
        out: dict = {"routing": {} if return_routing else None}
        moe = self.config.moe
        if moe is None or not calls:
            return out
        aux_lb, aux_z = combine([call for _, call in calls])
        out.update(aux_lb=aux_lb, aux_z=aux_z, aux_loss=moe.aux_coef * aux_lb + moe.z_coef * aux_z)
        if return_routing:
            by_block: dict[str, list[RouterCall]] = defaultdict(list)
            for name, call in calls:
                by_block[name].append(call)
            out["routing"] = {name: block_routing(self.moe_block_index[name], c) for name, c in by_block.items()}
        return out


def build_model(
    config: ModelConfig,
    activation_checkpointing: bool = False,
    mesh_buffer: str = "lean",
    init_seed: int | None = None,
) -> MeshTransformer:
    """Build the model for ``config`` on the current default device (``torch.device('meta')`` works).
    The options are :class:`MeshTransformer`'s; an unknown ``mesh_buffer`` is a ConfigError.
    ``init_seed`` fixes the initial weights (:mod:`mesh_model.init`); None draws it from torch's
    global generator."""
    return MeshTransformer(
        config, activation_checkpointing=activation_checkpointing, mesh_buffer=mesh_buffer, init_seed=init_seed
    )


__all__ = ["MeshTransformer", "ModelOutput", "build_model"]
