"""A grid plans each distinct config once: cells that differ only in their seed share its checks."""

import pytest

import sweeps.grid as grid
from experiments.compose import compose_config
from experiments.plan import InputError, plan_run, with_seed
from sweeps.grid import expand_cells, grid_cells, plan_where_it_runs, read_request


def test_plans_derived_per_seed_equal_plans_made_whole(tmp_path):
    launch, overrides, _ = read_request("buffer_slots", ["seeds=[0,3,11]", f"runs_dir={tmp_path}"])
    cells = expand_cells("buffer_slots", overrides, launch.seeds)
    whole = [plan_where_it_runs(compose_config(c.overrides), launch) for c in cells]
    derived = grid.plan_cells(cells, launch)
    assert len(derived) == len(whole) == 12
    for a, b in zip(derived, whole, strict=True):
        assert a == b  # config, hash, run folder, memory estimate, budget: every field
    assert len({p.config_hash for p in derived}) == 12 and len({p.run_dir for p in derived}) == 12


def test_a_grid_of_thousands_of_seeds_composes_each_config_once(tmp_path, monkeypatch):
    composed = []

    def counting(overrides, *args, **kwargs):
        composed.append(tuple(overrides))
        return compose_config(overrides, *args, **kwargs)

    monkeypatch.setattr(grid, "compose_config", counting)
    launch, overrides, _ = read_request("schemes", ["seeds=500", f"runs_dir={tmp_path}"])
    composed.clear()
    cells, plans = grid_cells("schemes", overrides, launch)
    assert len(cells) == len(plans) == 3000
    assert len(composed) == 6 + 1  # the six schemes, and expand_cells' one read of the sweep file
    for cell, plan in zip(cells, plans, strict=True):  # each cell got the plan of its own seed
        assert f"seed={plan.config['seed']}" in cell.overrides
    assert {p.config["seed"] for p in plans} == set(range(500))


def test_with_seed_checks_the_seed_as_planning_does(tmp_path):
    plan = plan_run(compose_config([f"runs_dir={tmp_path}"]))
    assert with_seed(plan, 7) == plan_run(compose_config([f"runs_dir={tmp_path}", "seed=7"]))
    with pytest.raises(InputError, match=r"^seed=4294967296 is invalid: seeds are integers from 0 to 4294967295$"):
        with_seed(plan, 2**32)
