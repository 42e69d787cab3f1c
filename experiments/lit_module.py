"""The LightningModule: the paper's optimisation recipe around a MeshTransformer."""

from __future__ import annotations

import math
import time
from functools import partial

import lightning.pytorch as pl
import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from experiments.config import OptimConfig
from experiments.loops import LoopsConfig
from experiments.schedule import lr_multiplier
from mesh_model import ModelConfig, build_model
from mesh_model.depth import Depth


def parameter_groups(
    model: torch.nn.Module, weight_decay: float, peak_lr: float | None = None, router_lr_scale: float = 1.0
) -> list[dict]:
    """Weight decay on matrices only: not on biases, LayerNorms or scheme coefficients.

    With ``router_lr_scale`` != 1 the state-passing scheme's own parameters (``state_passing.*``:
    MeSH's routers, the static/dynamic coefficients) form two more groups (decayed or not, by the
    same rule) at ``router_lr_scale * peak_lr``; the schedule multiplies every group's LR alike."""
    groups: dict[tuple[bool, bool], list] = {(d, r): [] for r in (False, True) for d in (True, False)}
    separate = router_lr_scale != 1.0
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_matrix = param.ndim >= 2 and not name.endswith("coefficients")
        groups[(is_matrix, separate and name.startswith("state_passing."))].append(param)
    out = [
        {"params": groups[(True, False)], "weight_decay": weight_decay},
        {"params": groups[(False, False)], "weight_decay": 0.0},
    ]
    if separate:
        if peak_lr is None:
            raise ValueError("parameter_groups: router_lr_scale needs peak_lr")
        lr = router_lr_scale * peak_lr
        out += [
            {"params": groups[(True, True)], "weight_decay": weight_decay, "lr": lr},
            {"params": groups[(False, True)], "weight_decay": 0.0, "lr": lr},
        ]
    return [group for group in out if group["params"]] if separate else out


# Devices with torch's fused AdamW kernel: one pass over each parameter's four tensors instead of
# a dozen elementwise ops (about 3x less optimizer time on CPU, benchmarks/README.md). Its
# arithmetic is AdamW's, in another order: losses and parameters agree with the for-loop form to
# float rounding (tests/test_optimizer.py). A checkpoint keeps its optimizer's form on resume.
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def fused_adamw_fits(model: torch.nn.Module, precision: str = "32-true") -> bool:
    """Whether :func:`adamw` fuses: every parameter on a device with the kernel, and no mixed
    precision (``16-mixed``, ``bf16-mixed``), where Lightning refuses gradient clipping with an
    optimizer that unscales its own gradients, as the fused one does; there torch's default (the
    multi-tensor ``foreach`` form on CUDA) runs."""
    on_devices = all(p.device.type in FUSED_ADAMW_DEVICES for p in model.parameters())
    return on_devices and not str(precision).endswith("-mixed")


def adamw(
    model: torch.nn.Module,
    optim: OptimConfig,
    peak_lr: float,
    fused: bool | None = None,
    precision: str = "32-true",
) -> torch.optim.AdamW:
    """The paper's AdamW over ``model``'s parameter groups (:func:`parameter_groups`): fused where
    :func:`fused_adamw_fits` (``fused`` None), or as asked."""
    groups = parameter_groups(model, optim.weight_decay, peak_lr, optim.router_lr_scale)
    if fused is None:
        fused = fused_adamw_fits(model, precision)
    return torch.optim.AdamW(groups, lr=peak_lr, betas=tuple(optim.betas), fused=fused or None)


class MeshLitModule(pl.LightningModule):
    def __init__(
        self,
        model_config: dict,
        optim: OptimConfig,
        peak_lr: float,
        max_steps: int,
        val_names: list[str],
        compile: bool = False,
        activation_checkpointing: bool = False,
        init_seed: int | None = None,
        loops: LoopsConfig | None = None,
    ) -> None:
        super().__init__()
        # Kept in checkpoints (experiments.checkpoints rebuilds the model from them), not logged:
        # train.py logs every param once, model_config.* included.
        self.save_hyperparameters(ignore=["optim", "loops"], logger=False)
        self.optim = optim
        # The loop count of each training step, a function of (seed, step) (experiments/loops.py).
        self.loops = loops or LoopsConfig()
        self.loop_seed = init_seed or 0
        self.config = ModelConfig(**model_config)
        # The run's seed fixes the initial weights, tensor by tensor (mesh_model.init): two schemes at
        # one seed start from the same shared weights, so comparisons over seeds pair.
        self.model = build_model(self.config, activation_checkpointing=activation_checkpointing, init_seed=init_seed)
        self.forward_model = torch.compile(self.model) if compile else self.model
        self.peak_lr = peak_lr
        self.max_steps = max_steps
        self.val_names = val_names
        self._val_sums: dict[int, list[float]] = {}
        self._last_time: float | None = None
        self._tokens_since = 0
        self._window: dict[str, list[Tensor]] = {}  # this optimizer step's micro-batch values, to log

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.forward_model(input_ids).logits

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        """The language-model loss (logged as ``train/loss``), plus, for a mixture-of-experts model,
        the router losses weighted by their coefficients (``ModelOutput.aux_loss``): what is
        backpropagated. ``train/aux_lb`` and ``train/aux_z`` log the unweighted load-balancing and
        z-losses; a dense model logs neither. MeSH with a router z-loss adds it (weighted) and logs
        it as ``train/mesh_router_z``.

        With gradient accumulation (``trainer.accumulate_grad_batches``) the logged values are
        the means over the step's micro-batches, logged once per optimizer step (Lightning scales
        the loss by 1/accumulation itself). A run of sampled loop counts also logs the step's K as
        ``train/loops``."""
        # The loss straight from the hidden states: the full logits are never built (mesh_model.loss).
        depth = self.training_depth(self.global_step)
        out = self.forward_model(batch, labels=batch, return_logits=False, depth=depth)
        loss = out.loss
        window = self._window.setdefault("train/loss", [])
        window.append(loss.detach())
        if depth is not None:
            self._window.setdefault("train/loops", []).append(torch.tensor(float(depth.loops or self.config.loops)))
        extras = {"train/aux_lb": out.aux_lb, "train/aux_z": out.aux_z, "train/mesh_router_z": out.mesh_z}
        for name, value in extras.items():
            if value is not None:
                self._window.setdefault(name, []).append(value.detach())
        if out.aux_loss is not None:
            loss = loss + out.aux_loss
        if (batch_idx + 1) % self._accumulation() == 0:  # the optimizer steps after this micro-batch
            for name, values in self._window.items():
                self.log(name, torch.stack(values).mean(), prog_bar=name == "train/loss")
            self._window = {}
            self.log("lr", self.optimizers().param_groups[0]["lr"])
        self._tokens_since += batch.numel()
        return loss

    def training_depth(self, step: int) -> Depth | None:
        """How optimizer step ``step`` loops: None (the layout's K, every step backpropagated) unless
        ``loops`` samples K or truncates backprop; every micro-batch of the step draws the same."""
        if not self.loops.sampled and self.loops.backprop is None:
            return None
        drawn = self.loops.draw(self.config.loops, self.loop_seed, step)
        return Depth(loops=drawn, grad_loops=self.loops.grad_loops(drawn))

    def _accumulation(self) -> int:
        trainer = self._trainer
        return trainer.accumulate_grad_batches if trainer is not None else 1

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self._accumulation():
            return  # measured over whole optimizer steps
        now = time.perf_counter()
        if self._last_time is None:
            self._last_time, self._tokens_since = now, 0
            return
        if self.trainer.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            tokens = self._tokens_since * self.trainer.world_size
            self.log("train/tokens_per_s", tokens / max(now - self._last_time, 1e-9))
            self._last_time, self._tokens_since = now, 0

    def on_validation_epoch_start(self) -> None:
        self._val_sums = {}

    def validation_step(self, batch: Tensor, batch_idx: int, dataloader_idx: int = 0) -> None:
        # The language-model loss alone (a MoE model's router losses are not part of its PPL).
        loss = self.forward_model(batch, labels=batch, return_logits=False).loss
        sums = self._val_sums.setdefault(dataloader_idx, [0.0, 0])
        sums[0] += loss.item() * batch.shape[0]
        sums[1] += batch.shape[0]

    def on_validation_epoch_end(self) -> None:
        """Token-mean loss and perplexity per validation set, logged at the optimizer step count
        (after 10 optimizer steps: step 10), which Lightning's own step bookkeeping puts at 9."""
        metrics = {}
        for index, (total, count) in sorted(self._val_sums.items()):
            totals = self.trainer.strategy.reduce(
                torch.tensor([total, float(count)], device=self.device, dtype=torch.float64), reduce_op="sum"
            )
            mean = (totals[0] / totals[1]).item()
            name = self.val_names[index]
            metrics[f"val/{name}/loss"] = mean
            metrics[f"val/{name}/ppl"] = math.exp(min(mean, 50.0))
        for key, value in metrics.items():  # identical on every rank after the reduce
            self.log(key, value, logger=False, sync_dist=True)
        if self.logger is not None and not self.trainer.sanity_checking:
            self.logger.log_metrics(metrics, step=self.trainer.global_step)

    def configure_optimizers(self):
        precision = str(self._trainer.precision) if self._trainer is not None else "32-true"
        optimizer = adamw(self.model, self.optim, self.peak_lr, precision=precision)
        schedule = partial(
            lr_multiplier,
            max_steps=self.max_steps,
            warmup_fraction=self.optim.warmup_fraction,
            warmup=self.optim.warmup_steps,
            min_lr_ratio=self.optim.min_lr_ratio,
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": LambdaLR(optimizer, schedule), "interval": "step"},
        }
