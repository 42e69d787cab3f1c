"""The Hydra config tree, as structured configs in the ConfigStore.

Composition: ``conf/train.yaml`` = the schema :class:`TrainConfig` with the groups ``data``,
``trainer`` and ``optim``. The model axes are short top-level keys, so a grid reads
``model=tiny layout=1+2R3+1 scheme=mesh buffer_slots=4 seed=1``. Structured configs run in
struct mode: an override of a key that does not exist fails at composition, and an unknown
group option answers with the available ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from experiments.data.config import DataConfig


@dataclass
class TrainerConfig:
    """Where and how Lightning runs. ``precision`` null picks bf16-mixed on GPU, 32-true on CPU."""

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str | None = None
    deterministic: bool = False


@dataclass
class OptimConfig:
    """AdamW with the paper's (Pythia's) recipe. ``lr`` null takes the preset's peak LR."""

    lr: float | None = None
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    warmup_fraction: float = 0.01
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0


@dataclass
class TrackingConfig:
    """MLflow. ``tracking_uri`` null: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<runs_dir>/mlflow.db``."""

    tracking_uri: str | None = None
    experiment: str = "mesh"
    run_name: str | None = None
    parent_run_id: str | None = None
    sweep: str | None = None  # set by mesh-sweep; tagged on the run
    tags: dict[str, str] = field(default_factory=dict)  # extra run tags


@dataclass
class ProbeConfig:
    """Hidden-state probes (experiments/probing.py) on the first ``num_batches`` validation batches:
    at the end of training, and after every ``every_n_validations``-th validation (0 = only at the end)."""

    enabled: bool = True
    every_n_validations: int = 0
    num_batches: int = 2
    debiased: bool = False


@dataclass
class SearchConfig:
    """An Optuna search (run by ``mesh-sweep``), declared in a sweep file.

    ``params`` maps a config key, or a name used in ``templates``, to a Hydra sweep expression:
    ``tag(log, interval(1e-4, 1e-2))`` (float, log scale), ``interval(0, 1.5)``,
    ``int(interval(1, 8))``, ``choice(a, b)``. ``templates`` builds override values from the
    sampled names, e.g. ``scheme: "{core:.3f}*core+{anchor:.3f}*anchor"``. The last three fields
    are set per trial by the driver, for pruning from inside the training process.
    """

    n_trials: int = 0
    direction: str = "minimize"
    params: dict[str, str] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)
    sampler_seed: int = 0
    pruner: str = "median"  # median | none
    pruner_startup_trials: int = 2
    study_name: str | None = None
    storage: str | None = None  # default sqlite:///<runs_dir>/optuna.db
    trial_id: int | None = None


@dataclass
class TrainConfig:
    """The schema of ``conf/train.yaml``, which adds the default groups and Hydra's own settings."""

    # The model axes (see mesh_model.ModelConfig): preset name, layout (null = the preset's),
    # scheme, MeSH buffer length (null = K+3), and any other ModelConfig field by name.
    model: str = "tiny"
    layout: str | None = None
    scheme: str = "base"
    buffer_slots: int | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    optim: OptimConfig = MISSING
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)
    search: SearchConfig = field(default_factory=SearchConfig)

    max_steps: int = 200
    val_every: int = 50
    log_every: int = 10
    checkpoint_every: int = 50
    runs_dir: str = "runs"
    resume: bool = True
    compile: bool = False  # torch.compile the model (one graph: the loop does not recompile)
    activation_checkpointing: bool = False  # recompute each core iteration in backward


TRAINERS = {
    "cpu": TrainerConfig(accelerator="cpu", devices=1),
    "gpu": TrainerConfig(accelerator="gpu", devices=1),
    "ddp": TrainerConfig(accelerator="gpu", devices="auto", strategy="ddp"),
    "fsdp": TrainerConfig(accelerator="gpu", devices="auto", strategy="fsdp"),
    "ddp_cpu": TrainerConfig(accelerator="cpu", devices=2, strategy="ddp"),
}

# Corpus presets, as typed nodes rather than instances: DataConfig validates itself when it is
# built, and ``text``/``indexed`` only become valid once ``data.path`` is given.
DATASETS = {
    name: OmegaConf.merge(OmegaConf.structured(DataConfig), {"corpus": name})
    for name in ("shakespeare", "kjv", "cpython", "text", "hf", "indexed")
}


def register_configs() -> None:
    """Put the tree in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for name, node in DATASETS.items():
        store.store(group="data", name=name, node=node)
    for name, node in TRAINERS.items():
        store.store(group="trainer", name=name, node=node)
    store.store(group="optim", name="adamw", node=OptimConfig)
