"""Every numeric and enumerated field of every schema, set out of range, stops with one
``ConfigError`` line naming it: the run (train, trainer, optim, data, probes, search, tracking),
the model, a grid's launch settings (resources, launchers, seeds) and ``seeds=auto``. A field
added to a schema without a row here fails :func:`test_every_ranged_field_has_a_row`."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from experiments.config import (
    DepthEvalConfig,
    OptimConfig,
    ProbeConfig,
    SearchConfig,
    TrackingConfig,
    TrainConfig,
    TrainerConfig,
)
from experiments.data.config import DataConfig
from experiments.loops import LoopsConfig
from mesh_model import ConfigError, ModelConfig
from sweeps.grid import AutoSeeds
from sweeps.launch.base import ResourcesConfig
from sweeps.launch.config import LAUNCHERS, LaunchConfig


def run_config(**top: Any) -> TrainConfig:
    return TrainConfig(data=DataConfig(), trainer=TrainerConfig(), optim=OptimConfig(), **top)


def check_run(part: str | None, field: str, value: Any, **context: Any) -> None:
    """Set ``field`` (of the run's group ``part``, or of the run itself) and validate the whole run."""
    train = run_config(**(context if part is None else {}))
    target = train if part is None else getattr(train, part)
    for key, given in ({} if part is None else context).items():
        setattr(target, key, given)
    setattr(target, field, value)
    train.validate()


def check_model(field: str, value: Any, **context: Any) -> None:
    ModelConfig(**{**context, field: value})


def check_launch(part: str | None, field: str, value: Any, launcher: str = "auto") -> None:
    launch = LaunchConfig(launcher=LAUNCHERS[launcher](), resources=ResourcesConfig())
    setattr(launch if part is None else getattr(launch, part), field, value)
    launch.validate()


def check_seeds(field: str, value: Any) -> None:
    AutoSeeds(**{field: value})


MESH = {"scheme": "mesh"}
MOE = {"moe_experts": 4}
# (schema, field, bad value, how it is validated, the field the error names)
CASES: list[tuple[type, str, Any, Any, str]] = [
    # the run's own keys, the model axes among them
    (TrainConfig, "model", "huge", lambda v: check_run(None, "model", v), "model"),
    (TrainConfig, "layout", "1+0R2+1", lambda v: check_run(None, "layout", v), "layout"),
    (TrainConfig, "scheme", "bogus", lambda v: check_run(None, "scheme", v), "scheme"),
    (TrainConfig, "buffer_slots", 0, lambda v: check_run(None, "buffer_slots", v, **MESH), "buffer_slots"),
    (TrainConfig, "seed", -1, lambda v: check_run(None, "seed", v), "seed"),
    (TrainConfig, "max_steps", 0, lambda v: check_run(None, "max_steps", v), "max_steps"),
    (TrainConfig, "tokens", 0.5, lambda v: check_run(None, "tokens", v), "tokens"),
    (TrainConfig, "global_batch", 0, lambda v: check_run(None, "global_batch", v), "global_batch"),
    (TrainConfig, "val_every", 0, lambda v: check_run(None, "val_every", v), "val_every"),
    (TrainConfig, "log_every", 0, lambda v: check_run(None, "log_every", v), "log_every"),
    (TrainConfig, "checkpoint_every", 0, lambda v: check_run(None, "checkpoint_every", v), "checkpoint_every"),
    (TrainConfig, "runs_dir", "", lambda v: check_run(None, "runs_dir", v), "runs_dir"),
    (TrainConfig, "log_level", "loud", lambda v: check_run(None, "log_level", v), "log_level"),
    # trainer
    (TrainerConfig, "accelerator", "abacus", lambda v: check_run("trainer", "accelerator", v), "trainer.accelerator"),
    (TrainerConfig, "devices", 0, lambda v: check_run("trainer", "devices", v), "trainer.devices"),
    (TrainerConfig, "num_nodes", 0, lambda v: check_run("trainer", "num_nodes", v), "trainer.num_nodes"),
    (TrainerConfig, "precision", "bf17", lambda v: check_run("trainer", "precision", v), "trainer.precision"),
    (
        TrainerConfig,
        "accumulate_grad_batches",
        0,
        lambda v: check_run("trainer", "accumulate_grad_batches", v),
        "trainer.accumulate_grad_batches",
    ),
    # optim
    (OptimConfig, "lr", 0.0, lambda v: check_run("optim", "lr", v), "optim.lr"),
    (
        OptimConfig,
        "lr_by_scheme",
        {"mesh": 0},
        lambda v: check_run("optim", "lr_by_scheme", v),
        "optim.lr_by_scheme.mesh",
    ),
    (OptimConfig, "betas", [0.9, 1.5], lambda v: check_run("optim", "betas", v), "optim.betas"),
    (OptimConfig, "weight_decay", -1, lambda v: check_run("optim", "weight_decay", v), "optim.weight_decay"),
    (OptimConfig, "warmup_fraction", 7, lambda v: check_run("optim", "warmup_fraction", v), "optim.warmup_fraction"),
    (OptimConfig, "warmup_steps", 0, lambda v: check_run("optim", "warmup_steps", v), "optim.warmup_steps"),
    (OptimConfig, "min_lr_ratio", 2, lambda v: check_run("optim", "min_lr_ratio", v), "optim.min_lr_ratio"),
    (OptimConfig, "grad_clip", -1, lambda v: check_run("optim", "grad_clip", v), "optim.grad_clip"),
    (OptimConfig, "router_lr_scale", 0, lambda v: check_run("optim", "router_lr_scale", v), "optim.router_lr_scale"),
    # tracking
    (TrackingConfig, "experiment", "", lambda v: check_run("tracking", "experiment", v), "tracking.experiment"),
    # probes
    (
        ProbeConfig,
        "every_n_validations",
        -1,
        lambda v: check_run("probes", "every_n_validations", v),
        "probes.every_n_validations",
    ),
    (ProbeConfig, "num_batches", 0, lambda v: check_run("probes", "num_batches", v), "probes.num_batches"),
    (ProbeConfig, "seq_len", 3, lambda v: check_run("probes", "seq_len", v), "probes.seq_len"),
    (ProbeConfig, "debiased", True, lambda v: check_run("probes", "debiased", v), "probes.debiased"),
    # depth_eval (after training)
    (DepthEvalConfig, "loops", [2, 0], lambda v: check_run("depth_eval", "loops", v), "depth_eval.loops"),
    (DepthEvalConfig, "rules", ["newest"], lambda v: check_run("depth_eval", "rules", v), "depth_eval.rules"),
    (DepthEvalConfig, "exit", ["entropy"], lambda v: check_run("depth_eval", "exit", v), "depth_eval.exit"),
    (DepthEvalConfig, "exit_eps", [0.01, -1], lambda v: check_run("depth_eval", "exit_eps", v), "depth_eval.exit_eps"),
    (DepthEvalConfig, "exit_loops", 0, lambda v: check_run("depth_eval", "exit_loops", v), "depth_eval.exit_loops"),
    # search
    (SearchConfig, "n_trials", -1, lambda v: check_run("search", "n_trials", v), "search.n_trials"),
    (SearchConfig, "direction", "up", lambda v: check_run("search", "direction", v), "search.direction"),
    (SearchConfig, "sampler_seed", -1, lambda v: check_run("search", "sampler_seed", v), "search.sampler_seed"),
    (SearchConfig, "pruner", "hyperband", lambda v: check_run("search", "pruner", v), "search.pruner"),
    (
        SearchConfig,
        "pruner_startup_trials",
        -1,
        lambda v: check_run("search", "pruner_startup_trials", v),
        "search.pruner_startup_trials",
    ),
    (SearchConfig, "trial_id", -1, lambda v: check_run("search", "trial_id", v), "search.trial_id"),
    # data
    (DataConfig, "corpus", "novel", lambda v: check_run("data", "corpus", v), "data.corpus"),
    (DataConfig, "tokenizer", "", lambda v: check_run("data", "tokenizer", v), "data.tokenizer"),
    (DataConfig, "bpe_vocab_size", 100, lambda v: check_run("data", "bpe_vocab_size", v), "data.bpe_vocab_size"),
    (DataConfig, "seq_len", 0, lambda v: check_run("data", "seq_len", v), "data.seq_len"),
    (DataConfig, "batch_size", 0, lambda v: check_run("data", "batch_size", v), "data.batch_size"),
    (DataConfig, "val_fraction", 1.0, lambda v: check_run("data", "val_fraction", v), "data.val_fraction"),
    (DataConfig, "val_batches", -1, lambda v: check_run("data", "val_batches", v), "data.val_batches"),
    (DataConfig, "extra_val", ["novel"], lambda v: check_run("data", "extra_val", v), "data.extra_val"),
    (DataConfig, "num_workers", -1, lambda v: check_run("data", "num_workers", v), "data.num_workers"),
    # the model
    (ModelConfig, "layout", "0", lambda v: check_model("layout", v), "layout"),
    (ModelConfig, "scheme", "bogus", lambda v: check_model("scheme", v), "scheme"),
    (ModelConfig, "buffer_slots", 0, lambda v: check_model("buffer_slots", v, **MESH), "buffer_slots"),
    (ModelConfig, "d_model", 0, lambda v: check_model("d_model", v), "d_model"),
    (ModelConfig, "n_heads", 3, lambda v: check_model("n_heads", v), "n_heads"),
    (ModelConfig, "vocab_size", 0, lambda v: check_model("vocab_size", v), "vocab_size"),
    (ModelConfig, "max_seq_len", 0, lambda v: check_model("max_seq_len", v), "max_seq_len"),
    (ModelConfig, "mlp_ratio", 0, lambda v: check_model("mlp_ratio", v), "mlp_ratio"),
    (ModelConfig, "rotary_pct", 2.0, lambda v: check_model("rotary_pct", v), "rotary_pct"),
    (ModelConfig, "rotary_base", 0.0, lambda v: check_model("rotary_base", v), "rotary_base"),
    (ModelConfig, "layer_norm_eps", -1e-5, lambda v: check_model("layer_norm_eps", v), "layer_norm_eps"),
    (ModelConfig, "init_std", 0.0, lambda v: check_model("init_std", v), "init_std"),
    (ModelConfig, "moe_experts", 0, lambda v: check_model("moe_experts", v), "moe_experts"),
    (ModelConfig, "moe_top_k", 5, lambda v: check_model("moe_top_k", v, **MOE), "moe_top_k"),
    (ModelConfig, "moe_hidden", 0, lambda v: check_model("moe_hidden", v, **MOE), "moe_hidden"),
    (ModelConfig, "moe_layers", 99, lambda v: check_model("moe_layers", v, **MOE), "moe_layers"),
    (ModelConfig, "moe_aux_coef", -1.0, lambda v: check_model("moe_aux_coef", v, **MOE), "moe_aux_coef"),
    (ModelConfig, "moe_z_coef", -1.0, lambda v: check_model("moe_z_coef", v, **MOE), "moe_z_coef"),
    (ModelConfig, "mesh_router_init", "x", lambda v: check_model("mesh_router_init", v, **MESH), "mesh_router_init"),
    (
        ModelConfig,
        "mesh_router_own_weight",
        1.5,
        lambda v: check_model("mesh_router_own_weight", v, mesh_router_init="own_slot", **MESH),
        "mesh_router_own_weight",
    ),
    (ModelConfig, "mesh_router_norm", "x", lambda v: check_model("mesh_router_norm", v, **MESH), "mesh_router_norm"),
    (
        ModelConfig,
        "mesh_router_temperature",
        0.0,
        lambda v: check_model("mesh_router_temperature", v, **MESH),
        "mesh_router_temperature",
    ),
    (
        ModelConfig,
        "mesh_router_z_coef",
        -1.0,
        lambda v: check_model("mesh_router_z_coef", v, **MESH),
        "mesh_router_z_coef",
    ),
    (ModelConfig, "mesh_final_read", "x", lambda v: check_model("mesh_final_read", v, **MESH), "mesh_final_read"),
    # the loop count (mesh_model/depth.py, experiments/loops.py)
    (ModelConfig, "max_loops", 1, lambda v: check_model("max_loops", v), "max_loops"),
    (ModelConfig, "loop_rule", "first", lambda v: check_model("loop_rule", v), "loop_rule"),
    (ModelConfig, "mesh_routers", "tied", lambda v: check_model("mesh_routers", v, **MESH), "mesh_routers"),
    (LoopsConfig, "distribution", "normal", lambda v: check_run("loops", "distribution", v), "loops.distribution"),
    (
        LoopsConfig,
        "mean",
        1,
        lambda v: check_run("loops", "mean", v, distribution="poisson_lognormal", max=6),
        "loops.mean",
    ),
    (
        LoopsConfig,
        "sigma",
        0,
        lambda v: check_run("loops", "sigma", v, distribution="poisson_lognormal", mean=2, max=6),
        "loops.sigma",
    ),
    (LoopsConfig, "min", 0, lambda v: check_run("loops", "min", v, distribution="uniform", max=3), "loops.min"),
    (LoopsConfig, "max", 0, lambda v: check_run("loops", "max", v, distribution="uniform"), "loops.max"),
    (LoopsConfig, "backprop", 0, lambda v: check_run("loops", "backprop", v), "loops.backprop"),
    # a grid's launch settings
    (LaunchConfig, "seeds", [-1], lambda v: check_launch(None, "seeds", v), "seeds"),
    (
        ResourcesConfig,
        "cpus_per_task",
        0,
        lambda v: check_launch("resources", "cpus_per_task", v),
        "resources.cpus_per_task",
    ),
    (
        ResourcesConfig,
        "gpus_per_node",
        -1,
        lambda v: check_launch("resources", "gpus_per_node", v),
        "resources.gpus_per_node",
    ),
    (ResourcesConfig, "nodes", 0, lambda v: check_launch("resources", "nodes", v), "resources.nodes"),
    (ResourcesConfig, "mem_gb", 0, lambda v: check_launch("resources", "mem_gb", v), "resources.mem_gb"),
    (ResourcesConfig, "time_min", 0, lambda v: check_launch("resources", "time_min", v), "resources.time_min"),
    (
        ResourcesConfig,
        "tasks_per_node",
        0,
        lambda v: check_launch("resources", "tasks_per_node", v),
        "resources.tasks_per_node",
    ),
    (LAUNCHERS["auto"], "workers", 0, lambda v: check_launch("launcher", "workers", v), "launcher.workers"),
    (LAUNCHERS["auto"], "threads", 0, lambda v: check_launch("launcher", "threads", v), "launcher.threads"),
    (
        LAUNCHERS["parallel"],
        "workers",
        0,
        lambda v: check_launch("launcher", "workers", v, "parallel"),
        "launcher.workers",
    ),
    (
        LAUNCHERS["parallel"],
        "threads",
        0,
        lambda v: check_launch("launcher", "threads", v, "parallel"),
        "launcher.threads",
    ),
    (
        LAUNCHERS["submitit_local"],
        "workers",
        0,
        lambda v: check_launch("launcher", "workers", v, "submitit_local"),
        "launcher.workers",
    ),
    (
        LAUNCHERS["slurm"],
        "max_parallel",
        0,
        lambda v: check_launch("launcher", "max_parallel", v, "slurm"),
        "launcher.max_parallel",
    ),
    (
        LAUNCHERS["slurm"],
        "max_requeues",
        -1,
        lambda v: check_launch("launcher", "max_requeues", v, "slurm"),
        "launcher.max_requeues",
    ),
    (
        LAUNCHERS["slurm"],
        "signal_delay_s",
        0,
        lambda v: check_launch("launcher", "signal_delay_s", v, "slurm"),
        "launcher.signal_delay_s",
    ),
    # seeds=auto
    (AutoSeeds, "stage", 1, lambda v: check_seeds("stage", v), "seeds.stage"),
    (AutoSeeds, "max", 2, lambda v: check_seeds("max", v), "seeds.max"),
    (AutoSeeds, "alpha", 1.5, lambda v: check_seeds("alpha", v), "seeds.alpha"),
    (AutoSeeds, "spending", "linear", lambda v: check_seeds("spending", v), "seeds.spending"),
    (AutoSeeds, "budget_cpu_h", 0.0, lambda v: check_seeds("budget_cpu_h", v), "seeds.budget_cpu_h"),
    (AutoSeeds, "budget_gpu_h", 0.0, lambda v: check_seeds("budget_gpu_h", v), "seeds.budget_gpu_h"),
    (AutoSeeds, "first", -1, lambda v: check_seeds("first", v), "seeds.first"),
    (AutoSeeds, "earlier", "/nowhere", lambda v: check_seeds("earlier", v), "seeds.earlier"),
]
SCHEMAS = (
    TrainConfig, TrainerConfig, OptimConfig, TrackingConfig, ProbeConfig, SearchConfig, DataConfig, ModelConfig,
    LoopsConfig, LaunchConfig, ResourcesConfig, *LAUNCHERS.values(), AutoSeeds, DepthEvalConfig,
)  # fmt: skip
# Fields with no range to leave: free text, switches, nested groups, what a run is told by its
# launcher, and ModelConfig's derived (init=False) fields and preset name.
UNRANGED = {
    "TrainConfig": {
        "model_overrides",
        "data",
        "trainer",
        "optim",
        "loops",
        "tracking",
        "probes",
        "search",
        "depth_eval",
    },
    "TrainerConfig": {"strategy"},
    "TrackingConfig": {"tracking_uri", "run_name", "parent_run_id", "sweep", "tags"},
    "SearchConfig": {"params", "templates", "study_name", "storage"},
    "DataConfig": {"path", "hf_dataset", "hf_config", "hf_split", "hf_text_field", "cache_dir"},
    "ModelConfig": {"preset", "parsed_layout", "scheme_spec", "moe", "router_options"},
    "LaunchConfig": {"launcher", "resources"},
    "SlurmLauncher": {"partition", "account", "qos", "setup", "additional_parameters"},
}


@pytest.mark.parametrize(
    ("check", "value", "named"),
    [
        pytest.param(check, value, named, id=f"{schema.__name__}.{field}")
        for schema, field, value, check, named in CASES
    ],
)
def test_a_field_out_of_range_stops_with_one_line_naming_it(check, value, named):
    with pytest.raises(ConfigError) as caught:
        check(value)
    assert caught.value.field == named
    message = str(caught.value)
    assert message.startswith(f"{named}=") and "\n" not in message


def test_the_defaults_pass():
    run_config().validate()
    ModelConfig()
    for launcher in LAUNCHERS.values():
        LaunchConfig(launcher=launcher(), resources=ResourcesConfig()).validate()
    AutoSeeds()


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda schema: schema.__name__)
def test_every_ranged_field_has_a_row(schema):
    """Every field but booleans and those in UNRANGED is set out of range by a row of CASES."""
    covered = {field for owner, field, *_ in CASES if owner is schema}
    ranged = {
        f.name
        for f in dataclasses.fields(schema)
        if str(f.type) not in ("bool",) and f.name not in UNRANGED.get(schema.__name__, set())
    }
    assert ranged - covered == set()


@pytest.mark.parametrize("devices", [1, 4, -1, "auto", "2", "-1", "0,1", [0, 1], [3]])
def test_every_form_of_devices_lightning_takes_passes(devices):
    train = run_config()
    train.trainer.devices = devices
    train.validate()
