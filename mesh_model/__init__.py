"""MeSH: recursive GPT-NeoX transformers with every state-passing scheme of the paper.

Pure PyTorch. Public API::

    from mesh_model import ModelConfig, build_model, count_parameters
    config = ModelConfig.from_preset("pythia-410m", layout="4+8R2+4", scheme="mesh")
    model = build_model(config)
    out = model(input_ids, labels=input_ids)   # out.logits, out.loss
"""

from mesh_model.accounting import count_parameters, flops_per_token, non_embedding_of
from mesh_model.config import PRESETS, ModelConfig, Preset
from mesh_model.errors import ConfigError
from mesh_model.hf_interop import from_hf_gpt_neox, to_hf_gpt_neox
from mesh_model.layout import Layout
from mesh_model.model import MeshTransformer, ModelOutput, build_model
from mesh_model.schemes import SchemeSpec

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
    "flops_per_token",
    "from_hf_gpt_neox",
    "non_embedding_of",
    "to_hf_gpt_neox",
]
