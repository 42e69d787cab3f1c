"""ModelConfig and the presets: Pythia shapes for the paper, small shapes for a CPU.

Every field is checked when the config is built, so a bad layout, scheme, size or MoE option
fails with one line (a :class:`ConfigError`) before any tensor is allocated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mesh_model.depth import MESH_ROUTERS, check_loop_rule
from mesh_model.errors import ConfigError, did_you_mean
from mesh_model.layout import Layout
from mesh_model.mesh_router import RouterOptions
from mesh_model.scheme_names import SchemeSpec


@dataclass(frozen=True)
class Preset:
    """A model shape. ``layers`` is the vanilla depth; ``layout`` the paper's recurrent layout."""

    d_model: int
    n_heads: int
    layers: int
    layout: str
    vocab_size: int
    max_seq_len: int
    lr: float
    moe_experts: int | None = None  # a mixture-of-experts preset: E, top-k and expert width
    moe_top_k: int | None = None
    moe_hidden: int | None = None


# Pythia shapes (hidden size, layers, heads; 4x MLP; rotary on 25% of head dims, base 10000).
# Vocabularies are Pythia's padded sizes: 50304, except 6.9B whose checkpoint pads to 50432.
# max_seq_len is the paper's training length (4096); rotary needs no learned positions.
# Layouts are the paper's; 70M is not in the paper and gets the 160M pattern at half depth.
# Peak learning rates are Pythia's.
PRESETS: dict[str, Preset] = {
    "pythia-70m": Preset(512, 8, 6, "1+2R2+1", 50304, 4096, 1e-3),
    "pythia-160m": Preset(768, 12, 12, "2+4R2+2", 50304, 4096, 6e-4),
    "pythia-410m": Preset(1024, 16, 24, "4+8R2+4", 50304, 4096, 3e-4),
    "pythia-1b": Preset(2048, 8, 16, "3+5R2+3", 50304, 4096, 3e-4),
    "pythia-1.4b": Preset(2048, 16, 24, "4+8R2+4", 50304, 4096, 2e-4),
    "pythia-2.8b": Preset(2560, 32, 32, "6+10R2+6", 50304, 4096, 1.6e-4),
    "pythia-6.9b": Preset(4096, 32, 32, "6+10R2+6", 50432, 4096, 1.2e-4),
    # CPU presets: tiny trains in seconds, mini in about a minute, small in minutes (2 cores).
    # Their vocabulary matches the small byte-level BPE trained on the embedded corpus.
    "tiny": Preset(64, 4, 6, "1+2R2+1", 2048, 256, 3e-3),
    "mini": Preset(128, 4, 12, "2+4R2+2", 4096, 512, 2e-3),
    "small": Preset(256, 8, 12, "2+4R2+2", 8192, 1024, 1e-3),
    # Mixture-of-experts feed-forward in every block (mesh_model/moe.py). The CPU presets are tiny
    # and mini with E=8 experts, top-2, each expert half the dense MLP's width: the two active
    # experts apply the dense MLP's weights per token (plus the router and one more bias).
    "tiny-moe": Preset(64, 4, 6, "1+2R2+1", 2048, 256, 3e-3, moe_experts=8, moe_top_k=2, moe_hidden=128),
    "mini-moe": Preset(128, 4, 12, "2+4R2+2", 4096, 512, 2e-3, moe_experts=8, moe_top_k=2, moe_hidden=256),
    # The paper's looped OLMoE budget, 2.6B total / 512M active parameters (OLMoE's convention:
    # embeddings included): OLMoE-1B-7B's routing (64 experts, top-8, expert width 1024) on the
    # paper's main layout 4+8R2+4, with the width chosen to meet the budget: d_model 1152 (18
    # heads of 64, Pythia's head size). Counts: 2,620,311,808 total, 504,432,896 active
    # (tests/test_moe.py). OLMoE's peak learning rate.
    "olmoe-2.6b": Preset(1152, 18, 24, "4+8R2+4", 50304, 4096, 4e-4, moe_experts=64, moe_top_k=8, moe_hidden=1024),
}
MOE_PRESET_FIELDS = ("moe_experts", "moe_top_k", "moe_hidden")
MOE_FIELDS = ("moe_experts", "moe_top_k", "moe_hidden", "moe_layers", "moe_aux_coef", "moe_z_coef")
MESH_ROUTER_FIELDS = tuple(RouterOptions.FIELDS.values())
# The loop-count settings (mesh_model/depth.py) at the values that build and run the model as it
# always was: left out of to_dict (and so of a run's hash) there.
DEPTH_DEFAULTS: dict[str, Any] = {"max_loops": None, "loop_rule": "last", "mesh_routers": "per_step"}
MOE_LAYERS_FORMS = (
    "use 'all', a stride n >= 1 (the blocks whose index % n == n-1) or a list of block indices; blocks "
    "are numbered over the distinct blocks, prelude first, then each core, then the coda"
)
# OLMoE's coefficients of the load-balancing loss and the router z-loss.
DEFAULT_AUX_COEF = 0.01
DEFAULT_Z_COEF = 0.001


@dataclass(frozen=True)
class MoESpec:
    """The resolved mixture-of-experts feed-forward of a config (``ModelConfig.moe``).

    ``blocks`` are the distinct-block indices (see :attr:`ModelConfig.moe_layers`) whose MLP is a
    mixture of ``experts`` experts of width ``hidden``, ``top_k`` chosen per token.
    """

    experts: int
    top_k: int
    hidden: int
    blocks: tuple[int, ...]
    aux_coef: float
    z_coef: float

    @property
    def active_fraction(self) -> float:
        """The share of the expert parameters a token applies: top_k / experts."""
        return self.top_k / self.experts


_FIELD_NAMES: tuple[str, ...] = ()  # filled after the class is defined


@dataclass(frozen=True)
class ModelConfig:
    """Everything that determines the model's shape and behaviour.

    ``buffer_slots`` is MeSH's B; left as None it resolves to K+3 (the paper's rule), see
    :attr:`slots`. Other schemes ignore it.

    Mixture of experts (OLMoE style, :mod:`mesh_model.moe`): ``moe_experts`` (E) set turns it on;
    unset (None), the model is dense and every other ``moe_*`` field must stay unset too. Left
    unset under MoE, the others resolve (see :attr:`moe`) to: ``moe_top_k`` min(2, E);
    ``moe_hidden`` mlp_ratio * d_model // top_k (the active experts' width equals the dense MLP's);
    ``moe_layers`` ``"all"``; ``moe_aux_coef`` 0.01 and ``moe_z_coef`` 0.001 (OLMoE's).

    ``mesh_router_*`` and ``mesh_final_read`` are MeSH's open choices (:mod:`mesh_model.mesh_router`,
    resolved into :attr:`router_options`); at their defaults they leave the model and its dict (and
    so a run's hash) as they were before they existed, and only ``scheme=mesh`` may set them.

    Loop count (:mod:`mesh_model.depth`): ``max_loops`` builds per-step parameters (MeSH's routers,
    the static/dynamic coefficients) for that many core steps instead of K (>= K; sampled-K
    training up to a cap); ``loop_rule`` (``last`` or ``cycle``) says which of them a pass of
    another loop count uses; ``mesh_routers=shared`` gives MeSH one write/read pair for the
    transition and one for every core step, whatever the loop count. At their defaults they are
    left out of :meth:`to_dict`, so a run's hash is what it was before they existed.

    ``moe_layers`` indexes the distinct blocks in the order they are built: the prelude's
    blocks 0..P-1, then each core's blocks, then the coda's (``1+2R2+1``: prelude 0, core 1-2,
    coda 3; a vanilla layout's blocks are its layers). A shared core's block is one module, so
    it is MoE in every one of its K loop iterations. ``"all"`` (or 1), a stride n (the blocks
    whose index % n == n-1: 2 gives 1, 3, 5...), or a list of indices.
    """

    layout: str = "1+2R2+1"
    scheme: str = "base"
    buffer_slots: int | None = None
    d_model: int = 64
    n_heads: int = 4
    vocab_size: int = 2048
    max_seq_len: int = 256
    mlp_ratio: int = 4
    rotary_pct: float = 0.25
    rotary_base: float = 10000.0
    layer_norm_eps: float = 1e-5
    scale_embeddings: bool = True
    init_std: float = 0.02
    moe_experts: int | None = None
    moe_top_k: int | None = None
    moe_hidden: int | None = None
    moe_layers: str | int | tuple[int, ...] | None = None
    moe_aux_coef: float | None = None
    moe_z_coef: float | None = None
    mesh_router_init: str = "uniform"
    mesh_router_own_weight: float = 0.9
    mesh_router_norm: str = "none"
    mesh_router_temperature: float = 1.0
    mesh_router_z_coef: float = 0.0
    mesh_final_read: str = "read"
    max_loops: int | None = None
    loop_rule: str = "last"
    mesh_routers: str = "per_step"
    preset: str | None = None
    parsed_layout: Layout = field(init=False, repr=False, compare=False)
    scheme_spec: SchemeSpec = field(init=False, repr=False, compare=False)
    moe: MoESpec | None = field(init=False, repr=False, compare=False)
    router_options: RouterOptions = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layout = Layout.parse(self.layout)
        spec = SchemeSpec.parse(self.scheme)
        object.__setattr__(self, "layout", layout.text)
        object.__setattr__(self, "scheme", spec.canonical)
        object.__setattr__(self, "parsed_layout", layout)
        object.__setattr__(self, "scheme_spec", spec)
        self._check_sizes()
        if layout.is_vanilla and spec.kind != "base":
            raise ConfigError(
                "scheme",
                self.scheme,
                f"layout {layout.text!r} has no core to pass state between; use scheme=base, "
                "or a layout with a core such as 4+8R2+4 (shared) or 4+8+8+4 (non-shared)",
            )
        if self.buffer_slots is not None and (
            not isinstance(self.buffer_slots, int) or isinstance(self.buffer_slots, bool) or self.buffer_slots < 1
        ):
            raise ConfigError(
                "buffer_slots", self.buffer_slots, "MeSH needs at least 1 slot (the paper's rule is B=K+3)"
            )
        object.__setattr__(self, "moe", self._resolve_moe())
        object.__setattr__(self, "router_options", self._resolve_router())
        self._check_depth()

    def _check_depth(self) -> None:
        layout, kind = self.parsed_layout, self.scheme_spec.kind
        check_loop_rule(self.loop_rule)
        if self.mesh_routers not in MESH_ROUTERS:
            raise ConfigError("mesh_routers", self.mesh_routers, f"use one of {', '.join(MESH_ROUTERS)}")
        if self.mesh_routers != "per_step" and kind != "mesh":
            raise ConfigError("mesh_routers", self.mesh_routers, f"only scheme=mesh has routers (scheme={self.scheme})")
        if self.max_loops is None:
            return
        if layout.is_vanilla or len(layout.cores) != 1:
            raise ConfigError(
                "max_loops", self.max_loops, f"layout {layout.text!r} has no single looped core; use a P+CRK+Q layout"
            )
        if isinstance(self.max_loops, bool) or not isinstance(self.max_loops, int) or self.max_loops < layout.loops:
            raise ConfigError("max_loops", self.max_loops, f"an integer >= the layout's K={layout.loops} (null: K)")

    def _resolve_router(self) -> RouterOptions:
        options = RouterOptions(**{name: getattr(self, f) for name, f in RouterOptions.FIELDS.items()})
        changed = options.changed
        if changed and self.scheme_spec.kind != "mesh":
            name, value = next(iter(changed.items()))
            raise ConfigError(name, value, f"only scheme=mesh has routers (scheme={self.scheme}): drop {name}")
        return options

    def _resolve_moe(self) -> MoESpec | None:
        if self.moe_experts is None:
            for name in MOE_FIELDS[1:]:
                if getattr(self, name) is not None:
                    raise ConfigError(
                        name, getattr(self, name), "MoE is off (moe_experts unset): set moe_experts to use it"
                    )
            return None
        object.__setattr__(self, "moe_layers", _canonical_moe_layers(self.moe_layers))
        experts = self.moe_experts
        if not _is_int(experts) or experts < 1:
            raise ConfigError("moe_experts", experts, "need at least 1 expert; leave it unset for the dense MLP")
        top_k = min(2, experts) if self.moe_top_k is None else self.moe_top_k
        if not _is_int(top_k) or not 1 <= top_k <= experts:
            raise ConfigError("moe_top_k", top_k, f"must be an integer from 1 to moe_experts={experts}")
        hidden = self.mlp_ratio * self.d_model // top_k if self.moe_hidden is None else self.moe_hidden
        if not _is_int(hidden) or hidden < 1:
            raise ConfigError("moe_hidden", hidden, "must be a positive integer (an expert's MLP width)")
        for name in ("moe_aux_coef", "moe_z_coef"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
                raise ConfigError(name, value, "must be a number >= 0 (0 switches the loss off)")
        return MoESpec(
            experts=experts,
            top_k=top_k,
            hidden=hidden,
            blocks=self._moe_blocks(),
            aux_coef=float(DEFAULT_AUX_COEF if self.moe_aux_coef is None else self.moe_aux_coef),
            z_coef=float(DEFAULT_Z_COEF if self.moe_z_coef is None else self.moe_z_coef),
        )

    def _moe_blocks(self) -> tuple[int, ...]:
        layers, blocks = self.moe_layers, self.distinct_layers
        if layers is None or layers == "all":
            return tuple(range(blocks))
        if isinstance(layers, int):
            if not 1 <= layers <= blocks:
                raise ConfigError(
                    "moe_layers", layers, f"a stride must be from 1 to the {blocks} blocks of layout {self.layout!r}"
                )
            return tuple(i for i in range(blocks) if i % layers == layers - 1)
        if not isinstance(layers, tuple) or not layers or any(not 0 <= i < blocks for i in layers):
            raise ConfigError(
                "moe_layers",
                list(layers),
                f"layout {self.layout!r} has blocks {self._block_ranges()}; {MOE_LAYERS_FORMS}",
            )
        return layers

    def _block_ranges(self) -> str:
        """``0..3 (prelude: 0, core: 1-2, coda: 3)``: the distinct-block numbering of the layout."""
        layout, parts, start = self.parsed_layout, [], 0
        named = [
            ("prelude", layout.prelude),
            *(("core" if len(layout.cores) == 1 else f"core {i}", n) for i, n in enumerate(layout.cores)),
            ("coda", layout.coda),
        ]
        for name, size in named:
            if size:
                parts.append(f"{name}: {start}" + (f"-{start + size - 1}" if size > 1 else ""))
            start += size
        return f"0..{start - 1}" + (f" ({', '.join(parts)})" if not layout.is_vanilla else "")

    def _check_sizes(self) -> None:
        positive = {
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "vocab_size": self.vocab_size,
            "max_seq_len": self.max_seq_len,
            "mlp_ratio": self.mlp_ratio,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, value, "must be a positive integer")
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", self.n_heads, f"must divide d_model={self.d_model}")
        rotary = self.rotary_dims
        if not 0.0 <= self.rotary_pct <= 1.0 or rotary % 2:
            raise ConfigError(
                "rotary_pct",
                self.rotary_pct,
                f"must be in [0, 1] and give an even number of rotary dims (head_dim={self.head_dim} gives {rotary})",
            )
        for name in ("rotary_base", "layer_norm_eps", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(name, value, "must be a finite number > 0")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def rotary_dims(self) -> int:
        return int(self.head_dim * self.rotary_pct)

    @property
    def loops(self) -> int:
        return self.parsed_layout.loops

    @property
    def compute_depth(self) -> int:
        return self.parsed_layout.compute_depth

    @property
    def distinct_layers(self) -> int:
        return self.parsed_layout.distinct_layers

    @property
    def variant(self) -> str:
        """The name of the run's variant: ``vanilla`` for a plain stack of layers, else the
        canonical scheme name (``anchor*`` -> ``anchor_emb``)."""
        return "vanilla" if self.parsed_layout.is_vanilla else self.scheme

    @property
    def parameter_loops(self) -> int:
        """The core steps that have parameters of their own (mesh_model/depth.py): 1 for MeSH's
        shared routers, else ``max_loops`` or K."""
        if self.mesh_routers == "shared":
            return 1
        return self.max_loops if self.max_loops is not None else self.loops

    @property
    def loopable(self) -> bool:
        """True when the core can run another number of times than K: one core, shared weights."""
        return len(self.parsed_layout.cores) == 1

    @property
    def slots(self) -> int | None:
        """MeSH's resolved B: ``buffer_slots``, or K+3 when left unset; None for other schemes."""
        if self.scheme_spec.kind != "mesh":
            return None
        return self.buffer_slots if self.buffer_slots is not None else self.loops + 3

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        _check_field_names(changes)
        return dataclasses.replace(self, **changes)

    def vanilla(self) -> ModelConfig:
        """The compute-matched vanilla model: same shape, ``compute_depth`` plain layers."""
        defaults = {f: getattr(RouterOptions, name) for name, f in RouterOptions.FIELDS.items()}
        defaults.update(DEPTH_DEFAULTS)
        return self.replace(layout=str(self.compute_depth), scheme="base", buffer_slots=None, **defaults)

    def to_dict(self) -> dict[str, Any]:
        """The init fields, ``ModelConfig(**to_dict())`` rebuilds the config. The ``moe_*`` fields
        appear resolved (``moe_top_k=None`` and ``moe_top_k=2`` are one model) and only when MoE is
        on, so a dense config's dict (and a run's hash, experiments/identity.py) is what it was
        before MoE existed. MeSH's router options and the loop-count settings likewise appear only when
        set away from their defaults."""
        values = {f: getattr(self, f) for f in _FIELD_NAMES if f not in MOE_FIELDS and f not in MESH_ROUTER_FIELDS}
        values.update(self.router_options.changed)
        for name, default in DEPTH_DEFAULTS.items():
            if values[name] == default:
                del values[name]
        if self.moe is not None:
            moe = self.moe
            given = self.moe_layers if self.moe_layers is not None else "all"
            layers = list(given) if isinstance(given, tuple) else given  # YAML- and JSON-friendly
            resolved = (moe.experts, moe.top_k, moe.hidden, layers, moe.aux_coef, moe.z_coef)
            values.update(zip(MOE_FIELDS, resolved, strict=True))
        return values

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A preset's shape and layout, with any field overridden (``scheme='mesh'``...)."""
        if name not in PRESETS:
            raise ConfigError("preset", name, f"{did_you_mean(name, PRESETS)}known presets: {', '.join(PRESETS)}")
        _check_field_names(overrides)
        preset = PRESETS[name]
        values: dict[str, Any] = {
            "layout": preset.layout,
            "d_model": preset.d_model,
            "n_heads": preset.n_heads,
            "vocab_size": preset.vocab_size,
            "max_seq_len": preset.max_seq_len,
            "preset": name,
        }
        # A MoE preset's experts, unless the overrides switch MoE off (moe_experts=None).
        if overrides.get("moe_experts", preset.moe_experts) is not None:
            values.update({f: getattr(preset, f) for f in MOE_PRESET_FIELDS if getattr(preset, f) is not None})
        values.update(overrides)
        return cls(**values)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _canonical_moe_layers(value: Any) -> str | int | tuple[int, ...] | None:
    """``moe_layers`` in one spelling: None, ``"all"`` (also for 1), a stride >= 2, or a sorted
    tuple of distinct indices (a list from YAML becomes one). Whether the indices exist in the
    layout is checked once the layout is known (:meth:`ModelConfig._moe_blocks`)."""
    if value is None or value == "all":
        return value
    if _is_int(value):
        if value < 1:
            raise ConfigError("moe_layers", value, MOE_LAYERS_FORMS)
        return "all" if value == 1 else value
    if isinstance(value, Sequence) and not isinstance(value, str):
        indices = tuple(value)
        if indices and all(_is_int(i) for i in indices) and len(set(indices)) == len(indices):
            return tuple(sorted(indices))
    raise ConfigError("moe_layers", value, MOE_LAYERS_FORMS)


def _check_field_names(values: dict[str, Any]) -> None:
    for key in values:
        if key not in _FIELD_NAMES:
            raise ConfigError("ModelConfig field", key, f"known fields: {', '.join(_FIELD_NAMES)}")


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.init)
