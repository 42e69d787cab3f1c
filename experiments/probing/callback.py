"""The paper's hidden-state probes for every run: :class:`ProbeCallback` and the files it writes.

The probes (:mod:`mesh_model.probes`) run on a fixed held-out set: the first ``num_batches``
batches of ``batch_size`` samples of the main validation split, sample i being tokens
[i P, (i+1) P) for P = ``probes.seq_len`` (resolved by :meth:`ProbeConfig.resolved_seq_len`). The
model reads each sample in windows of ``data.seq_len`` tokens, its training length (see
:class:`~experiments.config.ProbeConfig`). They depend only on the data and probe configs, so
every run on the same data is probed on the same tokens and the numbers compare across runs.

What a probe writes, in ``<run_dir>/probes/step<N>/`` and as MLflow artifacts under the same path:
the four figures of :func:`experiments.probing.figures.plot_report` (update bars, RBF and linear CKA
heatmaps, spectra) as PNG and SVG, ``probes.json`` (:func:`report_to_dict`; :func:`load_report`
reads it back) and ``probes.csv``, every value of ``report.as_metrics()`` by name
(:func:`read_probe_table`). Only the few summaries of :data:`SUMMARY_METRICS` go to the logger,
at the global step: the run's page keeps to what the claims read, and ``mesh-results`` reads the
rest from the final table. The probe at the end of training is also copied to ``probes/final/``.

A mixture-of-experts run is also probed for its routing on the same batches
(:mod:`experiments.probing.routing`: expert load, router entropy and the Jaccard overlap of the
chosen experts per loop iteration, values ``probe/moe_*``; their means are summary metrics), drawn
as ``probe_routing`` and kept in ``probes.json`` and ``probes.csv``.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from experiments.config import ProbeConfig
from experiments.data.config import DataConfig
from experiments.probing.batches import describe_batches, held_out_batches
from experiments.probing.files import PROBE_DIR, probe_metrics, summary_metrics, write_probe_files
from experiments.probing.routing import routing_report
from experiments.probing.state_routing import StateRoutingCallback
from mesh_model.probes import probe_report


class ProbeCallback(pl.Callback):
    """Probe the model on the held-out batches at the end of training (final weights) and, when
    ``every_n_validations`` > 0, after every n-th validation of the fit.

    Runs on global rank 0 only, in eval mode without grad (:func:`probe_report` restores the
    training mode). Needs a datamodule with ``cfg`` (DataConfig) and ``data`` (PreparedData), as
    :class:`~experiments.data.datamodule.TokenDataModule` has. A probe that fails warns and sets
    the MLflow tag ``probe_error``; it does not fail the run. Skipped under FSDP (sharded weights;
    run ``mesh-probe`` on the checkpoint instead).
    """

    def __init__(
        self,
        run_dir: str | Path,
        every_n_validations: int = 0,
        num_batches: int = 2,
        seq_len: int | None = None,
        figures: bool = True,
    ) -> None:
        self.config = ProbeConfig(
            every_n_validations=every_n_validations, num_batches=num_batches, seq_len=seq_len, figures=figures
        )
        self.config.validate()
        self.run_dir = Path(run_dir)
        self.every_n_validations = every_n_validations
        self.num_batches = num_batches
        self.validations = 0  # validations seen during fit; kept in checkpoints so a resume keeps counting
        self.last_seconds: float | None = None  # wall time of the last probe (figures and logging included)
        self._batches: list[Tensor] | None = None
        self._probed_step: int | None = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.validations += 1
        if self.every_n_validations and self.validations % self.every_n_validations == 0:
            self._probe(trainer, pl_module, final=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._probe(trainer, pl_module, final=True)

    def state_dict(self) -> dict[str, Any]:
        return {"validations": self.validations}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.validations = state_dict.get("validations", 0)

    def _probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule, final: bool) -> None:
        if not trainer.is_global_zero:
            return
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(trainer.strategy, FSDPStrategy):
            if final:
                rank_zero_warn("probes are skipped under FSDP; run mesh-probe on the checkpoint")
            return
        start = time.perf_counter()
        step = trainer.global_step
        folder = self.run_dir / PROBE_DIR / f"step{step}"
        try:
            if self._probed_step != step:  # the final probe after a probed last validation reuses it
                self._write_and_log(trainer, pl_module, folder, step)
                self._probed_step = step
            if final:
                shutil.copytree(folder, self.run_dir / PROBE_DIR / "final", dirs_exist_ok=True)
                self._log_artifacts(trainer, folder, f"{PROBE_DIR}/final")
        except Exception as error:  # a diagnostic must not lose a finished training run
            rank_zero_warn(f"probes failed at step {step}: {type(error).__name__}: {error}")
            _set_tag(trainer, "probe_error", f"step {step}: {type(error).__name__}: {error}"[:5000])
        self.last_seconds = time.perf_counter() - start

    def _write_and_log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, folder: Path, step: int) -> None:
        data: DataConfig = trainer.datamodule.cfg
        if self._batches is None:
            seq_len = self.config.resolved_seq_len(data.seq_len)
            self._batches = held_out_batches(data, trainer.datamodule.data, self.num_batches, seq_len)
        model = getattr(pl_module, "model", pl_module)  # MeshLitModule keeps the MeshTransformer here
        report = probe_report(model, self._batches, window=data.seq_len)
        routing = routing_report(model, self._batches, window=data.seq_len)  # None for a dense model
        batches = describe_batches(data, self._batches)
        write_probe_files(report, folder, routing, figures=self.config.figures, step=step, batches=batches)
        if trainer.logger is not None:
            trainer.logger.log_metrics(summary_metrics(probe_metrics(report, routing)), step=step)
        self._log_artifacts(trainer, folder, f"{PROBE_DIR}/step{step}")

    @staticmethod
    def _log_artifacts(trainer: pl.Trainer, folder: Path, artifact_path: str) -> None:
        logger = trainer.logger
        run_id = getattr(logger, "run_id", None)
        if run_id is not None and hasattr(logger.experiment, "log_artifacts"):  # an MLFlowLogger
            logger.experiment.log_artifacts(run_id, str(folder), artifact_path)


def _set_tag(trainer: pl.Trainer, key: str, value: str) -> None:
    logger = trainer.logger
    run_id = getattr(logger, "run_id", None)
    if run_id is not None and hasattr(logger.experiment, "set_tag"):
        with contextlib.suppress(Exception):  # the store may be what failed
            logger.experiment.set_tag(run_id, key, value)


def probe_callbacks(probes: ProbeConfig, run_dir: str | Path) -> list[pl.Callback]:
    """The callbacks for a run's ``probes`` config: a ProbeCallback and the loop's routing probe
    at every validation (:mod:`experiments.probing.state_routing`), or none when disabled."""
    if not probes.enabled:
        return []
    return [
        ProbeCallback(
            run_dir,
            every_n_validations=probes.every_n_validations,
            num_batches=probes.num_batches,
            seq_len=probes.seq_len,
            figures=probes.figures,
        ),
        StateRoutingCallback(num_batches=probes.num_batches),
    ]


__all__ = ["ProbeCallback", "probe_callbacks"]
