"""One definition of a run's identity: the hash comes from the resolved model and the keys that
change the computation; the results tables group runs with the same definition."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.compose import compose_config
from experiments.identity import RUN_INVARIANT_KEYS, changes_computation, distinguishes_rows
from experiments.plan import plan_run
from results.collect import grouping_params


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
