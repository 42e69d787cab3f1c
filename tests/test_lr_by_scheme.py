"""optim.lr_by_scheme: every scheme of one grid at its own peak LR, its rows still compared."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.compose import compose_config
from experiments.config import OptimConfig
from experiments.plan import InputError, plan_run
from experiments.tracking import flatten
from mesh_model import ConfigError
from results.rows.frame import grouping_params

BY_SCHEME = [
    "+optim.lr_by_scheme.vanilla=0.002",
    "+optim.lr_by_scheme.anchor_emb=0.001",
    "+optim.lr_by_scheme.mesh=0.004",
]


def _plan(tmp_path, *overrides):
    return plan_run(compose_config(["model=tiny", f"runs_dir={tmp_path}", *overrides]))


def test_each_scheme_gets_its_lr_and_the_others_optim_lr_or_the_presets(tmp_path):
    assert _plan(tmp_path, "scheme=mesh", *BY_SCHEME).peak_lr == 0.004
    assert _plan(tmp_path, "scheme=vanilla", *BY_SCHEME).peak_lr == 0.002
    assert _plan(tmp_path, "scheme=anchor_emb", *BY_SCHEME).peak_lr == 0.001
    assert _plan(tmp_path, "scheme=base", *BY_SCHEME, "optim.lr=0.0025").peak_lr == 0.0025
    assert _plan(tmp_path, "scheme=base", *BY_SCHEME).peak_lr == 0.003  # the tiny preset's


def test_the_mapping_is_part_of_the_run_but_an_empty_one_keeps_the_old_hash(tmp_path):
    plain = _plan(tmp_path, "scheme=mesh")
    assert _plan(tmp_path, "scheme=mesh", "+optim.lr_by_scheme={}").config_hash == plain.config_hash
    assert _plan(tmp_path, "scheme=mesh", *BY_SCHEME).config_hash != plain.config_hash
    # Another scheme's entry changes no computation of base's, but base's runs in the grid carry the
    # same mapping as every other cell, so they are the grid's own runs (and its rows compare).
    assert _plan(tmp_path, "scheme=base", *BY_SCHEME).config_hash != _plan(tmp_path, "scheme=base").config_hash


def test_the_cells_of_a_grid_differ_by_scheme_only_so_their_rows_compare(tmp_path):
    frames = []
    for scheme in ("vanilla", "base", "mesh"):
        plan = _plan(tmp_path, f"scheme={scheme}", *BY_SCHEME)
        params = {**flatten(plan.config), "peak_lr": str(plan.peak_lr)}  # as the run logs them
        frames.append({"status": "FINISHED", "params": params})
    keys = grouping_params(pd.DataFrame(frames))
    assert keys == [], keys  # peak_lr differs but is derived; the mapping is the same in every cell
    assert {f["params"]["peak_lr"] for f in frames} == {"0.002", "0.003", "0.004"}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ({"mseh": 0.004}, "optim.lr_by_scheme='mseh' is invalid: did you mean 'mesh'?"),
        ({"mesh": 0.0}, "optim.lr_by_scheme.mesh=0.0 is invalid: must be a finite number > 0"),
        ({"mesh": float("inf")}, "optim.lr_by_scheme.mesh=inf is invalid: must be a finite number > 0"),
    ],
)
def test_bad_entries_are_refused_in_one_line(mapping, message):
    with pytest.raises(ConfigError) as error:
        OptimConfig(lr_by_scheme=mapping).validate()
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_bad_entry_on_the_command_line_stops_before_compute(tmp_path):
    with pytest.raises(InputError, match=r"optim.lr_by_scheme='mseh' is invalid"):
        _plan(tmp_path, "scheme=mesh", "+optim.lr_by_scheme.mseh=0.004")
    assert not any(tmp_path.iterdir())
