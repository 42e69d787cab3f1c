"""From a grid and the command line to the launch settings, the list of cells and their plans,
and the grid's key (the same for every command naming the same cells: a run, ``--status``,
``--cancel``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from omegaconf import DictConfig, OmegaConf

from experiments.compose import compose_config, group_options
from experiments.overrides import OverrideError, check_overrides, parse_overrides
from experiments.plan import RunPlan, plan_run, with_seed
from mesh_model import ConfigError, did_you_mean
from sweeps.catalogue import sweep_names
from sweeps.cells import Cell
from sweeps.launch.base import ResourcesConfig
from sweeps.launch.config import CONFIG_MODULE, LAUNCHERS, LaunchConfig, register_launch_configs

LAUNCH_KEYS = ("launcher", "resources", "seeds")


class SweepError(ValueError):
    """A bad sweep request; the message is one line."""


def split_arguments(arguments: Sequence[str]) -> tuple[list[str], list[str]]:
    """(launch overrides, cell overrides)."""
    launch: list[str] = []
    cells: list[str] = []
    for argument in arguments:
        key = argument.lstrip("+~").split("=", 1)[0].split(".", 1)[0]
        (launch if key in LAUNCH_KEYS else cells).append(argument)
    return launch, cells


def launch_schema(launcher: str) -> DictConfig:
    """The keys a launch override may name when ``launcher=<launcher>`` is chosen."""
    schema = OmegaConf.structured(LaunchConfig)
    schema.launcher = OmegaConf.structured(LAUNCHERS[launcher])
    schema.resources = OmegaConf.structured(ResourcesConfig)
    return schema


DEFAULT_LAUNCHER = "auto"  # as sweeps/conf/launch.yaml chooses


def compose_launch(overrides: Sequence[str]) -> LaunchConfig:
    """The launch settings (sweeps/conf/launch.yaml), checked."""
    groups = {group: group_options(group, CONFIG_MODULE) for group in ("launcher", "resources")}
    keyed = [o for o in overrides if not o.startswith("seeds=")]
    try:
        chosen = [o.partition("=")[2] for o in keyed if o.partition("=")[0] == "launcher"] or [DEFAULT_LAUNCHER]
        schema = launch_schema(chosen[-1] if chosen[-1] in LAUNCHERS else DEFAULT_LAUNCHER)
        check_overrides(keyed, schema=schema, groups=groups, open_keys=())
    except OverrideError as error:
        raise SweepError(str(error)) from None
    normalized = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "seeds":
            value = "[" + ",".join(str(s) for s in parse_seeds(value)) + "]"
        normalized.append(f"{key}={value}")
    register_launch_configs()
    try:
        launch = OmegaConf.to_object(compose_config(normalized, config_name="launch", config_module=CONFIG_MODULE))
    except Exception as error:
        raise SweepError(str(error).splitlines()[0]) from None
    assert isinstance(launch, LaunchConfig)
    launch.validate()
    return launch


SEEDS_ALLOWED = "seeds must be >= 1 or a list of seeds (seeds=3 means 0,1,2; seeds=[0,7] those two)"


def parse_seeds(value: str) -> list[int]:
    """``seeds=N`` (N >= 1) means seeds 0..N-1; ``seeds=[a,b,...]`` those seeds (distinct, >= 0)."""
    text = value.strip()
    if text.startswith("[") and text.endswith("]"):
        items = [item.strip() for item in text[1:-1].split(",") if item.strip()]
        if items and all(_is_int(item) for item in items):
            seeds = [int(item) for item in items]
            if min(seeds) >= 0 and len(set(seeds)) == len(seeds):
                return seeds
        raise ConfigError("seeds", value, f"{SEEDS_ALLOWED}; listed seeds are distinct integers >= 0")
    if _is_int(text) and int(text) >= 1:
        return list(range(int(text)))
    raise ConfigError("seeds", value, SEEDS_ALLOWED)


def check_seed_stages(stage: int, most: int, alpha: float) -> None:
    """``seeds.stage``, ``seeds.max`` and ``seeds.alpha`` of a group-sequential grid, one line each
    (the CLI's :class:`AutoSeeds` and the design, ``results.stats.sequential.Design``, share it)."""
    if stage < 2:
        raise ConfigError("seeds.stage", stage, "an integer >= 2 (a paired t-test needs two seeds per arm)")
    if most < stage:
        raise ConfigError("seeds.max", most, f"an integer >= seeds.stage={stage}")
    if not 0 < alpha < 1:
        raise ConfigError("seeds.alpha", alpha, "a number strictly between 0 and 1, e.g. 0.05")


# The alpha-spending functions of seeds=auto (results/stats/sequential.py's spent()).
SPENDING = ("obrien_fleming", "pocock")


@dataclass(frozen=True)
class AutoSeeds:
    """``seeds=auto``: seeds added ``stage`` at a time up to ``max`` per arm, while a primary claim
    is undecided at family-wise ``alpha`` (results/stats/sequential.py); stops early past a budget."""

    stage: int = 3
    max: int = 12
    alpha: float = 0.05
    spending: str = "obrien_fleming"
    futility: bool = True  # stop a claim whose one-sided bound excludes the paper's effect
    budget_cpu_h: float | None = None
    budget_gpu_h: float | None = None
    first: int = 0  # the first seed: stages run first..first+max-1 (a confirmation grid on fresh seeds)
    every_arm: bool = False  # every arm runs every stage while a claim is open (the rows stay on the same seeds)
    # A report folder (mesh-results --out) of this grid's earlier part, run in another store: its
    # finished cells count at their looks and are not trained again (a grid run in parts).
    earlier: str = ""

    def __post_init__(self) -> None:
        check_seed_stages(self.stage, self.max, self.alpha)
        if self.earlier and not (Path(self.earlier) / "runs.csv").is_file():
            raise ConfigError(
                "seeds.earlier",
                self.earlier,
                "a report folder of this grid's earlier part (mesh-results --out) with its runs.csv",
            )
        if self.spending not in SPENDING:
            raise ConfigError("seeds.spending", self.spending, " or ".join(SPENDING))
        if isinstance(self.first, bool) or not isinstance(self.first, int) or self.first < 0:
            raise ConfigError("seeds.first", self.first, "an integer >= 0 (the first seed of seeds=auto)")
        for name in ("budget_cpu_h", "budget_gpu_h"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"seeds.{name}", value, "a number of hours > 0")


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


AUTO_KEYS: dict[str, Callable[[str], Any]] = {
    "stage": int,
    "max": int,
    "alpha": float,
    "spending": str,
    "futility": _flag,
    "budget_cpu_h": float,
    "budget_gpu_h": float,
    "first": int,
    "every_arm": _flag,
    "earlier": str,
}


def split_auto_seeds(arguments: Sequence[str]) -> tuple[AutoSeeds | None, list[str]]:
    """(the ``seeds=auto`` settings or None, the arguments without ``seeds=auto`` and ``seeds.*``)."""
    auto = any(a == "seeds=auto" for a in arguments)
    given = {}
    rest = []
    for argument in arguments:
        key, _, value = argument.partition("=")
        if argument == "seeds=auto":
            continue
        if not key.startswith("seeds."):
            rest.append(argument)
            continue
        name = key.removeprefix("seeds.")
        if name not in AUTO_KEYS:
            known = ", ".join(f"seeds.{k}" for k in AUTO_KEYS)
            raise ConfigError(key, value, f"{did_you_mean(name, list(AUTO_KEYS))}one of {known}")
        try:
            given[name] = AUTO_KEYS[name](value)
        except ValueError:
            kind = "true or false" if AUTO_KEYS[name] is _flag else f"a {AUTO_KEYS[name].__name__}"
            raise ConfigError(key, value, kind) from None
    if given and not auto:
        name = next(iter(given))
        raise ConfigError(f"seeds.{name}", given[name], "needs seeds=auto beside it (add seeds=auto, or drop it)")
    if auto and any(a.startswith("seeds=") for a in rest):
        raise ConfigError("seeds", "auto and a number", "one seeds= (seeds=auto adds seeds in stages itself)")
    return (AutoSeeds(**given) if auto else None), rest


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def fixed_overrides(cell_overrides: Sequence[str]) -> list[str]:
    """The overrides that are not comma lists: they apply to every cell."""
    return [o.input_line for o in parse_overrides(cell_overrides) if not o.is_sweep_override()]


def expand_cells(name: str, cell_overrides: Sequence[str], seeds: Sequence[int]) -> list[Cell]:
    """The grid: the sweep file's params, replaced or extended by comma lists on the command line."""
    base = compose_config([f"+sweep={name}", *fixed_overrides(cell_overrides)], hydra_config=True)
    swept = OmegaConf.to_container(base.hydra.sweeper.params) or {}
    assert isinstance(swept, dict)
    params = {str(key): value for key, value in swept.items()}
    fixed = []
    for override in parse_overrides(cell_overrides):
        key = override.get_key_element()
        if override.is_sweep_override() or key in params:  # replaces the axis (one value pins it)
            params[key] = override.input_line.split("=", 1)[1]
        else:
            fixed.append(override.input_line)
    if seeds:
        params["seed"] = ",".join(str(s) for s in seeds)
    axes = parse_overrides([f"{key}={value}" for key, value in params.items()])
    (combinations,) = BasicSweeper.split_arguments(axes, None)
    return [Cell(i, [f"+sweep={name}", *fixed, *combo], " ".join(combo)) for i, combo in enumerate(combinations)]


def sweep_key(name: str, cells: Sequence[Cell]) -> str:
    """An Optuna search's key (its study's name): the overrides it was started with."""
    digest = hashlib.sha256(json.dumps([c.overrides for c in cells]).encode()).hexdigest()[:10]
    return f"{name}-{digest}"


def grid_key(name: str, plans: Sequence[RunPlan]) -> str:
    """A grid's key: the runs it computes (their hashes, in grid order), not how it was spelled
    or where its store lives (``runs_dir``, ``tracking.*``, ``checkpoint_every`` stay out), so
    ``--status`` finds a grid from any path to its store and ``tokens=`` finds it as ``max_steps=``."""
    digest = hashlib.sha256(json.dumps([p.config_hash for p in plans]).encode()).hexdigest()[:10]
    return f"{name}-{digest}"


def read_request(name: str, arguments: Sequence[str]) -> tuple[LaunchConfig, list[str], DictConfig]:
    """(launch settings, the overrides of every cell, the sweep's config without its grid), checked."""
    if name not in sweep_names():
        known = sweep_names()
        raise SweepError(f"sweep={name!r} is invalid: {did_you_mean(name, known)}known sweeps: {', '.join(known)}")
    if any(a.startswith("seeds.") or a == "seeds=auto" for a in arguments):
        split_auto_seeds(arguments)  # seeds.* without seeds=auto: said in one line
        raise SweepError("seeds=auto runs through mesh-sweep's stage driver (results/commands/seeds_auto.py)")
    launch_overrides, cell_overrides = split_arguments(arguments)
    check_overrides(cell_overrides)
    launch = compose_launch(launch_overrides)
    given = [o for o in cell_overrides if o.lstrip("+~").split("=", 1)[0] == "seed"]
    if given and launch.seeds:  # seeds= would replace it silently
        value = given[-1].split("=", 1)[1]
        raise SweepError(
            f"{given[-1]} is invalid beside seeds=: a grid's seeds come from seeds= alone "
            f"(seeds=[{value}] runs seed {value}; seeds=3 runs 0,1,2)"
        )
    return launch, cell_overrides, compose_config([f"+sweep={name}", *fixed_overrides(cell_overrides)])


def grid_cells(name: str, cell_overrides: Sequence[str], launch: LaunchConfig) -> tuple[list[Cell], list[RunPlan]]:
    """The cells (:func:`launched_cells`) and each one's plan: every cell checked before compute."""
    cells = launched_cells(name, cell_overrides, launch)
    return cells, plan_cells(cells, launch)


def launched_cells(name: str, cell_overrides: Sequence[str], launch: LaunchConfig) -> list[Cell]:
    """The cells, with what the launcher adds for the resources (``trainer.devices``...); not planned."""
    cells = expand_cells(name, cell_overrides, launch.seeds)
    if extra := launch.launcher.cell_overrides(launch.resources):
        cells = [Cell(c.index, [*c.overrides, *extra], c.label) for c in cells]
    return cells


def config_of(cell: Cell) -> tuple[tuple[str, ...], int | None]:
    """(the cell's overrides without its seed, its seed): cells with the same first part differ
    only in their seed. The seed is None where the cell has no seed axis (or an odd one): then
    the first part is all its overrides."""
    seeds = [o.split("=", 1)[1] for o in cell.overrides if o.startswith("seed=")]
    if len(seeds) != 1 or not _is_int(seeds[0]):
        return tuple(cell.overrides), None
    return tuple(o for o in cell.overrides if not o.startswith("seed=")), int(seeds[0])


def plan_cells(cells: Sequence[Cell], launch: LaunchConfig) -> list[RunPlan]:
    """Every cell's plan, each distinct config composed and checked once: cells that differ only
    in their seed get its plan at their seed (:func:`~experiments.plan.with_seed`), so a grid of
    thousands of seeds plans in about the time of its distinct configs."""
    planned: dict[tuple[str, ...], RunPlan] = {}
    plans = []
    for cell in cells:
        rest, seed = config_of(cell)
        if seed is None:
            plans.append(plan_where_it_runs(compose_config(cell.overrides), launch))
            continue
        if rest not in planned:
            planned[rest] = plan_where_it_runs(compose_config(cell.overrides), launch)
        plans.append(with_seed(planned[rest], seed))
    return plans


def plan_where_it_runs(cfg: DictConfig, launch: LaunchConfig) -> RunPlan:
    """:func:`~experiments.plan.plan_run` for the machine the launcher runs the cell on (a SLURM
    job's node: its memory, and a trainer that agrees with the GPUs asked for)."""
    plan = plan_run(cfg, launch.launcher.memory_limit(launch.resources))
    launch.launcher.check_trainer(plan.trainer, launch.resources)
    return plan


def sweep_dir_for(plan: RunPlan, key: str) -> Path:
    """``<runs_dir>/<experiment>/sweeps/<key>/``: the parent run's id, the summary, the SLURM jobs
    (``jobs.json``), submitit's files."""
    return plan.run_dir.parent / "sweeps" / key
