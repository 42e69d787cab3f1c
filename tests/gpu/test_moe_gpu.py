"""The looped mixture of experts on CUDA: the grouped matmul in bf16 against the per-token loop,
a compiled looped MoE + MeSH training step in one graph, a step of the paper-budget preset
(``olmoe-2.6b``), and a looped MoE + MeSH run through the real training entry point on
``trainer=gpu`` with ``compile=true``, landing in MLflow with its router losses and routing probes.

Not part of the default suite (pyproject's norecursedirs excludes tests/gpu): run it on a GPU
machine with ``make test-gpu``. Without CUDA every test fails, loudly, instead of skipping.
"""

from __future__ import annotations

import math

import mlflow
import pytest
import torch

from experiments.train import train
from mesh_model import ModelConfig, build_model, count_parameters
from mesh_model import moe as moe_module
from mesh_model.moe import MoE, grouped_mm_available

DEVICE = "cuda"


@pytest.fixture(autouse=True)
def cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.fail("tests/gpu needs a CUDA device", pytrace=False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 means fp32 here


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def test_the_grouped_matmul_runs_in_bf16_and_equals_the_per_expert_loop(monkeypatch):
    """bf16 autocast takes ``torch._grouped_mm`` (SM80+); its output and gradients agree with the
    per-expert loop (the fallback, itself held to the per-token reference by tests/test_moe.py)
    under the same autocast, so with the same routing, to bf16's precision."""
    assert grouped_mm_available(DEVICE, torch.bfloat16), "no bf16 grouped matmul on this device"
    torch.manual_seed(0)
    layer = MoE(128, 256, experts=8, top_k=2).to(DEVICE)
    for parameter in layer.parameters():
        torch.nn.init.normal_(parameter, std=0.05)
    x = torch.randn(2, 64, 128, device=DEVICE)
    weights = torch.randn(2, 64, 128, device=DEVICE)

    def step() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        layer.zero_grad()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out, call = layer(x)
        (out.float() * weights).sum().backward()
        return out, call.load, {name: p.grad.clone() for name, p in layer.named_parameters()}

    grouped, grouped_load, grouped_grads = step()
    monkeypatch.setattr(moe_module, "grouped_mm_available", lambda *args: False)
    loop, loop_load, loop_grads = step()
    assert grouped.dtype == torch.bfloat16 and torch.equal(grouped_load, loop_load)  # the same routing
    assert relative_error(grouped, loop) < 1e-2
    for name, grad in grouped_grads.items():
        assert relative_error(grad, loop_grads[name]) < 2e-2, name


def test_a_compiled_looped_moe_mesh_step_in_bf16_is_one_graph_and_matches_eager():
    """``torch.compile(fullgraph=True)`` (inductor) of a looped MoE + MeSH model: no graph break
    (the grouped matmul needs no host sync), and its loss and router losses match eager bf16."""
    torch.manual_seed(0)
    config = ModelConfig(layout="1+2R3+1", scheme="mesh", d_model=128, vocab_size=512, moe_experts=8, moe_top_k=2)
    model = build_model(config).to(DEVICE)
    compiled = torch.compile(model, fullgraph=True)
    ids = torch.randint(0, 512, (4, 128), device=DEVICE)
    losses = []
    for forward in (model, compiled):
        model.zero_grad()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = forward(ids, labels=ids, return_logits=False)
        (out.loss + out.aux_loss).backward()
        losses.append((out.loss.item(), out.aux_lb.item(), out.aux_z.item()))
        assert all(math.isfinite(p.grad.float().norm().item()) for p in model.parameters() if p.grad is not None)
    (eager, fused) = losses
    assert fused == pytest.approx(eager, rel=2e-2)


def test_the_paper_budget_moe_preset_trains_a_step_in_bf16():
    """``olmoe-2.6b`` (about 2.6B total, 512M active parameters, ``4+8R2+4``): a bf16 training step
    with fused AdamW, its loss finite and its parameters moved."""
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset("olmoe-2.6b", scheme="mesh")).to(DEVICE)
    counts = count_parameters(model)
    assert 2.4e9 < counts["total"] < 2.9e9 and 0.45e9 < counts["active_total"] < 0.65e9, counts
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=DEVICE == "cuda")
    ids = torch.randint(0, model.config.vocab_size, (1, 1024), device=DEVICE)
    before = model.embed_in.weight.detach().clone()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = model(ids, labels=ids, return_logits=False)
    (out.loss + out.aux_loss).backward()
    optimizer.step()
    assert math.isfinite(out.loss.item()) and math.isfinite(out.aux_loss.item())
    assert 0.5 < out.loss.item() / math.log(model.config.vocab_size) < 1.5  # an untrained model: about uniform
    assert not torch.equal(before, model.embed_in.weight.detach())


def test_a_looped_moe_mesh_run_trains_on_the_gpu_through_mesh_train(compose_run, tmp_path):
    """``model=tiny-moe scheme=mesh trainer=gpu compile=true``: a FINISHED MLflow run with the
    router losses beside the LM loss and the routing probes of every loop iteration."""
    runs_dir = tmp_path / "runs"
    overrides = ["model=tiny-moe", "scheme=mesh", "compile=true", "probes.num_batches=1", f"runs_dir={runs_dir}"]
    if DEVICE == "cuda":
        overrides.append("trainer=gpu")
    result = train(compose_run(*overrides))
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED" and result["steps"] == 30
    metrics = run.data.metrics
    assert math.isfinite(metrics["val/shakespeare/loss"]) and metrics["train/aux_lb"] > 0 and metrics["train/aux_z"] > 0
    assert 0 <= metrics["probe/moe_jaccard/loop_mean"] <= 1
    assert {f"probe/moe_entropy/cores.0.{b}/iter{t}" for b in (0, 1) for t in (1, 2)} <= set(metrics)
