"""Probes for every run: the callback's summary metrics in MLflow, its figures, probes.json and
probes.csv (every value) as artifacts, and mesh-probe."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
import torch
from conftest import FULL_PROBES
from helpers import run_tool

from experiments.checkpoints import load_model
from experiments.config import ProbeConfig
from experiments.data.config import as_data_config
from experiments.data.datamodule import TokenDataModule
from experiments.data.prepare import prepare
from experiments.plan import InputError
from experiments.probing.batches import held_out_batches
from experiments.probing.callback import ProbeCallback, probe_callbacks
from experiments.probing.cli import main as probe_main
from experiments.probing.files import (
    SUMMARY_METRICS,
    load_report,
    read_probe_table,
    report_from_dict,
    report_to_dict,
    write_probe_files,
)
from experiments.probing.state_routing import StateRoutingCallback, state_routing_metrics
from experiments.train import padded_vocab, train
from mesh_model import ModelConfig, build_model
from results.verdicts.schema import load_claims

FIGURES = [f"probe_{name}.{fmt}" for name in ("updates", "cka_rbf", "cka_linear", "spectra") for fmt in ("png", "svg")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, compose_run, tiny_run):
    """A tiny base run probed at every validation, and the session's tiny MeSH run, probed at the
    end only (10 steps, validated at 5 and 10, like the base run)."""
    assert (tiny_run.steps, tiny_run.result["steps"]) == (10, 10)
    runs_dir = tmp_path_factory.mktemp("base")
    cfg = compose_run(
        *FULL_PROBES,
        "max_steps=10",
        "val_every=5",
        "scheme=base",
        "probes.every_n_validations=1",
        f"runs_dir={runs_dir}",
    )
    result = train(cfg)
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    return {
        "base": SimpleNamespace(client=client, run_id=result["run_id"], run_dir=Path(result["run_dir"])),
        "mesh": SimpleNamespace(client=tiny_run.client, run_id=tiny_run.run_id, run_dir=tiny_run.run_dir),
    }


@pytest.fixture
def data(compose_run):
    """The tiny run's data config: 2 validation batches of 8 windows of 64 tokens; the probes take
    2 batches of 8 samples of 512 tokens (probes.seq_len null: max(64, 512)), read in 64-token windows."""
    return as_data_config(compose_run().data)


def artifact_sizes(client: mlflow.MlflowClient, run_id: str, path: str) -> dict[str, int]:
    return {Path(a.path).name: a.file_size for a in client.list_artifacts(run_id, path)}


def final_table(run: SimpleNamespace, tmp_path: Path) -> dict[str, float]:
    """Every probe value of the run's final probe, read from its ``probes.csv`` artifact."""
    return read_probe_table(run.client.download_artifacts(run.run_id, "probes/final/probes.csv", str(tmp_path)))


def logged_probe_metrics(run: SimpleNamespace) -> dict[str, float]:
    return {k: v for k, v in run.client.get_run(run.run_id).data.metrics.items() if k.startswith("probe/")}


@pytest.mark.parametrize("scheme", ["base", "mesh"])
def test_mlflow_holds_the_summary_probe_metrics_and_probes_csv_every_value(runs, scheme, tmp_path):
    """A run's page lists the few summaries, every probe metric a claim reads among them; the
    other values (per block, CKA pair, stage) are in the table only."""
    run = runs[scheme]
    table, logged = final_table(run, tmp_path), logged_probe_metrics(run)
    dense = {m for m in SUMMARY_METRICS if not m.startswith("probe/moe_")}
    assert set(logged) == dense and len(dense) == 7
    # the final probe's values (mesh-probe's test may have logged the same probe again, to 1e-9)
    assert logged == pytest.approx({k: table[k] for k in dense}, rel=1e-9)
    # S stages (base: h0 is the prelude's output, one fewer): samples and seq_len, 28 update values,
    # 8 norms, per estimator S(S-1)/2 pairs and 4 means and floors, erank and sv50 per stage, loop erank.
    stages = {"base": 5, "mesh": 6}[scheme]
    assert len(table) == 2 + 28 + 8 + 4 * (stages * (stages - 1) // 2 + 4) + 2 * stages + 1
    claims = {m for c in load_claims().claims for m in (c.metric, *c.also) if m.startswith("probe/")}
    assert claims and claims <= set(logged)
    # The loop states' mean effective rank, as results.rows.aggregate reads it from older runs.
    assert table["probe/erank/loop_mean"] == statistics.fmean([table["probe/erank/h1"], table["probe/erank/h2"]])


@pytest.mark.parametrize("scheme", ["base", "mesh"])
def test_probe_values_figures_and_json_reach_mlflow(runs, scheme, tmp_path):
    run = runs[scheme]
    metrics = final_table(run, tmp_path)
    assert metrics["probe/samples"] == 16 and metrics["probe/seq_len"] == 512  # 2 batches of 8 samples
    for block in ("prelude", "core1", "core2", "coda"):
        assert 0 < metrics[f"probe/update/{block}/mean"] <= 2 and metrics[f"probe/update/{block}/std"] > 0
    for block in ("core1", "core2"):
        assert 0 < metrics[f"probe/state_update/{block}/mean"] <= 2
    for estimator in ("rbf", "linear", "rbf_debiased", "linear_debiased"):
        for name in (f"probe/cka_{estimator}/loop_mean", f"probe/cka_{estimator}/h0/h1"):
            assert 0 < metrics[name] <= 1 + 1e-9
    # The floors of 512 x 64 matrices: the paper's RBF estimator reads 0.54 for unrelated states.
    assert 0.5 < metrics["probe/cka_rbf/floor"] < 0.58 and 0.09 < metrics["probe/cka_linear/floor"] < 0.13
    assert (
        abs(metrics["probe/cka_rbf_debiased/floor"]) < 0.02 and abs(metrics["probe/cka_linear_debiased/floor"]) < 0.02
    )
    assert 1 <= metrics["probe/erank/h1"] <= 64
    assert 0 < metrics["probe/update/core_balance"] <= 1 and 0 < metrics["probe/state_update/core_balance"] <= 1
    # The confounds: the norms in and out of every block, the normalised update and its balance, and
    # the permutation floors, in the table like every other probe value.
    for block in ("prelude", "core1", "core2", "coda"):
        assert metrics[f"probe/norm/in/{block}"] > 0 and metrics[f"probe/norm/out/{block}"] > 0
        assert 0 < metrics[f"probe/update_normed/{block}/mean"] <= 2
    assert 0 < metrics["probe/update_normed/core_balance"] <= 1
    assert 0 < metrics["probe/state_update_normed/core_balance"] <= 1
    for estimator in ("rbf", "linear", "rbf_debiased", "linear_debiased"):
        assert metrics[f"probe/cka_{estimator}/perm_floor"] < 0.6
        assert metrics[f"probe/cka_{estimator}/loop_perm_floor"] < metrics[f"probe/cka_{estimator}/loop_mean"]
    # MeSH's h(0) is read from its buffer: another norm than the prelude's output; base hands it on.
    assert (metrics["probe/norm/out/prelude"] == metrics["probe/norm/in/core1"]) == (scheme == "base")
    assert all(k.startswith("probe/") and math.isfinite(v) for k, v in metrics.items())
    # MeSH reads h(0) from its buffer, so its prelude output is a stage of its own; base has h(0) = prelude.
    assert ("probe/erank/prelude" in metrics) == (scheme == "mesh")

    for folder in ("probes/step10", "probes/final"):
        sizes = artifact_sizes(run.client, run.run_id, folder)
        assert set(FIGURES) | {"probes.json", "probes.csv"} <= set(sizes)
        assert all(sizes[name] > 1024 for name in FIGURES)
    local = run.client.download_artifacts(run.run_id, "probes/final/probes.json", str(tmp_path))
    saved = json.loads(Path(local).read_text())
    assert (
        saved["step"] == 10
        and saved["format"] == 3
        and saved["batches"]
        == {
            "split": "shakespeare/val",
            "num_batches": 2,
            "batch_size": 8,
            "seq_len": 512,
            "window": 64,
        }
    )
    assert saved["metrics"] == metrics
    assert len(saved["cka"]["rbf_debiased"]) == len(saved["stages"]) == len(saved["spectra"])
    assert len(saved["cka_perm_floors"]["rbf"]) == len(saved["stages"])
    assert {"h0", "f1", "coda"} <= set(saved["norms"]) and set(saved["normed_updates"]) == set(saved["updates"])
    assert (run.run_dir / "probes" / "final" / "probes.json").read_text() == Path(local).read_text()


def test_every_n_validations_probes_during_training(runs):
    base, mesh = runs["base"], runs["mesh"]
    history = base.client.get_metric_history(base.run_id, "probe/update/core_balance")
    assert sorted(m.step for m in history) == [5, 10]
    assert history[0].value != history[1].value  # the weights moved between the probes
    assert set(FIGURES) | {"probes.csv"} <= set(artifact_sizes(base.client, base.run_id, "probes/step5"))
    # At the end only; mesh-probe's test may have logged into this shared run too (probes/cli, step 10).
    assert {m.step for m in mesh.client.get_metric_history(mesh.run_id, "probe/update/core_balance")} == {10}
    folders = {a.path for a in mesh.client.list_artifacts(mesh.run_id, "probes")} - {"probes/cli"}
    assert folders == {"probes/final", "probes/step10"}


def test_routing_probes_reach_mlflow_at_every_validation_and_match_the_final_weights(runs, data):
    """The loop's coefficients and MeSH's router statistics, logged at steps 5 and 10 (the
    validations; the last one is also the end), and equal to a recomputation from the final weights."""
    base, mesh = runs["base"], runs["mesh"]
    history = base.client.get_metric_history(base.run_id, "routing/coef/coda/f2/mean")
    assert sorted((m.step, m.value) for m in history) == [(5, 1.0), (10, 1.0)]  # base's coda input is f_K
    assert base.client.get_run(base.run_id).data.metrics["routing/coef/h1/f1/mean"] == 1.0
    assert not any(k.startswith("routing/transition") for k in base.client.get_run(base.run_id).data.metrics)
    assert {m.step for m in mesh.client.get_metric_history(mesh.run_id, "routing/loop2/read/entropy")} == {5, 10}
    logged = {k: v for k, v in mesh.client.get_run(mesh.run_id).data.metrics.items() if k.startswith("routing/")}
    for router in ("transition", "loop1", "loop2"):
        for kind in ("write", "read"):
            assert (
                0 < logged[f"routing/{router}/{kind}/entropy"] <= 1 and logged[f"routing/{router}/{kind}/logit_std"] > 0
            )
            assert sum(logged[f"routing/{router}/{kind}/slot{b}"] for b in range(5)) == pytest.approx(1.0)
    # the coda input's coefficients: h_emb, prelude, f1, f2, each a convex weight of a buffer read
    assert all(0 < logged[f"routing/coef/coda/{s}/mean"] < 1 for s in ("h_emb", "prelude", "f1", "f2"))
    model, step = load_model(mesh.run_dir / "checkpoints" / "last.ckpt")
    assert step == 10
    batches = held_out_batches(data, prepare(data), 2, data.seq_len)
    assert state_routing_metrics(model, batches, data.seq_len) == pytest.approx(logged, rel=1e-4, abs=1e-6)


def test_cli_reproduces_the_final_probe_and_logs_into_the_run(runs, tmp_path, capsys):
    run = runs["mesh"]
    out = tmp_path / "cli"
    before = run.client.get_metric_history(run.run_id, "probe/cka_rbf/loop_mean")
    assert probe_main([str(run.run_dir), "--out", str(out), "--mlflow-run", "auto"]) == 0
    printed = capsys.readouterr().out
    assert "core1" in printed and "h0-h1" in printed and "eff. rank" in printed
    assert "normalised" in printed and "|in| -> |out|" in printed and "perm floor" in printed
    assert all((out / name).stat().st_size > 1024 for name in FIGURES)
    cli, final = load_report(out), load_report(run.run_dir / "probes" / "final")
    assert cli.stages == final.stages
    assert cli.as_metrics() == pytest.approx(final.as_metrics(), rel=1e-9, abs=1e-12)  # same weights, same tokens
    history = run.client.get_metric_history(run.run_id, "probe/cka_rbf/loop_mean")
    assert len(history) == len(before) + 1 and {m.step for m in history} == {10}  # logged once more, at step 10
    assert [m.value for m in history] == pytest.approx([before[0].value] * len(history), rel=1e-9)
    assert set(FIGURES) <= set(artifact_sizes(run.client, run.run_id, "probes/cli"))
    assert cli.norms == final.norms and set(cli.cka_perm_floors) == set(final.cka_perm_floors)  # read back whole
    # A wider RBF bandwidth moves only the RBF numbers (one batch of 128-token samples, to be quick).
    small = ["--batches", "1", "--seq-len", "128"]
    for name, fraction in (("half", "0.5"), ("wide", "1.0")):
        assert probe_main([str(run.run_dir), "--out", str(tmp_path / name), "--sigma-fraction", fraction, *small]) == 0
    half, wide = load_report(tmp_path / "half"), load_report(tmp_path / "wide")
    assert (half.sigma_fraction, wide.sigma_fraction) == (0.5, 1.0)
    assert wide.cka("h0", "h1", "linear") == pytest.approx(half.cka("h0", "h1", "linear"), rel=1e-12)
    assert wide.cka("h0", "h1") != pytest.approx(half.cka("h0", "h1"), abs=1e-6)
    assert wide.cka_floors["rbf"] < half.cka_floors["rbf"]


def test_cli_bad_paths_answer_with_one_line(runs, tmp_path, capsys):
    result = run_tool("mesh-probe", str(tmp_path / "missing"))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'missing'} does not exist (expected a checkpoint file or a run directory)"
    ]
    assert probe_main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path} has no checkpoints/last.ckpt (not a mesh-train run directory?)\n"
    )
    assert probe_main([str(runs["mesh"].run_dir), "--seq-len", "2", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "error: --seq-len=2 is invalid: must be >= 4 (the debiased CKA needs 4 rows)\n"
    for bad in ("0", "-1", "nan", "inf"):
        assert probe_main([str(runs["mesh"].run_dir), "--sigma-fraction", bad, "--out", str(tmp_path / "out")]) == 2
        assert (
            capsys.readouterr().err == f"error: --sigma-fraction={float(bad)} is invalid: must be a finite number > 0\n"
        )
    assert not (tmp_path / "out").exists()


def test_held_out_batches_are_the_first_validation_batches(data):
    batches = held_out_batches(data, prepare(data), 2, data.seq_len)
    loader = list(TokenDataModule(data).val_dataloader()[0])  # data.val_batches=2: two batches
    assert len(batches) == 2 and all(b.shape == (8, 64) and b.dtype == torch.int64 for b in batches)
    for ours, theirs in zip(batches, loader, strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(torch.cat(held_out_batches(data, prepare(data), 1, data.seq_len)), batches[0])
    # Longer samples: sample i is validation windows 4i .. 4i+3 joined, the windows the model reads.
    longer = held_out_batches(data, prepare(data), 1, 4 * data.seq_len)
    assert longer[0].shape == (8, 256)
    assert torch.equal(longer[0][:4].reshape(16, 64), torch.cat(loader)[:16])
    with pytest.raises(
        ValueError, match=r"^probes.seq_len=10000000 is invalid: the validation split has only \d+ tokens$"
    ):
        held_out_batches(data, prepare(data), 1, 10_000_000)


def test_callback_probes_on_rank_zero_only_restores_train_mode_and_survives_errors(tmp_path, data):
    prepared = prepare(data)
    model = build_model(ModelConfig.from_preset("tiny", vocab_size=padded_vocab(prepared.vocab_size)))
    model.train()
    trainer = SimpleNamespace(
        is_global_zero=False,
        global_step=7,
        strategy=None,
        logger=None,
        datamodule=SimpleNamespace(cfg=data, data=prepared),
    )
    callback = ProbeCallback(tmp_path, num_batches=1)
    callback.on_train_end(trainer, SimpleNamespace(model=model))
    assert not (tmp_path / "probes").exists()
    trainer.is_global_zero = True
    callback.on_train_end(trainer, SimpleNamespace(model=model))
    assert model.training and all(p.grad is None for p in model.parameters())
    for folder in ("step7", "final"):
        assert {p.name for p in (tmp_path / "probes" / folder).iterdir()} == {*FIGURES, "probes.json", "probes.csv"}
    assert load_report(tmp_path / "probes" / "final").samples == 8
    # probes.csv: the values of probes.json's metrics as a table, one row each, by name.
    table = read_probe_table(tmp_path / "probes" / "final" / "probes.csv")
    saved = json.loads((tmp_path / "probes" / "final" / "probes.json").read_text())["metrics"]
    assert list(table) == sorted(saved) and table == pytest.approx(
        {k: math.nan if v is None else v for k, v in saved.items()}, nan_ok=True
    )
    # A probe that fails warns and leaves the run alone.
    trainer.datamodule, trainer.global_step = None, 8
    with pytest.warns(UserWarning, match="probes failed at step 8: AttributeError"):
        callback.on_train_end(trainer, SimpleNamespace(model=model))
    assert not (tmp_path / "probes" / "step8").exists()


def test_probe_config_switch_and_bad_values(tmp_path, compose_run):
    assert probe_callbacks(ProbeConfig(enabled=False), tmp_path) == []
    callback, routing = probe_callbacks(ProbeConfig(enabled=True, every_n_validations=3, num_batches=4), tmp_path)
    assert (callback.every_n_validations, callback.num_batches, callback.config.seq_len) == (3, 4, None)
    assert isinstance(routing, StateRoutingCallback) and routing.num_batches == 4
    assert [callback.config.resolved_seq_len(n) for n in (64, 512, 4096)] == [512, 512, 4096]
    callback, _ = probe_callbacks(ProbeConfig(seq_len=96), tmp_path)
    assert callback.config.resolved_seq_len(64) == 96
    bad = {
        "probes.num_batches=0": r"^probes.num_batches=0 is invalid: must be >= 1$",
        "probes.seq_len=3": r"^probes.seq_len=3 is invalid: must be >= 4$",
        "probes.debiased=true": r"^probes.debiased=True is invalid: obsolete: the biased and the debiased CKA are both",
    }
    for override, message in bad.items():
        with pytest.raises(InputError, match=message):
            train(compose_run(override, f"runs_dir={tmp_path}"))
    assert not (tmp_path / "mesh").exists()


def test_probes_json_of_the_first_format_is_read_back(tmp_path):
    """Files written before the core update was split off: their core "updates" were h(t-1) -> h(t)."""
    old = {
        "samples": 2,
        "loops": 2,
        "top": 3,
        "sigma_fraction": 0.5,
        "debiased": False,
        "stages": ["embedding", "h0", "h1", "h2", "coda"],
        "updates": {
            b: {"mean": m, "std": 0.1}
            for b, m in zip(("prelude", "core1", "core2", "coda"), (1, 0.6, 0.3, 0.2), strict=True)
        },
        "cka_rbf": [[1.0 if i == j else 0.9 for j in range(5)] for i in range(5)],
        "cka_linear": [[1.0 if i == j else 0.8 for j in range(5)] for i in range(5)],
        "spectra": {s: [1.0, 0.5, None] for s in ("embedding", "h0", "h1", "h2", "coda")},
        "effective_ranks": {s: 2.0 for s in ("embedding", "h0", "h1", "h2", "coda")},
    }
    report = report_from_dict(old)
    assert list(report.updates) == ["prelude", "coda"] and list(report.state_updates) == ["core1", "core2"]
    assert list(report.cka_matrices) == ["rbf", "linear"] and report.cka_floors == {}
    metrics = report.as_metrics()
    assert metrics["probe/state_update/core_balance"] == pytest.approx(0.5)
    assert "probe/update/core_balance" not in metrics and "probe/update/core1/mean" not in metrics
    assert metrics["probe/cka_rbf/loop_mean"] == pytest.approx(0.9)
    assert list(report_from_dict({**old, "debiased": True}).cka_matrices) == ["rbf_debiased", "linear_debiased"]
    assert report_from_dict(report_to_dict(report)).as_metrics() == pytest.approx(metrics)
    write_probe_files(report, tmp_path)  # the figures draw what there is
    with pytest.raises(ValueError, match=r"^probes.json format 7 is unknown: this version reads formats 1 to 3$"):
        report_from_dict({**report_to_dict(report), "format": 7})


def test_probes_json_of_the_second_format_is_read_back_without_the_confounds(runs, tmp_path):
    """Format 2 had no norms, normalised updates or permutation floors: they read back empty and
    their metrics are not made up."""
    current = load_report(runs["mesh"].run_dir / "probes" / "final")
    assert current.norms and current.normed_updates and current.cka_perm_floors
    new = ("norms", "normed_updates", "state_normed_updates", "cka_perm_floors")
    old = {k: v for k, v in report_to_dict(current).items() if k not in new} | {"format": 2}
    report = report_from_dict(old)
    assert all(getattr(report, name) == {} for name in new)
    metrics = report.as_metrics()
    assert not [k for k in metrics if "/norm/" in k or "normed" in k or "perm_floor" in k]
    assert metrics == pytest.approx({k: v for k, v in current.as_metrics().items() if k in metrics})
    write_probe_files(report, tmp_path)


def test_probes_without_figures_write_the_same_numbers_and_no_picture(runs, tmp_path):
    """probes.figures=false (the tests' runs): probes.json and probes.csv as with figures, byte for
    byte, and no PNG or SVG; the setting reaches the run's probe callback."""
    from experiments.config import ProbeConfig
    from experiments.probing.callback import ProbeCallback, probe_callbacks

    report = load_report(runs["mesh"].run_dir / "probes" / "final")
    drawn = write_probe_files(report, tmp_path / "drawn", step=10)
    bare = write_probe_files(report, tmp_path / "bare", figures=False, step=10)
    assert sorted(p.name for p in bare) == ["probes.csv", "probes.json"]
    assert {p.suffix for p in drawn} == {".png", ".svg", ".json", ".csv"}
    for path in bare:
        assert path.read_bytes() == (tmp_path / "drawn" / path.name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "bare").iterdir()) == ["probes.csv", "probes.json"]
    (callback, _) = probe_callbacks(ProbeConfig(figures=False), tmp_path)
    assert isinstance(callback, ProbeCallback) and callback.config.figures is False
