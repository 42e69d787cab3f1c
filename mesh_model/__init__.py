"""MeSH: recursive GPT-NeoX transformers with every state-passing scheme of the paper.

Pure PyTorch. Public API::

    from mesh_model import ModelConfig, build_model, count_parameters
    config = ModelConfig.from_preset("pythia-410m", layout="4+8R2+4", scheme="mesh")
    model = build_model(config)
    out = model(input_ids, labels=input_ids)   # out.logits, out.loss

The names below are imported on first use (PEP 562), so ``from mesh_model import ConfigError``
or ``mesh_model.cli_text`` does not import torch: a CLI's ``--help`` answers at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "count_parameters": "accounting",
    "flops_per_token": "accounting",
    "non_embedding_of": "accounting",
    "PRESETS": "config",
    "ModelConfig": "config",
    "Preset": "config",
    "ConfigError": "errors",
    "did_you_mean": "errors",
    "from_hf_gpt_neox": "hf_interop",
    "to_hf_gpt_neox": "hf_interop",
    "Layout": "layout",
    "MeshTransformer": "model",
    "ModelOutput": "model",
    "build_model": "model",
    "SchemeSpec": "scheme_names",
}
__all__ = [
    "PRESETS",
    "ConfigError",
    "Layout",
    "MeshTransformer",
    "ModelConfig",
    "ModelOutput",
    "Preset",
    "SchemeSpec",
    "build_model",
    "count_parameters",
    "did_you_mean",
    "flops_per_token",
    "from_hf_gpt_neox",
    "non_embedding_of",
    "to_hf_gpt_neox",
]
assert sorted(__all__) == sorted(_EXPORTS)

if TYPE_CHECKING:
    from mesh_model.accounting import count_parameters, flops_per_token, non_embedding_of
    from mesh_model.config import PRESETS, ModelConfig, Preset
    from mesh_model.errors import ConfigError, did_you_mean
    from mesh_model.hf_interop import from_hf_gpt_neox, to_hf_gpt_neox
    from mesh_model.layout import Layout
    from mesh_model.model import MeshTransformer, ModelOutput, build_model
    from mesh_model.scheme_names import SchemeSpec


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mesh_model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mesh_model.{_EXPORTS[name]}"), name)
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
