import os
import re

import pytest
import yaml
from helpers import run_process, run_tool

from experiments.data.cache import cache_root
from mesh_model.__main__ import main
from mesh_model.cli_text import plain


def test_params_table_prints_the_paper_rows(capsys):
    assert main(["params"]) == 0
    out = capsys.readouterr().out
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:4]): line for line in out.splitlines()}
    assert "1,208,602,624" in rows[("pythia-1.4b", "24", "vanilla", "-")]
    base = rows[("pythia-1.4b", "4+8R2+4", "base", "-")]
    assert "805,736,448" in base and "66.667" in base
    mesh = rows[("pythia-1.4b", "4+8R2+4", "mesh", "5")]
    assert "805,797,918" in mesh and "61,470" in mesh
    assert ("pythia-410m", "3+6R3+3", "mesh", "6") in rows


def test_params_for_one_config_and_bad_input(capsys):
    assert main(["params", "--preset", "tiny", "--layout", "1+2R3+1", "--scheme", "mesh"]) == 0
    out = capsys.readouterr().out
    assert "| tiny   | 8       | vanilla |" in out and "| tiny   | 1+2R3+1 | mesh    | 6 |" in out
    assert main(["params", "--preset", "tiny", "--layout", "4+8R0+4"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "error: layout='4+8R0+4' is invalid: the loop count must be at least 1 (K>=1 in P+CRK+Q, e.g. 4+8R2+4)"
    )


def test_check_trains_every_scheme_and_the_loss_falls():
    result = run_tool("mesh-model", "check")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ") and "scheme" not in line]
    assert len(lines) == 9
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[3]) < float(cells[2]), line


# --- every console script: --version, plain-text --help; mesh-train's Hydra flags and quiet runs ---

CONSOLE_SCRIPTS = ("mesh-train", "mesh-sweep", "mesh-results", "mesh-model", "mesh-probe", "mesh-eval")
NOISE = ("GPU available", "TPU available", "litlogger", "Creating initial MLflow database tables", "srun")


@pytest.mark.parametrize("script", [*CONSOLE_SCRIPTS, "experiments.data"])
def test_every_cli_prints_its_version_and_plain_help(script):
    version = run_tool(script, "--version")
    assert version.returncode == 0, version.stderr
    prog = "python -m experiments.data" if script == "experiments.data" else script
    assert re.fullmatch(rf"{re.escape(prog)} \d+\.\d+\S* \(commit ([0-9a-f]{{7,}}|unknown)\)\n", version.stdout)
    helped = run_tool(script, "--help")
    assert helped.returncode == 0, helped.stderr
    assert "``" not in helped.stdout and ":func:`" not in helped.stdout and "--version" in helped.stdout
    assert "top layer" not in helped.stdout  # notes for the code's readers stay out of --help


def test_help_text_is_plain():
    assert (
        plain("run ``mesh-train`` (see :func:`~experiments.train.train`)::")
        == "run mesh-train (see experiments.train.train):"
    )


def test_mesh_train_help_lists_the_run_groups_and_keys_not_hydras():
    out = run_tool("mesh-train", "--help").stdout
    for line in (
        "data=shakespeare",
        "trainer=gpu",
        "optim=adamw",
        "scheme=base",
        "buffer_slots=null",
        "max_steps=null",
        "recipe=pythia",
        "tokens=null",
    ):
        assert line in out
    for key in ("data.seq_len=", "trainer.accelerator=cpu", "optim.lr=null", "probes.num_batches=2", "runs_dir=runs"):
        assert key in out
    assert "activation_checkpointing=false  recompute each core iteration in backward" in out
    # Every preset with its shape, and the scheme names.
    from mesh_model import PRESETS

    assert all(f"  model={name} " in out for name in PRESETS)
    assert "model=pythia-410m               d=1024, 16 heads, 24 layers, 4+8R2+4, lr 0.0003" in out
    assert "  base, static, dynamic, mesh, residual, anchor, anchor_emb, vanilla, residual+anchor," in out
    assert "Powered by Hydra" not in out and "hydra/launcher" not in out and "hydra/sweeper" not in out
    assert "resources" not in out


@pytest.mark.parametrize(
    "flags",
    [
        ["--cfg", "job"],
        ["-c", "job"],
        ["--cfg=job"],
        ["--cfg", "all", "--resolve"],
        ["--cfg", "job", "--package", "data"],
        ["-p", "data", "-c", "job", "model=mini"],
    ],
)
def test_mesh_train_hydra_flags_take_their_value_in_both_forms(flags):
    done = run_tool("mesh-train", *flags)
    assert done.returncode == 0, done.stderr
    printed = yaml.safe_load(done.stdout)
    data = printed if "data" in flags else printed["data"]  # --package data prints that node alone
    assert data["corpus"] == "shakespeare"


def test_mesh_train_info_and_a_bad_key_after_flags():
    assert "defaults" in run_tool("mesh-train", "--info", "defaults").stdout.lower()
    bad = run_tool("mesh-train", "--cfg", "job", "nosuchkey=1")
    assert bad.returncode == 2 and bad.stderr.startswith("error: 'nosuchkey' is not a config key")


def test_override_arguments_skip_flag_values():
    from experiments.train import override_arguments

    argv = ["--cfg", "job", "-p", "data", "--info", "defaults", "-m", "--resolve", "--cfg=all", "seed=1", "-i", "x=2"]
    assert override_arguments(argv) == ["seed=1", "x=2"]


@pytest.mark.slow
def test_a_training_run_is_quiet_by_default_and_chatty_with_v(tmp_path, tiny_overrides):
    """(Real processes: what Lightning and MLflow print when first imported.) The start-up lines of Lightning and MLflow stay out; -v lets them in. A fake srun on PATH
    stands for a machine with SLURM installed (Lightning's srun hint). Each run has an empty cache
    (its data read from the usual one), so MLflow makes the empty store that new stores are copied
    from (experiments/store/sqlite.py), and says so under -v."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 0\n")
    (fake_bin / "srun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("MESH_LOG_LEVEL", "MLFLOW_LOGGING_LEVEL")}
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
    data = f"data.cache_dir={cache_root()}"
    run = tiny_overrides("max_steps=2", "val_every=2", "checkpoint_every=2", "probes.enabled=false", data)
    quiet = run_process(
        "mesh-train", *run, f"runs_dir={tmp_path / 'quiet'}", env={**env, "MESH_CACHE_DIR": str(tmp_path / "c1")}
    )
    assert quiet.returncode == 0, quiet.stderr
    output = quiet.stdout + quiet.stderr
    assert [n for n in NOISE if n in output] == [], output
    assert "[mesh-train] val loss" in quiet.stdout
    chatty = run_process(
        "mesh-train", "-v", *run, f"runs_dir={tmp_path / 'chatty'}", env={**env, "MESH_CACHE_DIR": str(tmp_path / "c2")}
    )
    assert chatty.returncode == 0, chatty.stderr
    output = chatty.stdout + chatty.stderr
    assert [n for n in NOISE if n not in output] == [], output
