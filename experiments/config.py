"""The typed schema of one training run, and its registration in Hydra's ConfigStore.

The options of each group are YAML files under ``experiments/conf/<group>/`` (``ls`` shows
them); each one starts from its group's schema (``defaults: [schema, _self_]``), so a typo in a
key fails at composition. ``conf/train.yaml`` = :class:`TrainConfig` + the default groups. The
model axes are short top-level keys, so a grid reads
``model=tiny layout=1+2R3+1 scheme=mesh buffer_slots=4 seed=1``.

Every dataclass has one ``validate()`` that raises a one-line :class:`ConfigError`;
:meth:`TrainConfig.validate` calls the others and ``plan_run`` calls it once, before any compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from experiments.data.config import DataConfig
from experiments.identity import MODEL_AXES, canonical_variant, model_config_for
from experiments.loops import LoopsConfig
from mesh_model import ConfigError, ModelConfig, did_you_mean
from mesh_model.depth import EXIT_CRITERIA, LOOP_RULES
from mesh_model.scheme_names import NAMED_SCHEMES, UNKNOWN_SCHEME

ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")
PRUNERS = ("median", "none")
DIRECTIONS = ("minimize", "maximize")
# Lightning's precision settings (``trainer.precision``; null picks one, see TrainerConfig)
PRECISIONS = (
    "64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed",
    "transformer-engine", "transformer-engine-float16", "64", "32", "16", "bf16",
)  # fmt: skip
LOG_LEVELS = ("debug", "info", "warning", "error")
MAX_SEED = 2**32 - 1  # numpy's (and Lightning's seed_everything's) largest seed


def _at_least(field_name: str, value: Any, low: int | float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= low:
        raise ConfigError(field_name, value, f"must be >= {low}")


def _check_devices(devices: Any) -> None:
    """Lightning's ``devices``: ``auto``, a count >= 1 (-1: every one), or device indices (a list or ``"0,1"``)."""
    allowed = "auto, a count >= 1 (-1: every device), or device indices such as [0, 1] or '0,1'"
    if isinstance(devices, str):
        text = devices.strip()
        parts = text.split(",")
        if text == "auto" or (text.lstrip("-").isdigit() and int(text) != 0 and int(text) >= -1):
            return
        if len(parts) > 1 and all(p.strip().isdigit() for p in parts if p.strip()):
            return
        raise ConfigError("trainer.devices", devices, allowed)
    if isinstance(devices, bool):
        raise ConfigError("trainer.devices", devices, allowed)
    if isinstance(devices, int):
        if devices >= 1 or devices == -1:
            return
        raise ConfigError("trainer.devices", devices, allowed)
    indices = list(devices) if isinstance(devices, Sequence) else None
    if not indices or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indices):
        raise ConfigError("trainer.devices", indices if indices is not None else devices, allowed)


@dataclass
class TrainerConfig:
    """Where and how Lightning runs. ``precision`` null picks bf16-mixed on GPU, 32-true on CPU."""

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str | None = None
    deterministic: bool = False
    # Micro-batches of data.batch_size whose gradients make one optimizer step (set by
    # ``global_batch`` when that is given). A step then sees batch_size x this x devices x nodes
    # sequences; max_steps, val_every, log_every and checkpoint_every count optimizer steps.
    accumulate_grad_batches: int = 1

    def validate(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise ConfigError("trainer.accelerator", self.accelerator, f"use one of {', '.join(ACCELERATORS)}")
        _check_devices(self.devices)
        _at_least("trainer.num_nodes", self.num_nodes, 1)
        if self.precision is not None and str(self.precision) not in PRECISIONS:
            raise ConfigError("trainer.precision", self.precision, f"use null or one of {', '.join(PRECISIONS)}")
        _at_least("trainer.accumulate_grad_batches", self.accumulate_grad_batches, 1)

    @property
    def resolved_precision(self) -> str:
        return self.precision or ("bf16-mixed" if self.accelerator == "gpu" else "32-true")


@dataclass
class OptimConfig:
    """AdamW with the paper's (Pythia's) recipe. ``lr`` null takes the preset's peak LR. The LR
    warms up linearly for ``warmup_steps`` optimizer steps (null: ``warmup_fraction`` of the run's
    steps), then decays along a half cosine to ``min_lr_ratio`` of the peak at the last step.

    ``lr_by_scheme`` gives a scheme its own peak LR (``{vanilla: 2e-3, mesh: 4e-3}``; ``anchor*`` is
    ``anchor_emb``), ahead of ``lr``: one grid then runs every scheme at its own best LR (read off
    ``mesh-sweep lr``), and its rows still compare, since every cell carries the same mapping."""

    lr: float | None = None
    lr_by_scheme: dict[str, float] = field(default_factory=dict)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    warmup_fraction: float = 0.01
    warmup_steps: int | None = None
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    # The state-passing scheme's own parameters (MeSH's routers, the static/dynamic coefficients)
    # train at this multiple of the peak LR, in their own optimizer groups, on the same schedule.
    router_lr_scale: float = 1.0

    def validate(self) -> None:
        if self.lr is not None and not (0 < self.lr < float("inf")):
            raise ConfigError("optim.lr", self.lr, "must be a finite number > 0 (or null for the preset's)")
        for scheme, lr in self.lr_by_scheme.items():
            if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0 < lr < float("inf"):
                raise ConfigError(f"optim.lr_by_scheme.{scheme}", lr, "must be a finite number > 0")
            try:
                canonical_variant(scheme)
            except ConfigError:
                known = did_you_mean(scheme, NAMED_SCHEMES) + UNKNOWN_SCHEME
                raise ConfigError("optim.lr_by_scheme", scheme, known) from None
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError("optim.betas", list(self.betas), "two numbers in [0, 1)")
        _at_least("optim.weight_decay", self.weight_decay, 0)
        _at_least("optim.grad_clip", self.grad_clip, 0)
        if self.warmup_steps is not None:
            _at_least("optim.warmup_steps", self.warmup_steps, 1)
        for name in ("warmup_fraction", "min_lr_ratio"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ConfigError(f"optim.{name}", value, "must be in [0, 1]")
        if not isinstance(self.router_lr_scale, (int, float)) or not 0 < self.router_lr_scale < float("inf"):
            raise ConfigError(
                "optim.router_lr_scale", self.router_lr_scale, "must be a finite number > 0 (1 = the peak LR)"
            )

    def peak_lr(self, scheme: str, preset_lr: float) -> float:
        """The peak LR of a run of ``scheme``: its entry in ``lr_by_scheme``, else ``lr``, else the preset's."""
        by_scheme = {canonical_variant(k): v for k, v in self.lr_by_scheme.items()}
        lr = by_scheme.get(canonical_variant(scheme), self.lr)
        return float(lr) if lr is not None else preset_lr


def path_escape(name: str) -> str | None:
    """Why ``name``, a name that becomes a folder under ``runs_dir``, would not stay a folder
    inside it (an absolute path, a ``..`` part, ``.``), or None when it does."""
    if "\x00" in name:
        return "a NUL character cannot be in a file name"
    if name.startswith("/"):
        return "an absolute path would leave runs_dir; give a plain name such as 'mesh'"
    parts = name.split("/")
    if ".." in parts:
        return "'..' would leave runs_dir; give a plain name such as 'mesh'"
    if any(part in ("", ".") for part in parts):
        return "an empty or '.' part names runs_dir itself; give a plain name such as 'mesh'"
    return None


@dataclass
class TrackingConfig:
    """MLflow. ``tracking_uri`` null: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<runs_dir>/mlflow.db``."""

    tracking_uri: str | None = None
    experiment: str = "mesh"
    run_name: str | None = None
    parent_run_id: str | None = None
    sweep: str | None = None  # set by mesh-sweep; tagged on the run
    tags: dict[str, str] = field(default_factory=dict)  # extra run tags
    rebuild_store: bool = False  # a damaged sqlite store is moved aside and started empty (else: stop)

    def validate(self) -> None:
        if not self.experiment:
            raise ConfigError("tracking.experiment", self.experiment, "give an experiment name")
        if (escape := path_escape(self.experiment)) is not None:
            raise ConfigError(
                "tracking.experiment", self.experiment, f"it names the folder <runs_dir>/<experiment>, and {escape}"
            )


@dataclass
class ProbeConfig:
    """Hidden-state probes (experiments/probing/) on held-out validation tokens: at the end of
    training, and after every ``every_n_validations``-th validation (0 = only at the end).

    A probe reads ``num_batches`` batches of ``data.batch_size`` samples; a sample is ``seq_len``
    consecutive validation tokens, the L rows of every probed L x D matrix. The model reads each
    sample in consecutive windows of ``data.seq_len`` tokens (one window when ``seq_len`` is
    shorter), so it is never asked about a position beyond the length it was trained at, and no
    window exceeds the model's ``max_seq_len`` (``plan_run`` checks ``data.seq_len`` against it): a
    longer sample stacks the rows of several sequences, the validation windows themselves when
    ``seq_len`` is a multiple of ``data.seq_len``.

    ``seq_len`` null means max(``data.seq_len``, 512). The paper's (biased) RBF CKA reads about 0.82
    between unrelated 128 x 64 matrices (the tiny preset at the CPU training length), 0.91 at
    128 x 128 (mini): too close to the 0.9-0.99 measured between loop states to read as similarity.
    At 512 x 64 it reads 0.54, at 512 x 128 0.71 (each run logs it as ``probe/cka_rbf/floor``), for
    about 4x the probe's time at 128 (seconds on a CPU). Where training is longer (the paper's 4096)
    the probes take the training length. ``debiased`` is obsolete: both CKA estimators are always
    logged; setting it is an error.

    ``figures`` false writes and logs each probe's numbers (``probes.json``, ``probes.csv``, the
    metrics) without its figures (PNG and SVG: about 3 CPU-seconds a probe with matplotlib);
    ``mesh-results`` draws a report's probe figures from the numbers either way.
    """

    enabled: bool = True
    every_n_validations: int = 0
    stability: bool = True  # the loop map's stability at every validation (experiments/callbacks/stability.py)
    num_batches: int = 2
    seq_len: int | None = None
    figures: bool = True
    debiased: bool | None = None
    DEFAULT_MIN_SEQ_LEN: ClassVar[int] = 512

    def validate(self) -> None:
        _at_least("probes.num_batches", self.num_batches, 1)
        _at_least("probes.every_n_validations", self.every_n_validations, 0)
        if self.seq_len is not None:
            _at_least("probes.seq_len", self.seq_len, 4)  # the debiased CKA needs 4 rows
        if self.debiased is not None:
            allowed = "obsolete: the biased and the debiased CKA are both always logged (probe/cka_<kind>_debiased/...); drop it"
            raise ConfigError("probes.debiased", self.debiased, allowed)

    def resolved_seq_len(self, data_seq_len: int) -> int:
        """The rows of every probed matrix: ``seq_len``, or max(``data_seq_len``, 512) when null."""
        return self.seq_len if self.seq_len is not None else max(data_seq_len, self.DEFAULT_MIN_SEQ_LEN)


@dataclass
class DepthEvalConfig:
    """The run's depth evaluation once it has finished (``mesh-eval RUN --loops ... --exit ...`` on its
    last checkpoint, in the training process; docs/depth.md), so a grid's cells are evaluated as they
    end, on any launcher. Nothing runs while ``loops`` is null and ``exit`` empty (the default). A
    finished run that is run again is evaluated then if its last step has no ``eval/depth-step<N>/``
    yet, so a grid re-run after this was added to its sweep file evaluates the cells it had trained.
    Not part of a run's identity (experiments/identity.py).
    """

    loops: list[int] | None = None  # the test-time loop counts; [] = 1..4K; null = no depth curve
    rules: list[str] = field(default_factory=lambda: list(LOOP_RULES))  # MeSH/static/dynamic: each rule past K
    exit: list[str] = field(default_factory=list)  # per-token exit criteria: state, output
    exit_eps: list[float] = field(default_factory=lambda: [0.0, 0.001, 0.003, 0.01, 0.03, 0.1])
    exit_loops: int | None = None  # the most core steps a token may run under exit (null: the run's K)

    @property
    def enabled(self) -> bool:
        return self.loops is not None or bool(self.exit)

    def validate(self) -> None:
        for k in self.loops or []:
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ConfigError(
                    "depth_eval.loops", list(self.loops or []), "loop counts are integers >= 1, e.g. [1,2,4,8]"
                )
        for rule in self.rules:
            if rule not in LOOP_RULES:
                raise ConfigError("depth_eval.rules", rule, f"use {', '.join(LOOP_RULES)} (docs/depth.md)")
        if not self.rules:
            raise ConfigError("depth_eval.rules", [], f"name at least one of {', '.join(LOOP_RULES)}")
        for criterion in self.exit:
            if criterion not in EXIT_CRITERIA:
                raise ConfigError("depth_eval.exit", criterion, f"use {', '.join(EXIT_CRITERIA)} (docs/depth.md)")
        for eps in self.exit_eps:
            if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < float("inf"):
                raise ConfigError("depth_eval.exit_eps", eps, "thresholds are finite numbers >= 0")
        if self.exit and not self.exit_eps:
            raise ConfigError("depth_eval.exit_eps", [], "give at least one threshold, e.g. [0, 0.01]")
        if self.exit_loops is not None:
            _at_least("depth_eval.exit_loops", self.exit_loops, 1)


@dataclass
class SearchConfig:
    """An Optuna search (run by ``mesh-sweep``, see sweeps/search.py), declared in a sweep file.

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

    def validate(self) -> None:
        _at_least("search.n_trials", self.n_trials, 0)
        if self.direction not in DIRECTIONS:
            raise ConfigError("search.direction", self.direction, f"use {' or '.join(DIRECTIONS)}")
        if self.pruner not in PRUNERS:
            raise ConfigError("search.pruner", self.pruner, f"use {' or '.join(PRUNERS)}")
        _at_least("search.pruner_startup_trials", self.pruner_startup_trials, 0)
        if isinstance(self.sampler_seed, bool) or not isinstance(self.sampler_seed, int):
            raise ConfigError("search.sampler_seed", self.sampler_seed, f"an integer from 0 to {MAX_SEED}")
        if not 0 <= self.sampler_seed <= MAX_SEED:
            raise ConfigError("search.sampler_seed", self.sampler_seed, f"an integer from 0 to {MAX_SEED}")
        if self.trial_id is not None:
            _at_least("search.trial_id", self.trial_id, 0)


@dataclass
class TrainConfig:
    """The schema of ``conf/train.yaml``, which adds the default groups and Hydra's own settings."""

    # The model axes (see mesh_model.ModelConfig): preset name, layout (null = the preset's),
    # scheme (or ``vanilla``), MeSH buffer length (null = K+3), any other ModelConfig field by name.
    model: str = "tiny"
    layout: str | None = None
    scheme: str = "base"
    buffer_slots: int | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0

    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    optim: OptimConfig = MISSING
    loops: LoopsConfig = field(default_factory=LoopsConfig)  # each training step's loop count (experiments/loops.py)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    depth_eval: DepthEvalConfig = field(default_factory=DepthEvalConfig)  # after training (docs/depth.md)

    # How long the run is, in optimizer steps; null: 200, or what ``tokens`` comes to.
    max_steps: int | None = None
    # A token budget instead of max_steps: max_steps = ceil(tokens / tokens per step).
    tokens: float | None = None
    # Sequences per optimizer step over every device and node; sets trainer.accumulate_grad_batches
    # = global_batch / (data.batch_size x devices x nodes), which must come out whole.
    global_batch: int | None = None
    val_every: int = 50
    log_every: int = 10
    checkpoint_every: int = 50
    runs_dir: str = "runs"
    resume: bool = True
    compile: bool = False  # torch.compile the model (one graph: the loop does not recompile)
    activation_checkpointing: bool = False  # recompute each core iteration in backward
    allow_large: bool = False  # train even when the step's memory estimate exceeds what is available
    # Train on past a non-finite loss (said in one line and tagged ``nonfinite``) instead of
    # stopping the run FAILED as diverged; checkpoints then keep non-finite weights too.
    allow_nonfinite: bool = False
    log_level: str | None = None  # Lightning/MLflow logging: null = warning (info under -v), info or debug

    DEFAULT_MAX_STEPS: ClassVar[int] = 200

    def validate(self) -> None:
        """Every field of the run, its groups and its model included, in one pass (no early return)."""
        for name in ("val_every", "log_every", "checkpoint_every"):
            _at_least(name, getattr(self, name), 1)
        if self.max_steps is not None:
            _at_least("max_steps", self.max_steps, 1)
        if self.tokens is not None:
            _at_least("tokens", self.tokens, 1)
            if self.max_steps is not None:
                raise ConfigError(
                    "max_steps",
                    self.max_steps,
                    f"tokens={self.tokens:g} sets the length already: give one (tokens=null)",
                )
        if self.global_batch is not None:
            _at_least("global_batch", self.global_batch, 1)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("seed", self.seed, f"seeds are integers from 0 to {MAX_SEED}")
        if not self.runs_dir:
            raise ConfigError("runs_dir", self.runs_dir, "give a folder for the runs (default: runs)")
        if self.log_level is not None and str(self.log_level).lower() not in LOG_LEVELS:
            raise ConfigError("log_level", self.log_level, f"use null (warning) or one of {', '.join(LOG_LEVELS)}")
        for part in (
            self.data,
            self.trainer,
            self.optim,
            self.loops,
            self.tracking,
            self.probes,
            self.search,
            self.depth_eval,
        ):
            part.validate()
        self.model_config()

    def model_axes(self) -> dict[str, Any]:
        """The model axes (``model``, ``layout``, ``scheme``, ``buffer_slots``, ``model_overrides``) by name."""
        return {name: getattr(self, name) for name in MODEL_AXES}

    def model_config(self, vocab_size: int | None = None) -> ModelConfig:
        """The run's model, resolved from its model axes (``scheme=vanilla`` included; ``vocab_size``,
        the tokenizer's, unless ``model_overrides`` sets one): a ``ConfigError`` naming the axis for a bad one.
        Sampled loop counts build per-step parameters up to the cap (``max_loops``) where the scheme
        has them (MeSH's per-step routers, static, dynamic) and the overrides do not say otherwise."""
        config = model_config_for(self.model_axes(), vocab_size)
        loops = self.loops
        if not loops.sampled:
            return config
        if not config.loopable:
            raise ConfigError(
                "loops",
                loops.distribution,
                f"layout {config.layout!r} has no single shared-weight core to loop a sampled number of times",
            )
        per_step = config.scheme_spec.kind in ("static", "dynamic") or (
            config.scheme_spec.kind == "mesh" and config.mesh_routers == "per_step"
        )
        cap = loops.cap or config.loops
        if per_step and config.max_loops is None and cap > config.loops:
            return config.replace(max_loops=cap)
        if per_step and config.parameter_loops < cap:
            raise ConfigError(
                "model_overrides.max_loops", config.max_loops, f"per-step parameters must reach loops.max={cap}"
            )
        return config

    def to_dict(self) -> dict[str, Any]:
        """The run's config as it is logged, hashed (experiments/identity.py) and written to
        ``config.yaml``: every field, each group a nested dict. Always derived from this object."""
        return dataclasses.asdict(self)


# The schema of each group; the options are the YAML files of experiments/conf/<group>/.
GROUP_SCHEMAS = {"data": DataConfig, "trainer": TrainerConfig, "optim": OptimConfig, "loops": LoopsConfig}
# Groups whose options set keys anywhere in the config (``# @package _global_``): no schema of
# their own, every key they set is typed by the schema it lands in.
GLOBAL_GROUPS = ("recipe", "arm")


def register_configs() -> None:
    """Put the schemas in Hydra's ConfigStore (idempotent)."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    for group, schema in GROUP_SCHEMAS.items():
        store.store(group=group, name="schema", node=schema)
