"""The training's AdamW: fused where the kernel runs and Lightning allows it, and its arithmetic
AdamW's, equal to the for-loop form to float rounding over a run of steps (the recipe's parameter
groups, router LR scale and schedule included)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from experiments.config import OptimConfig
from experiments.lit_module import MeshLitModule, adamw, fused_adamw_fits
from experiments.schedule import lr_multiplier
from mesh_model import ModelConfig, build_model

STEPS = 20
# What fused and for-loop AdamW may differ by after STEPS steps of a tiny MeSH model (fp32): the
# same update in another order of float operations. Measured: losses 1.3e-7 (relative) and
# parameters 3.5e-6 apart at most; a weight decay of 0.1 for 0.01 moves them by 2.2e-3 and
# 5.4e-4, another beta by more (asserted below).
LOSS_TOLERANCE = 1e-6
PARAMETER_TOLERANCE = 1e-5


def losses_and_parameters(fused: bool, optim: OptimConfig, peak_lr: float = 4e-3) -> tuple[list[float], torch.Tensor]:
    """STEPS training steps of a tiny MeSH model on fixed random tokens with the recipe's AdamW
    and schedule: the loss at each step and the parameters at the end, flattened."""
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset("tiny", scheme="mesh"))
    optimizer = adamw(model, optim, peak_lr, fused=fused)
    schedule = LambdaLR(optimizer, lambda step: lr_multiplier(step, STEPS))
    ids = torch.randint(0, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(STEPS):
        loss = model(ids, labels=ids, return_logits=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().flatten() for p in model.parameters()])


def test_the_training_fuses_adamw_on_cpu_and_not_under_mixed_precision():
    model = build_model(ModelConfig.from_preset("tiny", scheme="mesh"))
    assert fused_adamw_fits(model) and fused_adamw_fits(model, "bf16-true")
    assert not fused_adamw_fits(model, "bf16-mixed") and not fused_adamw_fits(model, "16-mixed")
    assert not fused_adamw_fits(model.to(torch.device("meta")))  # no kernel there
    assert adamw(build_model(ModelConfig.from_preset("tiny")), OptimConfig(), 1e-3).defaults["fused"]
    assert not adamw(model, OptimConfig(), 1e-3, precision="bf16-mixed").defaults["fused"]


@pytest.mark.parametrize("router_lr_scale", [1.0, 0.1])
def test_fused_adamw_trains_as_the_for_loop_form_to_float_rounding(router_lr_scale):
    optim = OptimConfig(router_lr_scale=router_lr_scale)
    fused_losses, fused_params = losses_and_parameters(True, optim)
    loop_losses, loop_params = losses_and_parameters(False, optim)
    assert fused_losses[-1] < fused_losses[0] - 1.0  # it trains
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(loop_losses), rtol=LOSS_TOLERANCE, atol=0)
    torch.testing.assert_close(fused_params, loop_params, rtol=0, atol=PARAMETER_TOLERANCE)


def test_the_tolerance_tells_a_changed_update_apart():
    """The tolerances above are far below what a different recipe moves: another beta2 or weight
    decay, run fused against the same for-loop form, fails them."""
    loop_losses, loop_params = losses_and_parameters(False, OptimConfig())
    for changed in (OptimConfig(betas=[0.9, 0.99]), OptimConfig(weight_decay=0.1)):
        losses, params = losses_and_parameters(True, changed)
        assert (params - loop_params).abs().max() > 10 * PARAMETER_TOLERANCE
        assert max(abs(a / b - 1) for a, b in zip(losses, loop_losses, strict=True)) > 10 * LOSS_TOLERANCE


def test_a_mixed_precision_fit_with_gradient_clipping_runs_the_unfused_adamw():
    """Lightning refuses to clip the gradients of an optimizer that unscales its own (fused AdamW)
    under mixed precision: the module picks the unfused form there, and the fit runs."""
    config = ModelConfig.from_preset("tiny", scheme="mesh")
    module = MeshLitModule(config.to_dict(), OptimConfig(), 4e-3, 2, ["val"])
    ids = torch.randint(0, config.vocab_size, (2, 33))
    batches = torch.utils.data.DataLoader(list(ids), batch_size=2)
    trainer = pl.Trainer(
        accelerator="cpu",
        precision="bf16-mixed",
        gradient_clip_val=1.0,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(module, train_dataloaders=batches)
    assert trainer.global_step == 2
    assert not trainer.optimizers[0].defaults["fused"]
