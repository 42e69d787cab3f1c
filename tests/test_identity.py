"""One definition of a run's identity: the hash comes from the resolved model and the keys that
change the computation; the results tables group runs with the same definition."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.compose import compose_config
from experiments.identity import (
    RUN_INVARIANT_KEYS,
    changes_computation,
    distinguishes_rows,
    identity_fields,
    model_params,
    run_name,
)
from experiments.plan import plan_run
from experiments.train import train
from results.rows.frame import grouping_params, overrides_label


def plan(tmp_path, *overrides):
    return plan_run(compose_config([f"runs_dir={tmp_path}", *overrides]))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (["scheme=anchor*"], ["scheme=anchor_emb"]),
        (["scheme=residual+anchor"], ["scheme=anchor+residual"]),
        (["model=mini", "layout=2+4r2+2"], ["model=mini", "layout=2+4R2+2"]),
        (["model=mini", "layout=02+4R2+2"], ["model=mini"]),
        (["scheme=mesh"], ["scheme=mesh", "buffer_slots=5"]),  # B = K+3 = 5 is the default
        (["scheme=vanilla"], ["layout=6"]),  # vanilla at the compute depth of 1+2R2+1
    ],
)
def test_equivalent_spellings_are_one_run(tmp_path, one, other):
    first, second = plan(tmp_path, *one), plan(tmp_path, *other)
    assert first.config_hash == second.config_hash
    assert first.run_dir == second.run_dir


@pytest.mark.parametrize(
    "override",
    ["log_every=3", "checkpoint_every=7", "compile=true", "activation_checkpointing=true", "probes.num_batches=4"],
)
def test_run_invariant_keys_keep_the_hash(tmp_path, override):
    assert plan(tmp_path, override).config_hash == plan(tmp_path).config_hash


@pytest.mark.parametrize(
    "override", ["seed=1", "max_steps=7", "optim.lr=0.001", "val_every=5", "scheme=mesh", "data.seq_len=64"]
)
def test_what_changes_the_computation_changes_the_hash(tmp_path, override):
    assert plan(tmp_path, override).config_hash != plan(tmp_path).config_hash


def test_the_hash_and_the_table_rows_share_one_definition():
    for key in RUN_INVARIANT_KEYS:
        assert not changes_computation(key) and not changes_computation(f"{key}.child")
        assert not distinguishes_rows(key)
    assert changes_computation("seed") and not distinguishes_rows("seed")  # seeds are replicates
    assert changes_computation("optim.lr") and distinguishes_rows("optim.lr")
    assert changes_computation("data.seq_len") and not changes_computation("data.num_workers")
    assert not distinguishes_rows("model_config.layout") and not distinguishes_rows("model_config/scheme")

    frame = pd.DataFrame(
        {
            "status": ["FINISHED"] * 4,
            "params": [
                {"seed": str(s), "compile": c, "activation_checkpointing": c, "log_every": c, "optim.lr": lr}
                for s, c, lr in (
                    (0, "True", "0.001"),
                    (1, "False", "0.001"),
                    (0, "True", "0.002"),
                    (1, "False", "0.002"),
                )
            ],
        }
    )
    assert grouping_params(frame) == ["optim.lr"]


def test_an_override_beside_an_empty_mapping_makes_its_own_row():
    """MeSH's control logs ``model_overrides={}`` (flatten logs an empty mapping as one param); an
    arm logs ``model_overrides.mesh_router_init=own_slot``: two rows, not one of six seeds. A key
    that some runs did not log at all (an older run) still does not split rows."""
    control = [{"seed": str(s), "model_overrides": "{}", "optim.lr": "0.004"} for s in (12, 13)]
    arm = [
        {"seed": str(s), "model_overrides.mesh_router_init": "own_slot", "optim.lr": "0.004", "optim.new": "1"}
        for s in (12, 13)
    ]
    frame = pd.DataFrame({"status": ["FINISHED"] * 4, "params": control + arm})
    assert grouping_params(frame) == ["model_overrides.mesh_router_init"]
    # a second arm sets another key of the same mapping: each arm's key is unset in the other's runs
    other = [{"seed": str(s), "model_overrides.mesh_router_norm": "rmsnorm", "optim.lr": "0.004"} for s in (12, 13)]
    three = pd.DataFrame({"status": ["FINISHED"] * 6, "params": control + arm + other})
    assert grouping_params(three) == ["model_overrides.mesh_router_init", "model_overrides.mesh_router_norm"]
    assert grouping_params(pd.DataFrame({"status": ["FINISHED"] * 4, "params": arm + other})) == [
        "model_overrides.mesh_router_init",
        "model_overrides.mesh_router_norm",
    ]
    label = overrides_label({**control[0], "model_overrides.mesh_router_init": ""}, grouping_params(frame))
    assert label == ""  # the control's row is MeSH's own label


# --- what a run is called: MLflow name, params, folder -------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        (["scheme=mesh"], "mesh B5 s0 · tiny 1+2R2+1"),  # B left to K+3
        (["scheme=mesh", "buffer_slots=3", "layout=1+2R3+1", "seed=2"], "mesh B3 s2 · tiny 1+2R3+1"),
        (["scheme=base"], "base s0 · tiny 1+2R2+1"),
        (["scheme=anchor*", "seed=1"], "anchor_emb s1 · tiny 1+2R2+1"),
        (["scheme=vanilla"], "vanilla s0 · tiny 6"),  # the plain model at the compute depth
        (["scheme=base", "layout=6"], "vanilla s0 · tiny 6"),
    ],
)
def test_run_name_starts_with_what_differs(tmp_path, overrides, name):
    planned = plan(tmp_path, *overrides)
    assert run_name(planned.model_config, planned.config["seed"]) == name


def test_vanilla_is_named_vanilla_and_keeps_its_hash(tmp_path):
    vanilla = plan(tmp_path, "scheme=vanilla")
    assert vanilla.run_dir.name == f"tiny-6-vanilla-s0-{vanilla.config_hash[:8]}"
    # The hash is the model's: the plain model computes as scheme base at depth 6, as before.
    assert identity_fields(vanilla.config, vanilla.model_config)["model"]["scheme"] == "base"
    assert vanilla.config_hash == plan(tmp_path, "scheme=base", "layout=6").config_hash
    params = model_params(vanilla.model_config)
    assert params["model_config.scheme"] == "vanilla" and params["model_config.layout"] == "6"
    assert params["model_config.buffer_slots"] == ""
    mesh = plan(tmp_path, "scheme=mesh")
    assert model_params(mesh.model_config)["model_config.buffer_slots"] == "5"  # the effective B, K+3
    assert mesh.run_dir.name == f"tiny-1+2R2+1-mesh-B5-s0-{mesh.config_hash[:8]}"


def test_a_run_keeps_the_folder_an_earlier_naming_gave_it(tmp_path):
    """Stores written before vanilla was named so hold ``<preset>-<depth>-base-s<seed>-<hash8>``:
    the same run (same seed and hash) finds its result there instead of training again."""
    cfg = compose_config([f"runs_dir={tmp_path}", "scheme=vanilla", "seed=1"])
    new = plan_run(cfg).run_dir
    digest = new.name.rsplit("-", 1)[1]
    experiment = new.parent
    for decoy in (f"tiny-6-base-s0-{digest}", "tiny-6-base-s1-0123abcd"):  # another seed, another hash
        (experiment / decoy).mkdir(parents=True)
    assert plan_run(cfg).run_dir == new

    old = experiment / f"tiny-6-base-s1-{digest}"
    old.mkdir()
    finished = {"val_loss": 4.25, "run_dir": str(old), "steps": 7}
    (old / "result.json").write_text(json.dumps(finished))
    assert plan_run(cfg).run_dir == old
    assert train(cfg) == finished  # found finished: nothing trains, no new folder
    assert not new.exists()

    new.mkdir()  # once the new folder exists, it is the run's
    assert plan_run(cfg).run_dir == new


ONE_PASS = Path(__file__).resolve().parents[1] / "results" / "cpu-reproduction" / "one-pass"
# What results/cpu-reproduction/one-pass/run.sh passed to every cell (lr_args from lr/lr.csv)
ONE_PASS_ARGS = (
    "model=tiny",
    "data=docs",
    "max_steps=2500",
    "val_every=125",
    "checkpoint_every=250",
    "+optim.lr_by_scheme.anchor=0.008",
    "+optim.lr_by_scheme.anchor_emb=0.008",
    "+optim.lr_by_scheme.base=0.004",
    "+optim.lr_by_scheme.mesh=0.004",
    "+optim.lr_by_scheme.vanilla=0.004",
    "optim.lr=0.004",
)


@pytest.mark.parametrize("grid", ["schemes", "k3", "skip_combos"])
def test_every_committed_one_pass_run_keeps_its_hash(tmp_path, grid):
    """Settings added after these runs (MeSH's router options, optim.router_lr_scale, the arm group)
    leave them the same runs: the hash of each committed run, recomputed from its cell, is the one it
    was logged with."""
    runs = pd.read_csv(ONE_PASS / grid / "runs.csv")
    assert len(runs) >= 18
    for row in runs.itertuples():
        layout = [] if row.scheme == "vanilla" else [f"layout={row.layout}"]
        cell = plan(tmp_path, *ONE_PASS_ARGS, f"scheme={row.scheme}", *layout, f"seed={row.seed}")
        assert cell.config_hash == row.config_hash, (row.scheme, row.seed)


@pytest.mark.parametrize(("arm", "spelled_out"), [("mesh", ["scheme=mesh"]), ("anchor", ["scheme=anchor"])])
def test_an_arm_is_the_run_its_keys_spell_out(tmp_path, arm, spelled_out):
    assert plan(tmp_path, f"arm={arm}").config_hash == plan(tmp_path, *spelled_out).config_hash
    own_slot = plan(tmp_path, "arm=mesh_own_slot")
    by_hand = ["scheme=mesh", "+model_overrides.mesh_router_init=own_slot"]
    assert own_slot.config_hash == plan(tmp_path, *by_hand).config_hash != plan(tmp_path, "arm=mesh").config_hash


def test_mesh_only_settings_apply_to_mesh_runs_alone():
    from experiments.identity import applies_to

    assert applies_to("model_overrides.mesh_router_z_coef", "mesh")
    assert not applies_to("model_overrides.mesh_router_z_coef", "base")
    assert not applies_to("model_overrides.mesh_final_read", "anchor_emb")
    assert not applies_to("model_overrides.mesh_router_norm", "vanilla")
    assert applies_to("optim.lr", "base") and applies_to("model_overrides.n_heads", "base")
