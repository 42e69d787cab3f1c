"""ModelConfig and the presets: Pythia shapes for the paper, small shapes for a CPU.

Every field is checked when the config is built, so a bad layout, scheme or size fails with
one line (a :class:`ConfigError`) before any tensor is allocated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from mesh_model.errors import ConfigError
from mesh_model.layout import Layout
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
}

_FIELD_NAMES: tuple[str, ...] = ()  # filled after the class is defined


@dataclass(frozen=True)
class ModelConfig:
    """Everything that determines the model's shape and behaviour.

    ``buffer_slots`` is MeSH's B; left as None it resolves to K+3 (the paper's rule), see
    :attr:`slots`. Other schemes ignore it.
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
    preset: str | None = None
    parsed_layout: Layout = field(init=False, repr=False, compare=False)
    scheme_spec: SchemeSpec = field(init=False, repr=False, compare=False)

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
        if self.init_std <= 0:
            raise ConfigError("init_std", self.init_std, "must be > 0")

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
        return self.replace(layout=str(self.compute_depth), scheme="base", buffer_slots=None)

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _FIELD_NAMES}

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A preset's shape and layout, with any field overridden (``scheme='mesh'``...)."""
        if name not in PRESETS:
            raise ConfigError("preset", name, f"known presets: {', '.join(PRESETS)}")
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
        values.update(overrides)
        return cls(**values)


def _check_field_names(values: dict[str, Any]) -> None:
    for key in values:
        if key not in _FIELD_NAMES:
            raise ConfigError("ModelConfig field", key, f"known fields: {', '.join(_FIELD_NAMES)}")


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.init)
