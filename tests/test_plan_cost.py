"""--plan's cost: CPU core-hours and the ETA from the cores a cell really computes on."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest

from experiments.budget import flop_seconds, run_cost
from results.commands.seeds_auto import cores_per_cell, grid_arms, print_plan
from sweeps.packing import usable_cores


def test_local_cells_share_the_machine_and_the_eta_is_core_hours_over_its_cores(tmp_path):
    rest = ["model=tiny", "scheme=base,mesh", f"runs_dir={tmp_path}", "max_steps=300"]
    _, plans, launch = grid_arms("schemes", rest)
    cores = usable_cores()
    # launcher=auto runs one cell per core, whatever resources.cpus_per_task (a SLURM setting) says.
    assert launch.resources.cpus_per_task == 2
    assert cores_per_cell(launch) == max(1, cores // launch.launcher.concurrency)

    out = io.StringIO()
    assert print_plan("schemes", rest, out=out) == 0
    line = next(x for x in out.getvalue().splitlines() if x.strip().startswith("mesh_below_base"))
    # The cost is the sequential design's: at its cap, not at the fixed-n count printed before it.
    n, cpu_h, eta, unit = re.search(
        r"a cap of (\d+) under the sequential design .* at \1 seeds ([\d.]+) CPU-h, ETA ([\d.]+) (h|min)", line
    ).groups()
    eta_h = float(eta) / (60 if unit == "min" else 1)
    # The FLOP model at the cell's cores, for 2 arms of n seeds; core-hours do not depend on the cores.
    per_run = flop_seconds(plans[0].model_config, plans[0].budget, cores_per_cell(launch))
    # The same FLOPs as the estimate mesh-sweep prints before planning (experiments.budget.run_cost).
    same_run = run_cost(plans[0].model_config, plans[0].budget, False, 4, plans[0].config["checkpoint_every"])
    assert per_run * cores_per_cell(launch) == pytest.approx(same_run.hours * 3600)
    assert float(cpu_h) == float(f"{per_run * cores_per_cell(launch) * int(n) * 2 / 3600:.3g}")
    assert abs(eta_h - float(cpu_h) / (cores_per_cell(launch) * launch.launcher.concurrency)) <= 0.06 * eta_h


def test_a_cell_sent_to_slurm_computes_on_its_allocation():
    resources = SimpleNamespace(cpus_per_task=4, tasks=2, nodes=3)
    slurm = SimpleNamespace(memory_limit=lambda r: object(), concurrency=10)
    assert cores_per_cell(SimpleNamespace(launcher=slurm, resources=resources)) == 24
