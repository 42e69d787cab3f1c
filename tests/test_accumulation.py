"""The global batch: gradient accumulation, the token budget and the paper's recipe.

* one optimizer step over 4 accumulated micro-batches of 2 has the gradients of one batch of 8
  (fp32, 1e-5), through the real Trainer, data module and model;
* an accumulated run logs once per optimizer step, and a SIGTERM that lands between two
  micro-batches stops at the step's end and resumes into the run the uninterrupted one is;
* ``tokens``, ``global_batch`` and ``recipe=pythia`` resolve to the paper's numbers, refuse what
  does not come out whole in one line, and leave the hash of every run that used none of them as
  it was.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from test_faults_run import HISTORIES, record, run_dir, run_here, start, stop, wait_for

from experiments.budget import step_budget
from experiments.callbacks.checkpointing import StopOnStepBoundary
from experiments.compose import compose_config
from experiments.data.datamodule import TokenDataModule
from experiments.data.sampler import EpochPermutation
from experiments.identity import model_config_for
from experiments.plan import InputError, padded_vocab, plan_run
from experiments.trainer import build_module


class FirstStepGradients(pl.Callback):
    """The gradients the optimizer is about to apply at step 0, before clipping."""

    def __init__(self) -> None:
        self.gradients: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if trainer.global_step == 0:
            self.gradients = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters() if p.grad is not None}


def fit(tmp_path: Path, batch_size: int, accumulate: int, steps: int, callbacks: list[pl.Callback]) -> pl.Trainer:
    """A real fit of a tiny MeSH model, in this process, without a logger or validation."""
    overrides = [
        "scheme=mesh",
        "data.seq_len=32",
        f"data.batch_size={batch_size}",
        f"trainer.accumulate_grad_batches={accumulate}",
        f"max_steps={steps}",
        f"runs_dir={tmp_path}",
    ]
    plan = plan_run(compose_config(overrides))
    datamodule = TokenDataModule(plan.data, seed=0)
    model_config = model_config_for(plan.config, padded_vocab(datamodule.vocab_size))
    pl.seed_everything(0, verbose=False)
    module = build_module(plan, model_config, ["shakespeare"])
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        accumulate_grad_batches=plan.trainer.accumulate_grad_batches,
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer


def first_step_gradients(tmp_path: Path, batch_size: int, accumulate: int) -> dict[str, torch.Tensor]:
    capture = FirstStepGradients()
    assert fit(tmp_path, batch_size, accumulate, 1, [capture]).global_step == 1
    return capture.gradients


def test_accumulated_micro_batches_give_the_gradients_of_one_large_batch(tmp_path):
    large = first_step_gradients(tmp_path / "large", batch_size=8, accumulate=1)
    accumulated = first_step_gradients(tmp_path / "accumulated", batch_size=2, accumulate=4)
    assert large.keys() == accumulated.keys() and len(large) > 10
    for name, gradient in large.items():
        assert gradient.abs().max() > 0, name  # every parameter took part
        torch.testing.assert_close(accumulated[name], gradient, rtol=1e-5, atol=1e-5, msg=name)
    # Not a comparison that cannot fail: one micro-batch alone has other gradients.
    alone = first_step_gradients(tmp_path / "alone", batch_size=2, accumulate=1)
    assert max((alone[n] - large[n]).abs().max().item() for n in large) > 1e-3


class SigtermAtBatch(pl.Callback):
    """Sends this process SIGTERM at the end of batch ``batch`` (counted over micro-batches)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler only sets its flag


@pytest.mark.parametrize(("callbacks", "stopped_after"), [((), (3, 7)), ((StopOnStepBoundary(),), (4, 8))])
def test_sigterm_in_the_middle_of_a_step_waits_for_its_last_micro_batch(tmp_path, callbacks, stopped_after):
    """Batch 6 is the first of step 3's two: Lightning alone stops after it, half a step in (its
    checkpoint would lose that micro-batch's gradients); held to the step's end it stops after
    batch 7, with 4 whole steps."""
    steps = []
    stopped = pl.Callback()
    stopped.on_exception = lambda trainer, module, error: steps.append(  # type: ignore[method-assign]
        (type(error).__name__, trainer.global_step, trainer.fit_loop.epoch_loop.batch_progress.total.completed)
    )
    with pytest.raises(SIGTERMException):
        fit(tmp_path, 2, 2, 20, [SigtermAtBatch(6), *callbacks, stopped])
    assert steps == [("SIGTERMException", *stopped_after)]


def test_a_fit_outside_the_main_thread_trains_with_the_step_boundary_callback(tmp_path):
    """No signal handler can be set outside the main thread: the callback sets none there (as
    Lightning does) instead of failing the fit."""
    import threading

    done: list[object] = []

    def train() -> None:
        try:
            done.append(fit(tmp_path, 2, 1, 2, [StopOnStepBoundary()]).global_step)
        except Exception as error:  # reported below, in the test's own thread
            done.append(error)

    worker = threading.Thread(target=train)
    worker.start()
    worker.join(timeout=600)
    assert done == [2]


def test_an_epoch_is_cut_to_whole_optimizer_steps():
    sampler = EpochPermutation(n=100, seed=0, batch_size=4, batches_per_step=3)
    assert len(sampler) == 96  # 8 steps of 3 x 4; 25 batches without accumulation
    assert len(EpochPermutation(n=100, seed=0, batch_size=4)) == 100
    assert list(sampler)[:12] == sampler.order(0)[:12].tolist()  # the same order, cut at the end


# An accumulated run in the shape of tests/test_faults_run.py's (40 steps of 8 sequences), in
# micro-batches of 4 (validated on the same 16 windows): SIGTERM stops it between two of them.
ACCUMULATED = ("data.batch_size=4", "trainer.accumulate_grad_batches=2", "data.val_batches=4")


@pytest.fixture(scope="module")
def accumulated_uninterrupted(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("accumulated")
    result = run_here(runs_dir, *ACCUMULATED)
    assert result.returncode == 0, result.stderr
    status, _, histories = record(runs_dir)
    assert status == "FINISHED"
    return histories


@pytest.mark.slow
def test_an_accumulated_run_logs_each_optimizer_step_once_and_learns_as_the_large_batch(
    tmp_path, accumulated_uninterrupted
):
    histories = accumulated_uninterrupted
    # Every 5th optimizer step, at Lightning's 0-based step (as without accumulation).
    assert [s for s, _ in histories["train/loss"]] == list(range(4, 40, 5))
    assert [s for s, _ in histories["val/shakespeare/loss"]] == [20, 40]
    large = run_here(tmp_path, "data.batch_size=8")  # the same run in one batch of 8 per step
    assert large.returncode == 0, large.stderr
    _, _, expected = record(tmp_path)
    assert [s for s, _ in expected["train/loss"]] == [s for s, _ in histories["train/loss"]]
    for key in ("train/loss", "val/shakespeare/loss", "lr"):  # the mean of the micro-batches' losses
        got, want = [v for _, v in histories[key]], [v for _, v in expected[key]]
        assert got == pytest.approx(want, rel=2e-4), key


@pytest.mark.slow
def test_sigterm_between_micro_batches_stops_at_the_step_end_and_resumes_exactly(tmp_path, accumulated_uninterrupted):
    process = start(tmp_path, *ACCUMULATED)
    wait_for(tmp_path, "checkpoints/step10.ckpt", process)
    code, err = stop(process, signal.SIGTERM, after=0.2)
    assert code == 143, err
    saved = torch.load(run_dir(tmp_path) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    progress = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]
    assert progress["completed"] == 2 * saved["global_step"]  # a whole number of steps of 2 micro-batches
    assert saved["global_step"] >= 10
    again = run_here(tmp_path, *ACCUMULATED)
    assert again.returncode == 0, again.stderr
    status, _, histories = record(tmp_path)
    assert status == "FINISHED"
    for key in HISTORIES:  # same steps (none twice, none missing), same values, to the last bit
        assert histories[key] == accumulated_uninterrupted[key], key


# --- the budget ------------------------------------------------------------------------------------


def budget(*overrides: str):
    return plan_run(compose_config(["allow_large=true", *overrides])).budget


def test_tokens_set_the_step_count_and_global_batch_the_accumulation():
    tokens = budget("tokens=1e6")  # 16 x 128 = 2,048 tokens a step
    assert (tokens.max_steps, tokens.accumulate, tokens.total_tokens) == (489, 1, 489 * 2048)
    both = budget("global_batch=64", "tokens=1e6", "optim.warmup_steps=10")
    assert (both.accumulate, both.tokens_per_step, both.max_steps, both.warmup_steps) == (4, 8192, 123, 10)
    plan = plan_run(compose_config(["global_batch=64", "tokens=1e6"]))
    assert plan.config["max_steps"] == 123 and plan.config["trainer"]["accumulate_grad_batches"] == 4


def test_the_pythia_recipe_is_the_papers_global_batch_and_token_budget():
    cluster = ("recipe=pythia", "model=pythia-160m", "trainer=gpu", "trainer.devices=8", "trainer.num_nodes=2")
    paper = budget(*cluster)
    assert (paper.global_batch, paper.seq_len, paper.tokens_per_step) == (512, 4096, 2_097_152)
    assert (paper.batch_size, paper.accumulate, paper.processes) == (8, 4, 16)
    assert paper.max_steps == 119_210 and paper.warmup_steps == 1_192  # ceil(250e9 / 2,097,152), 1%
    assert paper.total_tokens >= 250e9 > paper.total_tokens - paper.tokens_per_step
    assert paper.describe() == (
        "global batch 512 (8 x 4 accumulated x 16 processes) x 4096 tokens = 2,097,152 tokens/step; "
        "119,210 steps = 250.0B tokens; LR warmup 1,192 steps, cosine to 10% at step 119,210"
    )
    one_gpu = budget("recipe=pythia", "model=pythia-160m", "trainer=gpu")
    assert (one_gpu.accumulate, one_gpu.global_batch) == (64, 512)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("global_batch=60",),
            "global_batch=60 is invalid: must be a multiple of data.batch_size x processes = 16 x 1 = 16",
        ),
        (
            ("max_steps=10", "tokens=1e6"),
            "max_steps=10 is invalid: tokens=1e+06 sets the length already: give one (tokens=null)",
        ),
        (
            ("global_batch=64", "trainer.accumulate_grad_batches=2"),
            "trainer.accumulate_grad_batches=2 is invalid: global_batch=64 makes it 4: drop one of the two",
        ),
        (("trainer.accumulate_grad_batches=0",), "trainer.accumulate_grad_batches=0 is invalid: must be >= 1"),
        (("optim.warmup_steps=200",), "optim.warmup_steps=200 is invalid: must be fewer than the run's 200 steps"),
        (("recipe=pythia", "model=pythia-160m", "max_steps=100"), "max_steps=100 is invalid: tokens=2.5e+11"),
    ],
)
def test_a_budget_that_does_not_come_out_whole_is_refused_in_one_line(overrides, message):
    with pytest.raises(InputError) as refused:
        plan_run(compose_config(["allow_large=true", *overrides]))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_global_batch_over_devices_not_counted_here_asks_for_the_count():
    train = compose_config(["recipe=pythia", "model=pythia-160m", "trainer=ddp", "allow_large=true"])
    with pytest.raises(InputError, match=r"^trainer.devices='auto' is invalid: global_batch=512 needs the number"):
        plan_run(train)
    train_object = __import__("omegaconf").OmegaConf.to_object(train)
    assert step_budget(train_object, 4).accumulate == 16  # 512 / (8 x 4 GPUs)


def test_runs_that_set_none_of_it_keep_their_hash():
    """Keys at their neutral values keep a run's hash (stores are found finished). The values
    changed once since the budget was added: the seeded per-tensor init is another computation."""
    assert plan_run(compose_config([])).config_hash == "8c3c4fe4f750"
    assert plan_run(compose_config(["scheme=mesh"])).config_hash == "eb807d84efb5"
    assert plan_run(compose_config(["model=mini", "scheme=anchor"])).config_hash == "1c3af73e7770"
    same = ("max_steps=200", "trainer.accumulate_grad_batches=1", "optim.warmup_steps=null")
    assert plan_run(compose_config(list(same))).config_hash == "8c3c4fe4f750"
    # A token budget is the run of the steps it comes to; accumulation is another run.
    assert plan_run(compose_config(["tokens=409600"])).config_hash == "8c3c4fe4f750"  # 200 x 2,048
    assert plan_run(compose_config(["trainer.accumulate_grad_batches=2"])).config_hash != "8c3c4fe4f750"
