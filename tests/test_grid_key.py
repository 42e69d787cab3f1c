"""A grid is found from its store whatever path names the store, and a command that names no
grid that ran lists the ones that did, ready to paste."""

import os

import pytest

from sweeps.grid import SweepError, grid_cells, grid_key, read_request, sweep_dir_for
from sweeps.parent import COMMAND_FILE, ParentRun, grids_in
from sweeps.status import find_grid

SMALL = ["scheme=base,mesh", "seeds=2", "max_steps=20"]


def key_of(arguments):
    launch, overrides, _ = read_request("schemes", arguments)
    cells, plans = grid_cells("schemes", overrides, launch)
    return grid_key("schemes", plans), cells, plans


def test_the_key_is_what_the_grid_computes_not_where_its_store_lives(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()
    os.symlink(tmp_path / "store", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    absolute = key_of([*SMALL, f"runs_dir={tmp_path / 'store'}"])[0]
    assert key_of([*SMALL, "runs_dir=store"])[0] == absolute  # relative
    assert key_of([*SMALL, "runs_dir=link"])[0] == absolute  # another path to the same folder
    assert key_of([*SMALL, "runs_dir=store", "checkpoint_every=5", "log_every=2"])[0] == absolute
    by_tokens = ["scheme=base,mesh", "seeds=2", "tokens=40960", "runs_dir=store"]  # 20 steps x 2,048 tokens
    assert key_of(by_tokens)[0] == absolute
    assert key_of([*SMALL, "runs_dir=store", "max_steps=21"])[0] != absolute
    assert key_of(["scheme=base,mesh", "seeds=3", "max_steps=20", "runs_dir=store"])[0] != absolute


def test_status_of_a_grid_that_never_ran_lists_the_grids_that_did(tmp_path):
    runs = tmp_path / "runs"
    ran = [*SMALL, f"runs_dir={runs}"]
    key, cells, plans = key_of(ran)
    command = "mesh-sweep schemes " + " ".join(ran)
    ParentRun.open("schemes", key, plans[0], sweep_dir_for(plans[0], key), cells, {}, {"command": command})
    assert (sweep_dir_for(plans[0], key) / COMMAND_FILE).read_text().strip() == command
    assert grids_in(sweep_dir_for(plans[0], key).parent, "schemes") == [(key, command)]
    assert find_grid("schemes", ran).key == key  # the grid itself is found
    with pytest.raises(SweepError) as error:
        find_grid("schemes", ["seeds=3", f"runs_dir={runs}"])  # the defaults: another grid
    message = str(error.value)
    assert message.startswith("no runs of this grid (18 cells, key schemes-")
    assert message.endswith(f"but 1 other schemes grid(s) ran there (newest first): `{command} --status`")
    with pytest.raises(SweepError, match=r"^no runs of this grid yet \(4 cells, .*start it with `"):
        find_grid("schemes", [*SMALL, f"runs_dir={tmp_path / 'empty'}"])
