"""Optuna searches where a grid is too coarse, driven by ``mesh-sweep`` (Optuna 4.x/5.x).

A sweep file with ``search.n_trials > 0`` is a search. The driver keeps the study in an RDB
(``search.storage``, default ``sqlite:///<runs_dir>/optuna.db``) and runs trials in rounds: it
asks Optuna for as many trials as the launcher runs at once (``launcher=parallel`` or
``submitit_local``/``slurm`` run them side by side), launches them as ordinary cells (each an
MLflow run under the sweep's parent run, tagged with its trial number), and tells Optuna the
final validation loss. Inside each training process a Lightning callback
(experiments/callbacks/pruning.py) reports the validation loss at every validation and prunes the
trial when the pruner says so.

Re-running the same command resumes the study: finished and pruned trials count towards
``n_trials``; trials left running by an interrupted driver are launched again with the same
parameters (their training resumes from its checkpoint). The sampler is seeded with
``sampler_seed`` plus the number of trials already in the study, because reusing the same seed
on resume replays the same first suggestions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TextIO

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
from omegaconf import DictConfig, OmegaConf

from experiments.callbacks.pruning import make_pruner
from experiments.compose import compose_config
from experiments.config import SearchConfig
from sweeps.cells import FAILED, INTERRUPTED, Cell, CellOutcome
from sweeps.closing import GridEnd, exit_code, finish, settle_run
from sweeps.grid import SweepError, plan_where_it_runs, sweep_dir_for, sweep_key
from sweeps.launch.config import LaunchConfig
from sweeps.parent import ParentRun, invocation_tags, val_sets
from sweeps.progress import COMPLETED, GridConsole, trials_table

FINISHED_STATES = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


class SearchError(ValueError):
    """A bad search declaration; the message is one line."""


def distributions(search: SearchConfig) -> dict[str, optuna.distributions.BaseDistribution]:
    """Hydra sweep expressions -> Optuna distributions."""
    parser = OverridesParser.create()
    found: dict[str, optuna.distributions.BaseDistribution] = {}
    for name, expression in search.params.items():
        try:
            value = parser.parse_override(f"{name}={expression}").value()
        except Exception as error:
            raise SearchError(f"search.params.{name}={expression!r} is invalid: {error}") from None
        if isinstance(value, IntervalSweep):
            log = "log" in value.tags
            if isinstance(value.start, int) and isinstance(value.end, int):
                found[name] = optuna.distributions.IntDistribution(value.start, value.end, log=log)
            else:
                found[name] = optuna.distributions.FloatDistribution(float(value.start), float(value.end), log=log)
        elif isinstance(value, RangeSweep):
            found[name] = optuna.distributions.IntDistribution(
                int(value.start), int(value.stop) - 1, step=int(value.step)
            )
        elif isinstance(value, ChoiceSweep):
            found[name] = optuna.distributions.CategoricalDistribution(list(value.list))
        else:
            raise SearchError(
                f"search.params.{name}={expression!r} is invalid: use interval(a, b), tag(log, interval(a, b)), "
                "int(interval(a, b)), range(a, b) or choice(...)"
            )
    return found


def trial_overrides(search: SearchConfig, params: dict) -> list[str]:
    """Config overrides for one trial: sampled keys directly, template names through templates."""
    templated = {name for template in search.templates.values() for name in _template_names(template)}
    overrides = [f"{key}={value}" for key, value in params.items() if key not in templated]
    for key, template in search.templates.items():
        overrides.append(f"{key}={template.format(**params)}")
    return overrides


def _template_names(template: str) -> set[str]:
    import string

    return {field for _, field, _, _ in string.Formatter().parse(template) if field}


def open_study(search: SearchConfig, name: str, storage: str) -> optuna.Study:
    existing = existing_study(name, storage)
    seed = search.sampler_seed + (len(existing.trials) if existing else 0)
    return optuna.create_study(
        study_name=name,
        storage=storage,
        direction=search.direction,
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=make_pruner(search.pruner, search.pruner_startup_trials),
        load_if_exists=True,
    )


def _exists(name: str, storage: str) -> bool:
    return any(s.study_name == name for s in optuna.get_all_study_summaries(storage=storage))


def run_search(
    search: SearchConfig,
    study_name: str,
    storage: str,
    base_overrides: Sequence[str],
    dispatch: Callable[[Sequence[Cell]], Iterable[CellOutcome]],
    round_size: int,
    report: Callable[[CellOutcome], None] = lambda outcome: None,
    outcomes: list[CellOutcome] | None = None,
) -> tuple[optuna.Study, list[CellOutcome]]:
    """Run trials until the study holds ``n_trials`` finished (complete or pruned) ones; each
    outcome is appended to ``outcomes`` as it comes, so a caller interrupted midway has them.
    A trial interrupted by Ctrl-C stays RUNNING in the study: the next run launches it again."""
    space = distributions(search)
    make_pruner(search.pruner, search.pruner_startup_trials)  # a bad name fails before any trial
    study = open_study(search, study_name, storage)
    outcomes = [] if outcomes is None else outcomes
    while True:
        finished = sum(t.state in FINISHED_STATES for t in study.trials)
        if finished >= search.n_trials:
            return study, outcomes
        stale = [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
        wanted = min(round_size, search.n_trials - finished)
        trials = [(t._trial_id, t.number, t.params) for t in stale[:wanted]]
        for _ in range(wanted - len(trials)):
            trial = study.ask(space)
            trials.append((trial._trial_id, trial.number, trial.params))
        cells = [
            Cell(
                number,
                [
                    *base_overrides,
                    *trial_overrides(search, params),
                    f"search.trial_id={trial_id}",
                    f"search.study_name={study_name}",
                    f"search.storage={storage}",
                    f"+tracking.tags.optuna_trial={number}",
                ],
                " ".join(trial_overrides(search, params)),
            )
            for trial_id, number, params in trials
        ]
        for outcome in dispatch(cells):
            if outcome.status == INTERRUPTED:
                pass  # left RUNNING: relaunched with the same parameters when the search resumes
            elif outcome.status == "PRUNED":
                study.tell(outcome.index, state=optuna.trial.TrialState.PRUNED)
            elif outcome.status == "FINISHED" and outcome.val_loss is not None:
                study.tell(outcome.index, outcome.val_loss)
            else:
                study.tell(outcome.index, state=optuna.trial.TrialState.FAIL)
            outcomes.append(outcome)
            report(outcome)


def existing_study(name: str, storage: str) -> optuna.Study | None:
    """The study ``name`` in ``storage``; None when there is none yet."""
    return optuna.load_study(study_name=name, storage=storage) if _exists(name, storage) else None


def default_storage(runs_dir: Path) -> str:
    return f"sqlite:///{(runs_dir / 'optuna.db').resolve()}"


def run_search_sweep(
    name: str,
    base: DictConfig,
    cell_overrides: Sequence[str],
    launch: LaunchConfig,
    dry_run: bool,
    out: TextIO,
    command: str,
) -> int:
    """``mesh-sweep`` of a search: ``base`` is the sweep's composed run config (a TrainConfig, its
    ``search`` group declaring the space); trials are cells under the sweep's parent run. Exits as
    a grid does (:func:`~sweeps.closing.exit_code`)."""
    search: SearchConfig = OmegaConf.to_object(base.search)  # type: ignore[assignment]
    try:
        space = distributions(search)
    except SearchError as error:
        raise SweepError(str(error)) from None
    overrides = [f"+sweep={name}", *cell_overrides]
    plan = plan_where_it_runs(base, launch)
    storage = search.storage or default_storage(plan.run_dir.parent.parent)
    # The study is the same however many trials are asked for: search.* stays out of its key.
    shared = [o for o in cell_overrides if not o.startswith("search.")]
    key = sweep_key(name, [Cell(0, [f"+sweep={name}", *shared])])
    study_name = search.study_name or key
    if dry_run:
        print(f"{name}: Optuna search, {search.n_trials} trials, study {study_name!r} in {storage}", file=out)
        for param, distribution in space.items():
            print(f"  {param}: {distribution}", file=out)
        return 0
    sweep_dir = sweep_dir_for(plan, key)
    launch.launcher.check(sweep_dir / "submitit", launch.resources)
    packing = launch.launcher.prepare([plan] * search.n_trials)  # trials are alike in what they need
    tags = {
        **invocation_tags(command, launch),
        "study": study_name,
        "search.n_trials": str(search.n_trials),
        "search.space": " ".join(f"{k}={v}" for k, v in search.params.items()),
    }
    params = {"sweep": name, "overrides": " ".join(shared)}
    parent = ParentRun.open(name, key, plan, sweep_dir, [Cell(0, overrides)], params, tags, val_sets([plan]))
    base_overrides = [*overrides, f"tracking.parent_run_id={parent.run_id}", f"tracking.sweep={name}"]
    study = existing_study(study_name, storage)
    already = parent.earlier = sum(trial.state in FINISHED_STATES for trial in study.trials) if study else 0
    to_run = max(0, search.n_trials - already)
    console = GridConsole(out, search.n_trials, to_run, launch.launcher.concurrency, kind="trial", done=COMPLETED)
    console.say(f"{name}: Optuna search to {search.n_trials} trials, {already} already finished, study {study_name!r}")
    if packing and to_run:
        console.say(packing)

    def report(outcome: CellOutcome) -> None:
        if outcome.status in (FAILED, INTERRUPTED):
            settle_run(
                parent.tracking_uri, plan_where_it_runs(compose_config(outcome.overrides), launch).run_dir, outcome
            )
        console.ended(outcome)
        parent.try_progress(outcomes, search.n_trials)

    outcomes: list[CellOutcome] = []
    interrupted = False
    try:
        run_search(
            search,
            study_name,
            storage,
            base_overrides,
            lambda cells: launch.launcher.launch(cells, launch.resources, sweep_dir / "submitit", console.started),
            launch.launcher.concurrency,
            report,
            outcomes,
        )
    except KeyboardInterrupt:
        interrupted = True
    except BaseException as error:
        parent.close(outcomes, search.n_trials, error=error)
        raise
    table = trials_table(name, existing_study(study_name, storage), outcomes)
    if interrupted:
        table += "\n\ninterrupted; running trials were stopped, re-run the command to resume the study"
    finish(GridEnd(parent, plan, sweep_dir, search.n_trials), outcomes, table, interrupted, out)
    return exit_code(outcomes, interrupted)
