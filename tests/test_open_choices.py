"""The open-choices screen's declared rule (results/cpu-reproduction/one-pass/open_choices.py, the
study's own script, outside the library) on runs whose answer is known."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

_SCRIPT = Path(__file__).resolve().parent.parent / "results" / "cpu-reproduction" / "one-pass" / "open_choices.py"
_spec = importlib.util.spec_from_file_location("open_choices", _SCRIPT)
open_choices = importlib.util.module_from_spec(_spec)
sys.modules["open_choices"] = open_choices  # its dataclasses look their module up there
_spec.loader.exec_module(open_choices)
arm_of, evaluate_screen, main, selected = (
    open_choices.arm_of,
    open_choices.evaluate_screen,
    open_choices.main,
    open_choices.selected,
)

SEEDS = (12, 13, 14)
ROWS = {  # arm -> (scheme, overrides, final PPL per seed, f_K coefficient at the end per seed)
    "mesh": ("mesh", "optim.router_lr_scale=1.0", (60.0, 62.0, 56.0), (0.12, 0.05, 0.30)),
    "mesh_own_slot": (
        "mesh",
        "model_overrides.mesh_router_init=own_slot optim.router_lr_scale=1.0",
        (63.0, 61.0, 57.0),
        (0.01, 0.02, 0.01),
    ),
    "mesh_router_lr": ("mesh", "optim.router_lr_scale=0.1", (57.0, 60.0, 55.0), (0.2, 0.2, 0.2)),
    "mesh_rmsnorm": (
        "mesh",
        "model_overrides.mesh_router_norm=rmsnorm optim.router_lr_scale=1.0",
        (59.0, 61.5, 55.9),
        (0.2, 0.2, 0.2),
    ),
    "mesh_z_loss": (
        "mesh",
        "model_overrides.mesh_router_z_coef=0.001 optim.router_lr_scale=1.0",
        (58.0, 60.0, 54.0),
        (0.2, 0.2, 0.2),
    ),
    "frozen_routing": ("0.2*core+residual", "", (50.0, 50.0, 50.0), (0.2, 0.2, 0.2)),
    "base": ("base", "", (57.0, 57.0, 57.0), (1.0, 1.0, 1.0)),
}


def _frames():
    runs, routing = [], []
    for arm, (scheme, overrides, ppls, fks) in ROWS.items():
        for seed, ppl, fk in zip(SEEDS, ppls, fks, strict=True):
            run_id = f"{arm}-{seed}"
            runs.append(
                {
                    "run_id": run_id,
                    "status": "FINISHED",
                    "scheme": scheme,
                    "overrides": overrides,
                    "seed": seed,
                    "val/docs/ppl": ppl,
                }
            )
            for step, entropy in ((250, 0.01), (2500, 0.3)):
                routing.append(
                    {
                        "run_id": run_id,
                        "seed": seed,
                        "step": step,
                        "metric": "routing/loop2/read/entropy",
                        "value": entropy,
                    }
                )
                routing.append(
                    {
                        "run_id": run_id,
                        "seed": seed,
                        "step": step,
                        "metric": "routing/coef/coda/f2/mean",
                        "value": fk if step == 2500 else 0.5,
                    }
                )
                routing.append(
                    {"run_id": run_id, "seed": seed, "step": step, "metric": "routing/coef/coda/f1/mean", "value": 0.9}
                )
    runs.append(
        {"run_id": "failed", "status": "FAILED", "scheme": "mesh", "overrides": "", "seed": 15, "val/docs/ppl": 1e9}
    )
    return pd.DataFrame(runs), pd.DataFrame(routing)


def _paired(arm: str) -> float:
    return sum(math.log(a / c) for a, c in zip(ROWS[arm][2], ROWS["mesh"][2], strict=True)) / 3


def test_d_is_the_mean_paired_log_ppl_difference_and_the_best_two_below_minus_one_percent_are_selected():
    results = {r.arm: r for r in evaluate_screen(*_frames())}
    assert list(results) == [
        "mesh",
        "mesh_own_slot",
        "mesh_router_lr",
        "mesh_rmsnorm",
        "mesh_z_loss",
        "frozen_routing",
        "base",
    ]
    for arm in ("mesh_own_slot", "mesh_router_lr", "mesh_rmsnorm", "mesh_z_loss"):
        assert results[arm].d == pytest.approx(_paired(arm))
    assert results["mesh"].d is None and results["base"].d is None
    # rmsnorm is better than the control, but by less than 1%; frozen routing is a diagnostic, never selected
    assert -0.01 < results["mesh_rmsnorm"].d < 0 and results["frozen_routing"].d < -0.1
    assert [r.arm for r in selected(list(results.values()))] == ["mesh_z_loss", "mesh_router_lr"]
    assert results["mesh_router_lr"].vs["base"] == pytest.approx(
        sum(math.log(p / 57.0) for p in ROWS["mesh_router_lr"][2]) / 3
    )


def test_the_readouts_collapse_and_entropy():
    results = {r.arm: r for r in evaluate_screen(*_frames())}
    assert results["mesh"].fk == dict(zip(SEEDS, ROWS["mesh"][3], strict=True)) and results["mesh"].collapsed == 1
    assert results["mesh_own_slot"].collapsed == 3 and results["mesh_router_lr"].collapsed == 0
    assert results["mesh"].read_early == dict.fromkeys(SEEDS, 0.01) and results["mesh"].read_end == dict.fromkeys(
        SEEDS, 0.3
    )


def test_rows_map_to_arms_by_their_settings():
    assert arm_of("mesh", "optim.router_lr_scale=1.0") == "mesh"
    assert arm_of("mesh", "") == "mesh"
    assert arm_of("mesh", "optim.warmup_fraction=0.1 optim.router_lr_scale=1.0") == "mesh_warmup"
    assert arm_of("mesh", "model_overrides.mesh_final_read=residual") == "mesh_residual_read"
    assert arm_of("0.2*core+residual", "") == "frozen_routing" and arm_of("vanilla", "") is None
    with pytest.raises(ValueError, match="several arms"):
        arm_of("mesh", "optim.router_lr_scale=0.1 model_overrides.mesh_router_norm=rmsnorm")


def test_the_command_writes_decision_md_and_refuses_a_screen_without_its_control(tmp_path, capsys):
    runs, routing = _frames()
    runs.to_csv(tmp_path / "runs.csv", index=False)
    routing.to_csv(tmp_path / "routing.csv", index=False)
    assert main([str(tmp_path)]) == 0
    text = (tmp_path / "decision.md").read_text()
    assert "| `mesh_z_loss` **selected** |" in text and "**Selected for stage B**: `mesh_z_loss`" in text
    assert "| `mesh` | 59.33 ± 3.06 (60.00, 62.00, 56.00) | control |" in text
    assert (tmp_path / "selected.txt").read_text() == "mesh_z_loss\nmesh_router_lr\n"
    runs[runs["scheme"] != "mesh"].to_csv(tmp_path / "runs.csv", index=False)
    capsys.readouterr()
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "error: the control arm (mesh) has no finished run"


def test_the_confirmation_reads_out_each_arm_without_a_control_paired_on_common_seeds(tmp_path, capsys):
    runs, routing = _frames()
    stage_b = runs[runs["overrides"].str.contains("z_coef") | (runs["scheme"] == "base")]
    anchor = [  # anchor on two of the three seeds: vs anchor pairs on those two
        {
            "run_id": f"anchor-{s}",
            "status": "FINISHED",
            "scheme": "anchor",
            "overrides": "",
            "seed": s,
            "val/docs/ppl": p,
        }
        for s, p in ((12, 50.0), (13, 55.0))
    ]
    pd.concat([stage_b, pd.DataFrame(anchor)]).to_csv(tmp_path / "runs.csv", index=False)
    routing.to_csv(tmp_path / "routing.csv", index=False)
    assert main([str(tmp_path), "--confirmation"]) == 0
    assert not (tmp_path / "decision.md").exists() and not (tmp_path / "selected.txt").exists()
    results = {r.arm: r for r in evaluate_screen(pd.read_csv(tmp_path / "runs.csv"), routing, control=False)}
    assert list(results) == ["mesh_z_loss", "base", "anchor"] and results["mesh_z_loss"].d is None
    z = ROWS["mesh_z_loss"][2]
    assert results["mesh_z_loss"].vs["base"] == pytest.approx(sum(math.log(p / 57.0) for p in z) / 3)
    assert results["mesh_z_loss"].vs["anchor"] == pytest.approx((math.log(z[0] / 50.0) + math.log(z[1] / 55.0)) / 2)
    text = (tmp_path / "readouts.md").read_text()
    vs_anchor = math.expm1((math.log(z[0] / 50.0) + math.log(z[1] / 55.0)) / 2) * 100
    assert (
        f"| `mesh_z_loss` | 3 | 57.33 ± 3.06 | {math.expm1(results['mesh_z_loss'].vs['base']) * 100:+.1f}% | {vs_anchor:+.1f}% |"
        in text
    )
    assert "| `anchor` | 2 | 52.50 ± 3.54 |" in text
