"""A looped mixture of experts trained, probed and swept: the router losses in the backpropagated
loss and in MLflow, the LM loss alone in validation, the active parameters, the routing probes per
loop iteration and the ``moe`` grid. Its results tables: tests/test_results.py."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from conftest import FULL_PROBES

from experiments.compose import compose_config
from experiments.config import OptimConfig
from experiments.lit_module import MeshLitModule
from experiments.plan import plan_run
from experiments.probing.files import SUMMARY_METRICS, load_routing, read_probe_table
from experiments.probing.routing import chance_jaccard, routing_report
from experiments.train import train
from mesh_model import ModelConfig, build_model, count_parameters
from sweeps.grid import expand_cells
from sweeps.sweep import run_sweep

E, K_TOP, D, H = 8, 2, 64, 128  # tiny-moe: 8 experts of width 128, top-2, d_model 64
EXPERT = E * (D * H + H + H * D + D)  # one MoE block's experts (two biased Linear layers each)
MOE_BLOCKS = ("prelude.0", "cores.0.0", "cores.0.1", "coda.0")  # 1+2R2+1: every block is MoE
CORES = ("cores.0.0", "cores.0.1")
MAX_CV = math.sqrt(E / K_TOP - 1)  # every token to the same k experts


def lit_module(scheme: str = "mesh", preset: str = "tiny-moe") -> MeshLitModule:
    """A lit module whose ``log`` records into ``module.logged`` and whose optimizer is a stand-in
    (``training_step`` logs the learning rate): everything else is the real module and model."""
    config = ModelConfig.from_preset(preset, scheme=scheme)
    module = MeshLitModule(config.to_dict(), OptimConfig(), peak_lr=1e-3, max_steps=10, val_names=["val"])
    module.logged = {}
    module.log = lambda name, value, **_: module.logged.__setitem__(name, value)
    module.optimizers = lambda: SimpleNamespace(param_groups=[{"lr": 1e-3}])
    return module


def test_the_backpropagated_loss_is_the_lm_loss_plus_the_weighted_router_losses():
    module = lit_module()
    batch = torch.randint(0, module.config.vocab_size, (4, 32))
    loss = module.training_step(batch, 0)
    with torch.no_grad():
        out = module.model(batch, labels=batch, return_logits=False)
    assert out.aux_lb > 0 and out.aux_z > 0
    assert module.config.moe.aux_coef == 0.01 and module.config.moe.z_coef == 0.001
    assert loss.requires_grad
    assert loss.item() == pytest.approx((out.loss + 0.01 * out.aux_lb + 0.001 * out.aux_z).item(), rel=1e-6)
    assert loss.item() > out.loss.item()  # the router losses are in it
    assert module.logged["train/loss"].item() == pytest.approx(out.loss.item(), rel=1e-6)  # the LM loss alone
    assert module.logged["train/aux_lb"].item() == pytest.approx(out.aux_lb.item(), rel=1e-6)
    assert module.logged["train/aux_z"].item() == pytest.approx(out.aux_z.item(), rel=1e-6)
    # What is returned is what Lightning backpropagates: the router losses' gradient is in it.
    loss.backward()
    routers = {n: p.grad.clone() for n, p in module.model.named_parameters() if n.endswith("router.weight")}
    assert len(routers) == 4
    module.model.zero_grad()
    module.model(batch, labels=batch, return_logits=False).loss.backward()  # the LM loss alone
    lm_only = {n: p.grad for n, p in module.model.named_parameters() if n.endswith("router.weight")}
    assert all(not torch.allclose(routers[n], lm_only[n]) for n in routers)


def test_validation_is_the_lm_loss_alone():
    module = lit_module()
    batch = torch.randint(0, module.config.vocab_size, (4, 32))
    module.on_validation_epoch_start()
    module.validation_step(batch, 0)
    total, count = module._val_sums[0]
    with torch.no_grad():
        out = module.model(batch, labels=batch, return_logits=False)
    assert count == 4 and total / count == pytest.approx(out.loss.item(), rel=1e-6)
    assert out.aux_loss > 0  # ... which the validation loss leaves out


def test_a_dense_model_trains_on_the_lm_loss_and_logs_no_router_losses():
    module = lit_module(scheme="mesh", preset="tiny")
    batch = torch.randint(0, module.config.vocab_size, (4, 32))
    loss = module.training_step(batch, 0)
    with torch.no_grad():
        out = module.model(batch, labels=batch, return_logits=False)
    assert out.aux_loss is None and loss.item() == pytest.approx(out.loss.item(), rel=1e-6)
    assert set(module.logged) == {"train/loss", "lr"}


# ---------------------------------------------------------------- a run end to end


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, compose_run):
    """A looped MoE + MeSH run of 6 steps (logged every 2), probed at the end on one batch."""
    runs_dir = tmp_path_factory.mktemp("moe_run")
    cfg = compose_run(
        "model=tiny-moe",
        "scheme=mesh",
        "max_steps=6",
        "val_every=3",
        "log_every=2",
        "checkpoint_every=3",
        "probes.num_batches=1",
        *FULL_PROBES,
        f"runs_dir={runs_dir}",
    )
    result = train(cfg)
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    return SimpleNamespace(result=result, client=client, run=client.get_run(result["run_id"]))


def test_a_looped_moe_mesh_run_logs_router_losses_and_active_parameters(moe_run):
    metrics, run_id = moe_run.run.data.metrics, moe_run.run.info.run_id
    assert moe_run.run.info.status == "FINISHED" and moe_run.result["steps"] == 6
    assert moe_run.run.data.tags["preset"] == "tiny-moe" and moe_run.run.data.tags["scheme"] == "mesh"
    steps = [m.step for m in moe_run.client.get_metric_history(run_id, "train/loss")]
    assert len(steps) == 3  # every log_every = 2 steps
    for name in ("train/aux_lb", "train/aux_z"):
        history = moe_run.client.get_metric_history(run_id, name)
        assert [m.step for m in history] == steps, name  # beside train/loss
        assert all(math.isfinite(m.value) and m.value > 0 for m in history)
    # Validation: the LM loss alone (val_loss is the main set's loss, and its PPL is exp of it).
    assert moe_run.result["val_loss"] == pytest.approx(metrics["val/shakespeare/loss"])
    assert metrics["val/shakespeare/ppl"] == pytest.approx(math.exp(metrics["val/shakespeare/loss"]), rel=1e-9)
    # Exact counts: 4 MoE blocks of 8 experts, top-2 active; the MeSH routers are dense.
    vocab = int(moe_run.run.data.params["model_config.vocab_size"])
    model = build_model(ModelConfig.from_preset("tiny-moe", scheme="mesh", vocab_size=vocab))
    counts = count_parameters(model)
    assert metrics["params_expert"] == counts["expert"] == 4 * EXPERT
    assert metrics["params_moe_router"] == counts["moe_router"] == 4 * D * E
    inactive = 4 * EXPERT * (E - K_TOP) // E
    assert metrics["params_active_non_embedding"] == metrics["params_non_embedding"] - inactive
    assert metrics["params_active_total"] == metrics["params_total"] - inactive
    assert metrics["params_non_embedding"] == counts["non_embedding"]


def test_the_routing_probes_per_loop_iteration_reach_the_probe_table_in_range(moe_run, tmp_path):
    metrics, run_id = moe_run.run.data.metrics, moe_run.run.info.run_id
    table = read_probe_table(moe_run.client.download_artifacts(run_id, "probes/final/probes.csv", str(tmp_path)))
    routing = {k: v for k, v in table.items() if k.startswith("probe/moe_")}
    # MLflow: the summaries only, the routing's four among them (its load CV and entropy per call are not).
    logged = {k: v for k, v in metrics.items() if k.startswith("probe/")}
    assert set(logged) == set(SUMMARY_METRICS) and logged == {k: table[k] for k in logged}
    for block in MOE_BLOCKS:
        calls = [f"{block}/iter{t}" for t in (1, 2)] if block in CORES else [block]
        for at in calls:
            assert 0 <= routing[f"probe/moe_load_cv/{at}"] <= MAX_CV + 1e-9
            assert 0 <= routing[f"probe/moe_load_min/{at}"] <= 1 <= routing[f"probe/moe_load_max/{at}"] <= E / K_TOP
            assert 0 <= routing[f"probe/moe_entropy/{at}"] <= math.log(E) + 1e-9
    for block in CORES:
        assert 0 <= routing[f"probe/moe_jaccard/{block}/iter1/iter2"] <= 1
    assert "probe/moe_jaccard/prelude.0/iter1/iter2" not in routing  # called once: no pairs
    loop_pairs = [routing[f"probe/moe_jaccard/{b}/iter1/iter2"] for b in CORES]
    assert routing["probe/moe_jaccard/loop_mean"] == pytest.approx(sum(loop_pairs) / 2)
    assert routing["probe/moe_jaccard/chance"] == pytest.approx(5 / 28)  # E = 8, k = 2
    calls = [routing[f"probe/moe_entropy/{b}"] for b in ("prelude.0", "coda.0")]
    calls += [routing[f"probe/moe_entropy/{b}/iter{t}"] for b in CORES for t in (1, 2)]
    assert routing["probe/moe_entropy/mean"] == pytest.approx(sum(calls) / 6)
    assert all(math.isfinite(v) for v in routing.values())
    # The full load vectors in probes.json (and its metrics = the table's), the routing figure beside.
    local = Path(moe_run.client.download_artifacts(run_id, "probes/final/probes.json", str(tmp_path)))
    saved = json.loads(local.read_text())
    assert saved["metrics"] == pytest.approx(table)
    report = load_routing(local)
    assert (report.experts, report.top_k, report.tokens) == (E, K_TOP, 8 * 512)
    assert list(report.blocks) == list(MOE_BLOCKS)
    for block, r in report.blocks.items():
        assert r.load.shape == ((2, E) if block in CORES else (1, E))
        assert torch.allclose(r.load.sum(-1), torch.ones(len(r.load), dtype=torch.float64))
    sizes = {Path(a.path).name: a.file_size for a in moe_run.client.list_artifacts(run_id, "probes/final")}
    assert sizes["probe_routing.png"] > 1024 and sizes["probe_routing.svg"] > 1024


def test_mesh_probe_of_a_moe_checkpoint_reproduces_the_final_routing(moe_run, tmp_path, capsys):
    from experiments.probing.cli import main as probe_main

    run_dir = Path(moe_run.result["run_dir"])
    assert probe_main([str(run_dir), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "router call" in printed and "cores.0.1/iter2" in printed
    again, final = load_routing(tmp_path), load_routing(run_dir / "probes" / "final")
    for block, r in final.blocks.items():
        assert torch.allclose(again.blocks[block].load, r.load) and torch.allclose(
            again.blocks[block].jaccard, r.jaccard
        )
    assert (tmp_path / "probe_routing.png").stat().st_size > 1024


def test_a_dense_run_logs_no_router_losses_active_parameters_or_routing(tiny_run):
    metrics = tiny_run.client.get_run(tiny_run.run_id).data.metrics
    assert "train/loss" in metrics and "params_non_embedding" in metrics
    added = ("train/aux", "params_active", "params_expert", "params_moe", "probe/moe_")
    assert not [k for k in metrics if k.startswith(added)]
    assert load_routing(tiny_run.run_dir / "probes" / "final") is None


def test_routing_report_is_a_token_weighted_mean_whatever_the_windows():
    model = build_model(ModelConfig.from_preset("tiny-moe", scheme="base"))
    batches = [torch.randint(0, 256, (2, 64)) for _ in range(2)]
    whole, windows = routing_report(model, batches), routing_report(model, batches, window=32)
    assert whole.tokens == windows.tokens == 256
    separately = [routing_report(model, [batch[:, i : i + 32]]) for batch in batches for i in (0, 32)]
    for block, r in windows.blocks.items():
        for key in ("load", "entropy", "jaccard"):
            mean = sum(getattr(s.blocks[block], key) for s in separately) / 4
            assert torch.allclose(getattr(r, key), mean), (block, key)
    assert routing_report(build_model(ModelConfig.from_preset("tiny")), batches) is None  # dense: no routing
    assert chance_jaccard(8, 2) == pytest.approx(5 / 28) and chance_jaccard(4, 4) == 1.0


# ---------------------------------------------------------------- the moe grid


def test_the_moe_sweep_is_vanilla_base_anchor_and_mesh_mixtures_of_experts(tmp_path):
    cells = expand_cells("moe", [f"runs_dir={tmp_path}"], seeds=[0, 1, 2])
    assert [c.label for c in cells] == [
        f"scheme={s} seed={d}" for s in ("vanilla", "base", "anchor", "mesh") for d in range(3)
    ]
    plans = {c.label.split()[0]: plan_run(compose_config(c.overrides)) for c in cells if "seed=0" in c.label}
    for label, plan in plans.items():
        model = plan.model_config
        assert model.preset == "tiny-moe" and model.moe is not None and model.moe.experts == E, label
        assert model.layout == ("6" if label == "scheme=vanilla" else "1+2R2+1"), label
        assert plan.run_dir.parent.name == "moe"
    out = io.StringIO()
    assert run_sweep("moe", ["seeds=3", f"runs_dir={tmp_path}"], dry_run=True, out=out) == 0
    assert out.getvalue().startswith("moe: 12 cells (4 configs x 3 seeds)") and "scheme=mesh seed=2" in out.getvalue()
    assert not (tmp_path / "mlflow.db").exists()
    (mini,) = expand_cells("moe", ["model=mini-moe", "scheme=mesh", f"runs_dir={tmp_path}"], seeds=[])
    assert plan_run(compose_config(mini.overrides)).model_config.preset == "mini-moe"
