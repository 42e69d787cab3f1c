"""Every committed config keeps its run hash: each preset under each of the paper's schemes, and
every cell of every committed sweep file (a search's shared config), planned as ``mesh-train``
plans them, hash to the values in ``run_hashes.json``, recorded before the run's config was made
one typed object. A change that moves a hash makes runs already in a store look new."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.compose import compose_config
from experiments.plan import plan_run
from mesh_model import PRESETS
from mesh_model.scheme_names import PAPER_SCHEMES
from sweeps.catalogue import sweep_names
from sweeps.grid import expand_cells

PINNED = json.loads((Path(__file__).parent / "run_hashes.json").read_text())
SEARCH_BASE = "(search base)"


def run_hash(tmp_path, *overrides: str) -> str:
    return plan_run(compose_config([*overrides, f"runs_dir={tmp_path}", "allow_large=true"])).config_hash


def test_every_preset_under_every_scheme_keeps_its_hash(tmp_path):
    expected = PINNED["presets"]
    assert set(expected) == {f"{preset}/{scheme}" for preset in PRESETS for scheme in PAPER_SCHEMES}
    found = {key: run_hash(tmp_path, f"model={key.split('/')[0]}", f"scheme={key.split('/')[1]}") for key in expected}
    assert found == expected


def test_every_committed_sweep_is_pinned():
    assert set(PINNED["sweeps"]) == set(sweep_names())


@pytest.mark.parametrize("name", sorted(PINNED["sweeps"]))
def test_every_cell_of_a_committed_sweep_keeps_its_hash(tmp_path, name):
    expected = PINNED["sweeps"][name]
    if SEARCH_BASE in expected:  # a search: no grid, its trials vary around one config
        assert run_hash(tmp_path, f"+sweep={name}") == expected[SEARCH_BASE]
        return
    cells = expand_cells(name, [], [])
    assert [cell.label for cell in cells] == list(expected)
    assert {cell.label: run_hash(tmp_path, *cell.overrides) for cell in cells} == expected
