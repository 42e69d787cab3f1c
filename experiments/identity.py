"""What makes two runs the same run: one definition for the run hash and for table rows.

A run is identified by what it computes: the resolved model (:func:`model_config_for`, the one
place ``scheme=vanilla`` is resolved) and every other config key except those in
:data:`RUN_INVARIANT_KEYS`, which say where a run is logged, how fast it goes or how often it
reports. Equivalent spellings (``anchor*`` / ``anchor_emb``, ``2+4r2+2`` / ``2+4R2+2``, MeSH with
``buffer_slots`` left to its default or set to K+3) resolve to the same model and the same hash.

``results`` groups runs into table rows with :func:`distinguishes_rows`: two runs are replicates
of one row when they differ only in keys that are run-invariant, in the seed, or in what is
derived from the others.

A run's names follow from its identity: :func:`run_key` (its folder, hash last), :func:`run_name`
(its name in MLflow, what differs between the runs of a grid first) and :func:`model_params` (the
resolved model as MLflow params). The plain model is ``vanilla`` in all three.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from mesh_model import PRESETS, ConfigError, ModelConfig, SchemeSpec, did_you_mean

# Config keys (dotted; a key covers its children) that do not change what a run computes.
RUN_INVARIANT_KEYS = (
    "tracking",
    "runs_dir",
    "resume",
    "probes",
    "depth_eval",  # evaluations of the finished run (docs/depth.md)
    "search",
    "data.num_workers",
    "data.cache_dir",
    "data.check_path",  # only whether data.path is checked before the run starts
    "compile",  # the same math, traced into one graph
    "activation_checkpointing",  # the same math, recomputed in backward
    "allow_large",  # only whether the memory check may stop the run
    "allow_nonfinite",  # only whether a non-finite loss stops the run
    "log_level",  # what Lightning and MLflow print
    "log_every",
    "checkpoint_every",
    # The budget as stated: plan_run turns them into max_steps and trainer.accumulate_grad_batches,
    # which are hashed (a run of tokens=... is the run of the max_steps it comes to).
    "tokens",
    "global_batch",
)
# Keys added after runs were logged, at the value that computes what runs did before them: left
# out of the hash there, so a store's runs keep their hashes (and are found finished).
NEUTRAL_VALUES: dict[str, Any] = {
    "trainer.accumulate_grad_batches": 1,
    "optim.warmup_steps": None,
    "optim.lr_by_scheme": {},
    "optim.router_lr_scale": 1.0,
    "data.replace_invalid_utf8": False,
    # loops=fixed (experiments/loops.py): every step at the layout's K, as every earlier run trained
    "loops": {"distribution": "fixed", "mean": None, "sigma": 0.5, "min": 1, "max": None, "backprop": None},
}
# The model axes of the config; the hash takes the model they resolve to instead.
MODEL_AXES = ("model", "layout", "scheme", "buffer_slots", "model_overrides")
# What repeats a cell: runs that differ only in it are replicates of one row.
REPLICATE_KEY = "seed"
# Params logged beside the config that follow from it: model_config.* (the resolved model,
# :func:`model_params`), val_names, the hash itself, the preset's LR; and model_config/*, the
# duplicates Lightning logged from its hyperparameters in stores written before it stopped.
DERIVED_PARAMS = ("config_hash", "peak_lr", "val_names", "model_config.", "model_config/")
VANILLA = "vanilla"
# How the initial weights follow from the seed (mesh_model/init.py: one stream per tensor's role).
# Hashed: runs from before it drew in build order (MeSH's routers shifted the shared weights),
# so a grid does not mix them with runs that pair.
INIT = "per-tensor-streams"


# Settings that configure one kind of scheme only: MeSH's routers and reads (``model_overrides.mesh_*``)
# leave a run of any other scheme as it was, so they do not set a MeSH row apart from its base row.
SCHEME_ONLY_SETTINGS = {"model_overrides.mesh_": "mesh"}


def applies_to(key: str, scheme: str) -> bool:
    """True when the setting ``key`` can change what a run of ``scheme`` computes (False: a setting of
    :data:`SCHEME_ONLY_SETTINGS` beside another kind of scheme; a name that parses as no scheme,
    such as ``vanilla``, takes none of them)."""
    kinds = [kind for prefix, kind in SCHEME_ONLY_SETTINGS.items() if key.startswith(prefix)]
    if not kinds:
        return True
    try:
        own = SchemeSpec.parse(scheme).kind
    except (ConfigError, ValueError):
        return False
    return own in kinds


def canonical_variant(name: str) -> str:
    """``vanilla`` or the scheme's canonical name (``anchor*`` -> ``anchor_emb``); a ``ConfigError``
    for a name that is neither."""
    return VANILLA if name == VANILLA else SchemeSpec.parse(name).canonical


def _covers(prefixes: tuple[str, ...], key: str) -> bool:
    return any(key == p or key.startswith(p if p.endswith((".", "/")) else f"{p}.") for p in prefixes)


def changes_computation(key: str) -> bool:
    """True when the dotted config ``key`` changes what a run computes (and so its hash)."""
    return not _covers(RUN_INVARIANT_KEYS, key)


def distinguishes_rows(param: str) -> bool:
    """True when two runs that log different values of ``param`` belong in different table rows."""
    return param != REPLICATE_KEY and changes_computation(param) and not _covers(DERIVED_PARAMS, param)


def model_config_for(cfg: Mapping[str, Any], vocab_size: int | None = None) -> ModelConfig:
    """The run's ModelConfig. ``scheme=vanilla`` means the plain model at the compute depth of
    the layout (so a grid over schemes includes its compute-matched baseline)."""
    if cfg["model"] not in PRESETS:
        known = f"{did_you_mean(cfg['model'], PRESETS)}known presets: {', '.join(PRESETS)}"
        raise ConfigError("model", cfg["model"], known)
    overrides: dict[str, Any] = dict(cfg.get("model_overrides") or {})
    vanilla = cfg["scheme"] == VANILLA
    slots = cfg.get("buffer_slots")
    if slots is not None and (vanilla or SchemeSpec.parse(cfg["scheme"]).kind != "mesh"):
        raise ConfigError("buffer_slots", slots, "only scheme=mesh has a buffer; drop buffer_slots or use scheme=mesh")
    overrides["scheme"] = "base" if vanilla else cfg["scheme"]
    overrides["buffer_slots"] = None if vanilla else cfg["buffer_slots"]
    if cfg["layout"] is not None:
        overrides["layout"] = str(cfg["layout"])
    if vocab_size is not None:
        overrides.setdefault("vocab_size", vocab_size)
    config = ModelConfig.from_preset(cfg["model"], **overrides)
    return config.vanilla() if vanilla else config


def _prune(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    kept = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if not changes_computation(dotted) or (dotted in NEUTRAL_VALUES and value == NEUTRAL_VALUES[dotted]):
            continue
        kept[key] = _prune(value, f"{dotted}.") if isinstance(value, Mapping) else value
    return kept


def identity_fields(config: Mapping[str, Any], model_config: ModelConfig) -> dict[str, Any]:
    """What a run's hash is computed from: the resolved model (MeSH's effective B; none for other
    schemes) and every config key that changes the computation, model axes excluded."""
    model = {**model_config.to_dict(), "buffer_slots": model_config.slots}
    rest = _prune({k: v for k, v in config.items() if k not in MODEL_AXES})
    return json.loads(json.dumps({"model": model, "init": INIT, **rest}, default=str))


def config_hash(config: Mapping[str, Any], model_config: ModelConfig) -> str:
    fields = identity_fields(config, model_config)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def run_key(model_config: ModelConfig, seed: int, digest: str) -> str:
    """The run's folder name: readable coordinates, then the hash that makes it unique
    (``tiny-1+2R2+1-mesh-B5-s0-<hash8>``, ``tiny-6-vanilla-s0-<hash8>``).

    Folders made before the plain model was named ``vanilla`` here end ``-base-s<seed>-<hash8>``;
    :func:`experiments.plan.run_dir_for` finds them by :func:`run_key_suffix`."""
    variant = model_config.variant.replace("*", "x").replace("+", "_")
    slots = f"-B{model_config.slots}" if model_config.slots else ""
    return f"{model_config.preset}-{model_config.layout}-{variant}{slots}{run_key_suffix(seed, digest)}"


def run_key_suffix(seed: int, digest: str) -> str:
    """How every run folder name of this seed and hash ends, whatever its readable part."""
    return f"-s{seed}-{digest[:8]}"


def run_name(model_config: ModelConfig, seed: int) -> str:
    """The run's name in MLflow: what differs between the runs of a grid first, then the model
    (``mesh B5 s0 · tiny 1+2R2+1``, ``vanilla s0 · tiny 6``), so the runs list shows the scheme
    and seed even where it cuts names short."""
    slots = f" B{model_config.slots}" if model_config.slots else ""
    model = " ".join(part for part in (model_config.preset, model_config.layout) if part)
    return f"{model_config.variant}{slots} s{seed} · {model}"


def model_params(model_config: ModelConfig) -> dict[str, str]:
    """The resolved model as MLflow params, ``model_config.<field>``: ``scheme`` is the variant
    (``vanilla`` for the plain model, whose ``layout`` is its depth) and ``buffer_slots`` MeSH's
    effective B (empty for the other schemes); and the config key ``buffer_slots`` at that value too,
    not the ``None`` that leaves B to its default (K+3), so the param reads as the run's tag does."""
    slots = str(model_config.slots) if model_config.slots is not None else ""
    fields = {**model_config.to_dict(), "scheme": model_config.variant, "buffer_slots": slots}
    return {"buffer_slots": slots, **{f"model_config.{key}": str(value) for key, value in fields.items()}}


# A run's tokenizer, by content (experiments/train.py): tags on every run, and a param where it
# sets the run apart from the runs of its config that used another tokenizer.
TOKENIZER_TAG = "tokenizer_sha256"
TOKEN_CACHE_TAG = "token_cache"
ROW_HASH_TAG = "row_hash"  # the config hash at seed 0: the same for every seed of a table row
TOKENIZER_PARAM = "data.tokenizer_sha256"
TOKENIZER_FORK_TAG = "tokenizer_fork"  # on a run set apart by its tokenizer: that tokenizer's sha256
TOKENIZER_RECORD = "tokenizer.sha256"  # in the run's folder: the tokenizer it was trained with


def tokenizer_digest(serialized: str) -> str:
    """The sha256 of a tokenizer's content (its tokenizers JSON)."""
    return hashlib.sha256(serialized.encode()).hexdigest()


def tokenizer_hash(config_hash_: str, digest: str) -> str:
    """The hash of a run of config hash ``config_hash_`` trained with a tokenizer (sha256 ``digest``)
    other than the one the runs of that config used: never the same as theirs."""
    return hashlib.sha256(f"{config_hash_}:{digest}".encode()).hexdigest()[:12]
