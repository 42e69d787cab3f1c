"""Train one model: ``mesh-train model=tiny layout=1+2R3+1 scheme=mesh``.

A run lives in ``<runs_dir>/<experiment>/<run key>/``: ``checkpoints/last.ckpt``, the MLflow run
id (``mlflow_run_id``), the resolved ``config.yaml`` and, once finished, ``result.json``.
Running the same command again resumes from ``last.ckpt`` into the same MLflow run, or, if
the run already finished, returns its result without training.
"""

# train() is the pure entry point (tests and sweepers import it); main() is the thin @hydra.main
# wrapper that returns the objective (final validation loss); cli() answers --help and --version
# before anything heavy is imported: the imports inside the functions below are deliberate (torch,
# Lightning and MLflow load in seconds; even experiments.plan adds a quarter of a second to --help).

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import warnings
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra

from experiments.console import quiet_libraries, take_verbose_flag, train_help
from mesh_model.cli_text import commit, version_line

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from experiments.data.prepare import PreparedData
    from experiments.plan import RunPlan
    from experiments.tracking import RunRecord
    from mesh_model import ModelConfig


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train (or resume, or return the finished result of) the run ``cfg`` describes.

    Rank 0 holds the run directory's lock for the whole run: the same run started twice stops
    the second one at once (:class:`~experiments.locks.RunInUseError`)."""
    from experiments.hardware import launched_rank
    from experiments.locks import RunLock
    from experiments.plan import plan_run
    from experiments.store.sqlite import isolated_tracking_uri

    quiet_libraries(getattr(cfg, "log_level", None))
    plan = plan_run(cfg)
    started = time.perf_counter()
    with ExitStack() as locks:
        if launched_rank() == 0:
            locks.enter_context(RunLock(plan.run_dir))
        prepared = _prepare_data(plan)
        if (other := _other_tokenizer(plan, prepared)) is not None:  # another run: its own hash and folder
            plan = other
            if launched_rank() == 0:
                locks.enter_context(RunLock(plan.run_dir))
        if plan.train.resume and plan.result_file.exists():
            print(f"[mesh-train] already finished: {plan.run_dir}", file=sys.stderr)
            result = json.loads(plan.result_file.read_text())
        else:
            if launched_rank() == 0:
                _say_other_lengths(plan)
            with isolated_tracking_uri():
                result = _train(plan, started, prepared)
        if launched_rank() == 0 and plan.train.depth_eval.enabled:
            _evaluate_depth(plan)
        return result


DEPTH_EVAL_SECONDS = "time/depth_eval_s"  # the run's depth_eval, in seconds (a metric of its MLflow run)


def _evaluate_depth(plan: RunPlan) -> None:
    """``depth_eval``: the finished run at other loop counts and under a per-token exit, as
    ``mesh-eval RUN --loops/--exit`` evaluates it (logged into its MLflow run), unless its last
    checkpoint was evaluated under these settings already. A failure fails the cell, not the run:
    the run stays FINISHED and a re-run evaluates it again."""
    import torch

    from experiments.evaluation.depth import DepthSettings, run_depth
    from experiments.evaluation.depth_record import evaluated_with
    from experiments.evaluation.evaluate import EvalSettings, resolve_target

    asked = plan.train.depth_eval
    settings = DepthSettings(list(asked.loops) if asked.loops is not None else None, list(asked.rules),
                             list(asked.exit), [float(e) for e in asked.exit_eps], asked.exit_loops)  # fmt: skip
    if evaluated_with(plan.run_dir, asdict(settings)):
        print(f"[mesh-train] depth evaluation: done already ({plan.run_dir / 'eval'})", file=sys.stderr)
        return
    started = time.perf_counter()
    target = resolve_target(EvalSettings(target=str(plan.run_dir), tracking_uri=plan.tracking_uri))
    device = (
        "cuda" if torch.cuda.is_available() and plan.train.trainer.accelerator in ("gpu", "cuda", "auto") else "cpu"
    )
    report = run_depth(target, settings, device)
    seconds = time.perf_counter() - started
    if target.run_id is not None and target.tracking_uri is not None:  # its cost, beside the run's time/*
        import mlflow

        mlflow.MlflowClient(target.tracking_uri).log_metric(target.run_id, DEPTH_EVAL_SECONDS, seconds)
    files = ", ".join(str(path) for path in report["files"])
    print(f"[mesh-train] depth evaluation at step {report['step']} in {seconds:.0f} s: {files}", file=sys.stderr)


def _other_tokenizer(plan: RunPlan, prepared: PreparedData) -> RunPlan | None:
    """``plan`` as another run when its tokenizer's content differs from the one its config's runs
    used: the tokenizer recorded in its run folder (the same command, after the cached tokenizer
    changed), or by the runs of its table row (any seed) in the store. Its hash then takes the
    tokenizer's digest (:func:`~experiments.identity.tokenizer_hash`), so the two never share a
    config hash, a folder or a results row (the run logs the param ``data.tokenizer_sha256``)."""
    import dataclasses

    from experiments.identity import TOKENIZER_RECORD, tokenizer_hash
    from experiments.plan import run_dir_for

    digest = _tokenizer_digest(prepared)
    if digest is None:
        return None
    record = plan.run_dir / TOKENIZER_RECORD
    recorded = record.read_text().strip() if record.is_file() else None
    used = {recorded} if recorded else _row_tokenizers(plan)
    if not used or digest in used:
        return None
    forked = tokenizer_hash(plan.config_hash, digest)
    run_dir = run_dir_for(plan.run_dir.parent, plan.model_config, plan.train.seed, forked)
    print(
        f"[mesh-train] the tokenizer (sha256 {digest[:12]}) is not the one runs of config {plan.config_hash} used "
        f"(sha256 {', '.join(sorted(u[:12] for u in used))}): another run, config hash {forked}, in {run_dir}",
        file=sys.stderr,
        flush=True,
    )
    return dataclasses.replace(plan, config_hash=forked, run_dir=run_dir, tokenizer_fork=digest)


def _tokenizer_digest(prepared: PreparedData) -> str | None:
    from experiments.identity import tokenizer_digest

    return None if prepared.tokenizer is None else tokenizer_digest(prepared.tokenizer.backend.to_str())


def _row_tokenizers(plan: RunPlan) -> set[str]:
    """The tokenizer digests of the runs of ``plan``'s row (same config at any seed) in its
    experiment that were not themselves set apart by their tokenizer."""
    import mlflow

    from experiments.identity import ROW_HASH_TAG, TOKENIZER_FORK_TAG, TOKENIZER_TAG
    from experiments.store.sqlite import sqlite_path

    path = sqlite_path(plan.tracking_uri)
    if path is not None and not path.is_file():
        return set()
    try:
        client = mlflow.MlflowClient(plan.tracking_uri)
        experiment = client.get_experiment_by_name(plan.experiment)
        if experiment is None:
            return set()
        found = client.search_runs(
            [experiment.experiment_id], f"tags.{ROW_HASH_TAG} = '{_row_hash(plan)}'", max_results=1000
        )
    except Exception:  # the store's own checks answer later, in their one line
        return set()
    return {
        r.data.tags[TOKENIZER_TAG]
        for r in found
        if TOKENIZER_TAG in r.data.tags and TOKENIZER_FORK_TAG not in r.data.tags
    }


def _row_hash(plan: RunPlan) -> str:
    import dataclasses

    from experiments.identity import config_hash

    return config_hash(dataclasses.replace(plan.train, seed=0).to_dict(), plan.model_config)


def _say_other_lengths(plan: RunPlan) -> None:
    """One line when this run starts from step 0 while the same config ran to another
    ``max_steps``: a run is not extended (its LR schedule ends at its ``max_steps``)."""
    from experiments.plan import other_lengths

    if plan.train.resume and any(plan.checkpoint_dir.glob("*.ckpt")):  # it resumes: not a new run
        return
    others = other_lengths(plan)
    if not others:
        return
    said = "; ".join(
        f"max_steps={o.max_steps} ({'finished' if o.finished else 'unfinished'}) in {o.run_dir}" for o in others
    )
    print(
        f"[mesh-train] max_steps={plan.train.max_steps} is a new run, trained from step 0: the same config ran to "
        f"{said}; a run is never extended, as its LR warmup and cosine decay end at its max_steps",
        file=sys.stderr,
        flush=True,
    )


def _train(plan: RunPlan, started: float, prepared: PreparedData) -> dict[str, Any]:
    from omegaconf import OmegaConf

    from experiments.data.cache import atomic_path
    from experiments.hardware import launched_rank
    from experiments.identity import TOKENIZER_RECORD
    from experiments.plan import padded_vocab

    warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # Lightning 2.6 on torch >= 2.10
    import lightning.pytorch as pl  # heavy imports only once the inputs are known to be good

    from experiments.callbacks.checkpointing import newest_intact_checkpoint
    from experiments.callbacks.timing import RunTimer
    from experiments.data.datamodule import TokenDataModule
    from experiments.store.views import finished_run_note, run_metric_url, set_run_description
    from experiments.trainer import build_module, build_trainer, run_callbacks

    model_config = plan.train.model_config(padded_vocab(prepared.vocab_size))
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    (plan.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(plan.config)))
    if launched_rank() == 0 and (digest := _tokenizer_digest(prepared)) is not None:
        (plan.run_dir / TOKENIZER_RECORD).write_text(f"{digest}\n")
    record = _open_record(plan, model_config, prepared) if launched_rank() == 0 else None  # rank 0 owns the run
    resume_from = newest_intact_checkpoint(plan.checkpoint_dir) if plan.train.resume else None
    if resume_from is not None and launched_rank() == 0:  # Lightning's own line is hidden by default
        print(f"[mesh-train] resuming from {resume_from}", file=sys.stderr, flush=True)
    trainer = None
    try:
        pl.seed_everything(plan.train.seed, workers=True, verbose=False)
        datamodule = TokenDataModule(plan.data, seed=plan.train.seed, prepared=prepared)
        # Metrics name each validation set by its corpus: val/shakespeare/loss, val/cpython/ppl...
        val_names = [plan.data.corpus if name == "val" else name for name in datamodule.val_names]
        module = build_module(plan, model_config, val_names)
        if record is not None and record.is_new:
            record.log_facts(*_run_facts(plan, model_config, module.model, prepared, val_names))
        timer = RunTimer(started)
        logged = record.last_logged_steps if record is not None else None
        callbacks = [timer, *run_callbacks(plan, val_names)]
        trainer = build_trainer(plan, record and record.run_id, callbacks, logged)
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
        if not timer.trained_any_step:  # resumed from its last step's checkpoint: killed after saving it
            _end_without_training(trainer, module, datamodule, callbacks)
        elif trainer.global_step % plan.train.val_every != 0:
            trainer.validate(module, datamodule=datamodule, verbose=False)
        result = _result(plan, trainer, val_names[0], record)  # a failure here marks the run FAILED too
    except BaseException as error:
        stop = _stopped(error, trainer)
        full = _disk_full_error(plan, error) if stop is None else None
        if record is not None:
            _record_stop(record, full or error, stop, trainer.global_step if trainer is not None else 0)
        if stop is not None:
            raise stop from None
        if full is not None:
            raise full from None
        raise
    if record is not None:
        result["timing"] = asdict(timing := timer.finish())
        set_run_description(record.client, record.run_id, finished_run_note(result, val_names))
        experiment_id = record.client.get_run(record.run_id).info.experiment_id
        result["page"] = run_metric_url(plan.tracking_uri, experiment_id, record.run_id, f"val/{val_names[0]}/ppl")
        record.finish({"val_loss": result["val_loss"], **timing.as_metrics()}, trainer.global_step)
        with atomic_path(plan.result_file) as partial:  # its presence means finished: never half-written
            partial.write_text(json.dumps(result, indent=2))
    return result


def _disk_full_error(plan: RunPlan, error: BaseException) -> BaseException | None:
    """The one-line :class:`~experiments.callbacks.checkpointing.DiskFull` for a disk that filled
    while the run logged to MLflow or wrote its files (a checkpoint has its own,
    :class:`~experiments.callbacks.checkpointing.NoSpaceLeft`); None for any other error."""
    from experiments.callbacks.checkpointing import DiskFull, NoSpaceLeft
    from experiments.disk import disk_full
    from experiments.store.sqlite import sqlite_path

    if isinstance(error, NoSpaceLeft) or not disk_full(error):
        return None
    store = sqlite_path(plan.tracking_uri)
    return DiskFull([p for p in (store, plan.run_dir) if p is not None], plan.checkpoint_dir, store)


def _end_without_training(trainer: Any, module: Any, datamodule: Any, callbacks: list[Any]) -> None:
    """The end of a run whose process died after the last step's checkpoint and before its result:
    Lightning's fit restores it at ``max_steps`` and returns without a validation or an end-of-fit
    hook, so the final validation and the end-of-run probes run here. Steps the MLflow run already
    holds are not logged again (:class:`~experiments.trainer.ResumedMLFlowLogger`)."""
    from experiments.probing.callback import ProbeCallback
    from experiments.probing.state_routing import StateRoutingCallback

    trainer.validate(module, datamodule=datamodule, verbose=False)
    for callback in callbacks:
        if isinstance(callback, ProbeCallback | StateRoutingCallback):
            callback.on_train_end(trainer, module)


class Terminated(SystemExit):
    """The run stopped on SIGTERM after saving ``last.ckpt``; exit code 143 (128 + SIGTERM)."""

    def __init__(self, step: int) -> None:
        super().__init__(128 + signal.SIGTERM)
        self.step = step


def _record_stop(record: RunRecord, error: BaseException, stop: BaseException | None, step: int) -> None:
    """KILLED with the reason for a deliberate stop (Ctrl-C, SIGTERM, a pruned trial), else FAILED;
    a divergence or a full disk has its one line as the ``error`` tag (``diverged at step N: ...``)."""
    from experiments.callbacks.checkpointing import DiskFull, NoSpaceLeft
    from experiments.callbacks.divergence import Diverged

    if isinstance(stop, KeyboardInterrupt):
        record.mark_killed("interrupted", f"Ctrl-C at step {step}; run the same command to resume")
    elif isinstance(stop, Terminated):
        record.mark_killed("terminated", f"SIGTERM at step {step}; run the same command to resume")
    elif is_pruned(error):
        record.mark_killed("pruned", f"{type(error).__name__}: {error}")
    elif isinstance(error, Diverged | NoSpaceLeft | DiskFull):
        record.mark_failed(error, str(error))
    else:
        record.mark_failed(error)


def is_pruned(error: BaseException) -> bool:
    """Whether ``error`` is Optuna's TrialPruned: a trial of a search stopped early on purpose. By
    name, so that a run outside a search never imports Optuna."""
    return type(error).__name__ == "TrialPruned"


def _is_run_failure(error: BaseException) -> bool:
    """A divergence or a full disk: a failure with its own one-line answer (no traceback)."""
    from experiments.callbacks.checkpointing import DiskFull, NoSpaceLeft
    from experiments.callbacks.divergence import Diverged

    return isinstance(error, Diverged | NoSpaceLeft | DiskFull)


def _stopped(error: BaseException, trainer: Any) -> BaseException | None:
    """The deliberate stop ``error`` stands for: KeyboardInterrupt for Ctrl-C (Lightning turns it
    into ``SystemExit(1)`` after its own clean-up), :class:`Terminated` for SIGTERM; None for a
    failure."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    step = trainer.global_step if trainer is not None else 0
    if isinstance(error, SIGTERMException):
        return Terminated(step)
    if isinstance(error, KeyboardInterrupt):
        return error
    if type(error) is SystemExit and trainer is not None and trainer.interrupted:
        return KeyboardInterrupt()
    return None


def _prepare_data(plan: RunPlan):
    """Corpus and tokenizer problems (unreadable, empty) surface here, before Lightning loads."""
    from experiments.data.prepare import prepare
    from experiments.plan import InputError

    try:
        return prepare(plan.data)
    except (OSError, ValueError) as error:
        raise InputError(str(error).splitlines()[0] if str(error) else repr(error)) from None


def _open_record(plan: RunPlan, model_config: ModelConfig, prepared: PreparedData) -> RunRecord:
    """The run's MLflow run, named by :func:`~experiments.identity.run_name` unless
    ``tracking.run_name`` is set, tagged with its coordinates and what it computes from: its
    tokenizer's and token cache's digests, and its row's hash (see :func:`_other_tokenizer`)."""
    from experiments.data.prepare import TOKEN_FORMAT
    from experiments.identity import ROW_HASH_TAG, TOKEN_CACHE_TAG, TOKENIZER_FORK_TAG, TOKENIZER_TAG, run_name
    from experiments.tracking import RunRecord

    tags = {
        "scheme": model_config.variant,
        "layout": model_config.layout,
        "preset": str(model_config.preset),
        "seed": str(plan.train.seed),
        "buffer_slots": str(model_config.slots or ""),
        "config_hash": plan.config_hash,
        "git_commit": commit(full=True),
        "run_dir": str(plan.run_dir),
        ROW_HASH_TAG: _row_hash(plan),
    }
    if (digest := _tokenizer_digest(prepared)) is not None and prepared.tokenizer is not None:
        from experiments.data.cache import digest as cache_key

        tags[TOKENIZER_TAG] = digest
        tags[TOKEN_CACHE_TAG] = cache_key(
            prepared.identity, plan.data.val_fraction, prepared.tokenizer.identity, TOKEN_FORMAT
        )
    if plan.tokenizer_fork:
        tags[TOKENIZER_FORK_TAG] = plan.tokenizer_fork
    tracking = plan.train.tracking
    if tracking.sweep:
        tags["sweep"] = tracking.sweep
    tags.update({str(k): str(v) for k, v in tracking.tags.items()})
    name = tracking.run_name or run_name(model_config, plan.train.seed)
    return RunRecord.open(
        plan.tracking_uri,
        plan.run_dir,
        plan.experiment,
        name,
        tags,
        tracking.parent_run_id,
        plan.train.resume,
        tracking.rebuild_store,
    )


def _run_facts(plan: RunPlan, model_config: ModelConfig, model: Any, prepared: PreparedData, val_names: list[str]):
    """(params, metrics, artifacts) that say what the run is and what it was built as. Every param
    is logged here, once: the config, the resolved model (``model_config.*``), the validation sets,
    the hash and the learning rate (Lightning logs no hyperparameters of its own). A mixture-of-experts
    model also logs ``params_active_non_embedding``, ``params_active_total`` (what one token applies:
    the router and top-k of the E experts), ``params_expert`` and ``params_moe_router``. With
    ``data.replace_invalid_utf8=true`` the param ``data.replacement_chars`` says how many U+FFFD
    characters the run's text holds (every split; "unknown" from a cache written before the count).
    A run of sampled loop counts (or truncated backprop) logs ``loops_expected`` and
    ``loops_backprop_expected``, and ``flops_per_token`` at them (experiments/loops.py)."""
    from experiments.identity import model_params
    from experiments.tracking import flatten
    from mesh_model import count_parameters

    params = flatten(plan.config)
    params.update(model_params(model_config))
    params.update(config_hash=plan.config_hash, peak_lr=str(plan.peak_lr), val_names=str(val_names))
    if plan.tokenizer_fork:  # a param: it sets the run's row apart from its config's other tokenizer
        from experiments.identity import TOKENIZER_PARAM

        params[TOKENIZER_PARAM] = plan.tokenizer_fork
    if plan.data.replace_invalid_utf8:
        replaced = prepared.total_replacement_chars
        params["data.replacement_chars"] = "unknown" if replaced is None else str(replaced)
    counts = count_parameters(model)
    loops = plan.train.loops
    if loops.sampled or loops.backprop is not None:  # the FLOP model at the expected loop count
        from mesh_model import flops_per_token

        expected, grad = loops.expected(model_config.loops)
        counts["flops_per_token"] = flops_per_token(model, None, expected, grad)
    metrics = {
        "params_total": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "params_router": counts["router"],
        "params_pct_of_vanilla": counts["pct_of_vanilla"],
        "flops_per_token": counts["flops_per_token"],
        "data_train_tokens": prepared.train_tokens,
        # what a step and the run see (experiments/budget.py): sequences and tokens per optimizer step
        "global_batch": plan.budget.global_batch,
        "tokens_per_step": plan.budget.tokens_per_step,
        "tokens_planned": plan.budget.total_tokens,
    }
    if loops.sampled or loops.backprop is not None:
        metrics.update(loops_expected=expected, loops_backprop_expected=grad)
    if model_config.moe is not None:  # what one token uses of a mixture of experts (dense runs: unchanged)
        metrics.update(
            params_active_non_embedding=counts["active_non_embedding"],
            params_active_total=counts["active_total"],
            params_expert=counts["expert"],
            params_moe_router=counts["moe_router"],
        )
    return params, metrics, (plan.run_dir / "config.yaml",)


def _result(plan: RunPlan, trainer: Any, main_val: str, record: RunRecord | None) -> dict[str, Any]:
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val/", "train/"))}
    return {
        **metrics,
        "val_loss": metrics[f"val/{main_val}/loss"],
        "val_ppl": metrics[f"val/{main_val}/ppl"],
        "objective": metrics[f"val/{main_val}/loss"],
        "steps": trainer.global_step,
        "world_size": trainer.world_size,  # the processes that trained it (DDP ranks)
        "run_id": record.run_id if record is not None else None,
        "run_dir": str(plan.run_dir),
    }


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    from experiments.locks import RunInUseError
    from experiments.plan import InputError
    from experiments.store.sqlite import TrackingError, damaged_store_error, resolve_tracking_uri
    from mesh_model import ConfigError

    try:
        result = train(cfg)
    except (ConfigError, InputError, TrackingError, RunInUseError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except Exception as error:  # a store damaged while the run wrote to it: one line, not SQLAlchemy's traceback
        uri = resolve_tracking_uri(cfg.tracking.tracking_uri, Path(cfg.runs_dir).expanduser(), os.environ)
        if (damaged := damaged_store_error(error, uri)) is None and not _is_run_failure(error):
            raise
        print(f"error: {damaged or error}", file=sys.stderr)  # a failed run has this line as its error tag
        sys.exit(2 if damaged else 1)
    except KeyboardInterrupt:
        print("[mesh-train] interrupted; run the same command to resume from the last checkpoint", file=sys.stderr)
        sys.exit(130)
    except Terminated as stop:
        print(
            f"[mesh-train] stopped on SIGTERM at step {stop.step}, checkpoint saved; run the same command to resume",
            file=sys.stderr,
        )
        sys.exit(stop.code)
    if result["run_id"] is None:  # a non-zero DDP rank: rank 0 reports
        return result["objective"]
    nonfinite = "" if math.isfinite(result["val_loss"]) else " (trained past a non-finite loss: tag nonfinite)"
    print(
        f"[mesh-train] val loss {result['val_loss']:.4f} ppl {result['val_ppl']:.2f} after {result['steps']} steps"
        f"{nonfinite}; MLflow run {result['run_id']}; run dir {result['run_dir']}"
    )
    if result.get("page"):  # its validation PPL in the UI (a local store once `mlflow ui` serves it)
        print(f"[mesh-train] validation PPL in the MLflow UI: {result['page']}")
    return result["objective"]


# Hydra's flags that take a value, as a separate argument (``--cfg job``) or after ``=``
# (``--cfg=job``): the value is not an override. ``--info`` takes one only when it names a topic.
HYDRA_VALUE_FLAGS = ("--config-dir", "-cd", "--config-name", "-cn", "--config-path", "-cp")
HYDRA_VALUE_FLAGS += ("--cfg", "-c", "--package", "-p", "--experimental-rerun")
HYDRA_INFO_FLAGS = ("--info", "-i")
HYDRA_INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def override_arguments(argv: list[str]) -> list[str]:
    """The ``key=value`` overrides among Hydra's command-line arguments (flags and their values left out)."""
    overrides, skip = [], False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg.startswith("-"):
            skip = arg in HYDRA_VALUE_FLAGS
            if arg in HYDRA_INFO_FLAGS:
                skip = index + 1 < len(argv) and argv[index + 1] in HYDRA_INFO_TOPICS
            continue
        overrides.append(arg)
    return overrides


def cli(argv: list[str] | None = None) -> None:
    """Console script: our own ``--help`` and ``--version`` (instant: no torch), ``-v``, one-line
    errors for bad override keys, then Hydra."""
    args = take_verbose_flag(list(sys.argv[1:] if argv is None else argv))
    if "--help" in args or "-h" in args:
        print(train_help(__doc__), end="")
        return
    if "--version" in args:
        print(version_line("mesh-train"))
        return
    from experiments.config import register_configs
    from experiments.overrides import OverrideError, check_overrides

    try:
        check_overrides(override_arguments(args))
    except OverrideError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    register_configs()
    sys.argv = [sys.argv[0], *args]  # Hydra reads sys.argv (without -v)
    main()


def __getattr__(name: str) -> Any:
    """Names this module used to import at the top, still importable from it (``padded_vocab``)."""
    if name in ("padded_vocab", "plan_run"):
        from experiments import plan

        return getattr(plan, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    cli()
