"""The z-loss LR grid's declared rule (results/cpu-reproduction/one-pass/z_loss_lr.py, the study's own
script, as sweeps/conf/sweep/z_loss_lr.yaml declares it) on runs whose answer is known."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

_SCRIPT = Path(__file__).resolve().parent.parent / "results" / "cpu-reproduction" / "one-pass" / "z_loss_lr.py"
_spec = importlib.util.spec_from_file_location("z_loss_lr", _SCRIPT)
z_loss_lr = importlib.util.module_from_spec(_spec)
sys.modules["z_loss_lr"] = z_loss_lr  # its dataclasses look their module up there
_spec.loader.exec_module(z_loss_lr)

SEEDS = range(500, 506)
BASE = [60.0, 61.0, 59.5, 60.5, 62.0, 60.2]


def runs(low_fk, high_fk, low_ppl, high_ppl, extra=()) -> pd.DataFrame:
    """A report's runs.csv: base, and the z-loss arm at 4e-3 and 8e-3, one run per seed."""
    records = []
    for seed, b, lf, hf, lp, hp in zip(SEEDS, BASE, low_fk, high_fk, low_ppl, high_ppl, strict=True):
        common = {"status": "FINISHED", "seed": seed, z_loss_lr.FK: math.nan}
        records.append({**common, "scheme": "base", "overrides": "optim.lr_by_scheme.mesh=0.004", z_loss_lr.PPL: b})
        for lr, fk, ppl in (("0.004", lf, lp), ("0.008", hf, hp)):
            overrides = f"model_overrides.mesh_router_z_coef=0.001 optim.lr_by_scheme.mesh={lr}"
            records.append({**common, "scheme": "mesh", "overrides": overrides, z_loss_lr.PPL: ppl, z_loss_lr.FK: fk})
    return pd.DataFrame.from_records([*records, *extra])


HEALTHY, COLLAPSED = [0.25, 0.3, 0.22, 0.28, 0.26, 0.24], [0.01, 0.02, 0.03, 0.01, 0.05, 0.2]
LOW_PPL = [59.0, 60.5, 59.0, 60.0, 61.0, 59.8]
HIGH_PPL = [63.0, 64.0, 62.5, 63.8, 65.0, 63.1]  # 5% worse on every seed


def test_collapse_at_the_high_lr_only_comes_with_the_lr_and_with_the_loss(tmp_path):
    found = z_loss_lr.rows(runs(HEALTHY, COLLAPSED, LOW_PPL, HIGH_PPL))
    low, high = found["z-loss at 0.004"], found["z-loss at 0.008"]
    assert (low.collapsed, high.collapsed) == (0, 5)  # 0.2 is not below 0.1
    assert z_loss_lr.reading(low, high) == z_loss_lr.WITH_LR
    # the paired interval is scipy's one-sample t interval of the log differences
    diffs = np.log(HIGH_PPL) - np.log(LOW_PPL)
    interval = z_loss_lr.paired_interval(high.ppl, low.ppl)
    expected = stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert (interval.mean, interval.low, interval.high) == pytest.approx((diffs.mean(), *expected))
    folder = tmp_path / "z_loss_lr"
    folder.mkdir()
    runs(HEALTHY, COLLAPSED, LOW_PPL, HIGH_PPL).to_csv(folder / "runs.csv", index=False)
    assert z_loss_lr.main([str(folder)]) == 0
    text = (folder / "decision.md").read_text()
    assert "**Reading**: the collapse comes with the LR (collapsed: 0/6 at 4e-3, 5/6 at 8e-3)" in text
    assert (
        "**Collapse and loss together**: yes: 8e-3 collapses, 4e-3 does not, and the 8e-3 - 4e-3 interval excludes 0"
        " (the collapsed LR's PPL is the higher)" in text
    )
    # the other way round: 4e-3 collapses and 8e-3, which does not, is worse
    flipped = z_loss_lr.render(z_loss_lr.rows(runs(COLLAPSED, HEALTHY, LOW_PPL, HIGH_PPL)))
    assert (
        "4e-3 collapses, 8e-3 does not, and the 8e-3 - 4e-3 interval excludes 0 (the collapsed LR's PPL is the lower)"
        in flipped
    )
    assert f"| z-loss at 0.008 | 6 | {np.mean(HIGH_PPL):.2f} (" in text


@pytest.mark.parametrize(
    ("low_fk", "high_fk", "expected"),
    [
        (COLLAPSED, COLLAPSED, "the collapse comes with the z-loss arm whatever the LR"),
        (HEALTHY, HEALTHY, "no collapse at either LR"),
        ([0.01, 0.01, 0.3, 0.3, 0.3, 0.3], COLLAPSED, "not separated at these seeds"),  # 2 of 6 at 4e-3
        (COLLAPSED, HEALTHY, "not separated at these seeds"),  # the other way round: not the declared LR reading
    ],
)
def test_the_declared_readings(low_fk, high_fk, expected):
    found = z_loss_lr.rows(runs(low_fk, high_fk, LOW_PPL, HIGH_PPL))
    assert z_loss_lr.reading(found["z-loss at 0.004"], found["z-loss at 0.008"]) == expected


def test_loss_together_is_read_either_way_round_and_not_when_the_interval_covers_zero():
    noisy = [58.0, 64.0, 57.0, 66.0, 59.0, 63.0]  # around LOW_PPL, both signs
    text = z_loss_lr.render(z_loss_lr.rows(runs(COLLAPSED, HEALTHY, LOW_PPL, noisy)))
    assert (
        "**Collapse and loss together**: not shown: 4e-3 collapses, 8e-3 does not, and the 8e-3 - 4e-3 interval covers 0"
        in text
    )
    text = z_loss_lr.render(z_loss_lr.rows(runs(COLLAPSED, COLLAPSED, LOW_PPL, HIGH_PPL)))
    assert "**Collapse and loss together**: not read: no LR collapses while the other does not" in text


def test_short_rows_are_not_read_and_bad_grids_stop_with_one_line(tmp_path, capsys):
    frame = runs(HEALTHY, COLLAPSED, LOW_PPL, HIGH_PPL)
    frame.loc[frame.index[-1], "status"] = "FAILED"  # seed 505 at 8e-3
    found = z_loss_lr.rows(frame)
    assert z_loss_lr.reading(found["z-loss at 0.004"], found["z-loss at 0.008"]).startswith(
        "not read: a row is short of its seeds (5 of 6 seeds at both LRs)"
    )
    stray = {"status": "FINISHED", "seed": 500, "scheme": "mesh", z_loss_lr.PPL: 60.0, z_loss_lr.FK: 0.2}
    with pytest.raises(ValueError, match="a z-loss run at LR 0.002: the grid declares 0.004 and 0.008"):
        z_loss_lr.rows(
            runs(
                HEALTHY,
                HEALTHY,
                LOW_PPL,
                HIGH_PPL,
                [{**stray, "overrides": "model_overrides.mesh_router_z_coef=0.001 optim.lr_by_scheme.mesh=0.002"}],
            )
        )
    folder = tmp_path / "empty"
    folder.mkdir()
    frame[frame["scheme"] == "base"].to_csv(folder / "runs.csv", index=False)
    assert z_loss_lr.main([str(folder)]) == 2
    assert capsys.readouterr().err.strip() == "error: no finished run of z-loss at 0.004, z-loss at 0.008 in these runs"
