"""The size_lr study's declared rule (results/cpu-reproduction/one-pass/size_lr.py, as
sweeps/conf/sweep/size_lr.yaml declares it) on report folders whose answer is known."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

_SCRIPT = Path(__file__).resolve().parent.parent / "results" / "cpu-reproduction" / "one-pass" / "size_lr.py"
_spec = importlib.util.spec_from_file_location("size_lr", _SCRIPT)
size_lr = importlib.util.module_from_spec(_spec)
sys.modules["size_lr"] = size_lr  # its dataclasses look their module up there
_spec.loader.exec_module(size_lr)

SEEDS = (300, 301, 302)
OVERRIDES = {"mesh_residual_read": "model_overrides.mesh_final_read=residual", "mesh": "", "base": ""}
POINT = {  # the size point as declared: final validation losses per arm and seed (anchors at 8e-3)
    "base": [3.74, 3.78, 3.75],
    "mesh": [3.65, 3.79, 3.64],
    "mesh_residual_read": [3.62, 3.67, 3.65],
    "anchor": [4.16, 4.10, 3.91],
    "anchor_emb": [4.14, 4.17, 4.03],
}


def folder(tmp_path: Path, name: str, losses: dict[str, list[float]]) -> Path:
    """A report folder whose runs.csv holds one FINISHED run per arm and seed."""
    records = []
    for arm, values in losses.items():
        scheme = "mesh" if arm.startswith("mesh") else arm
        for seed, loss in zip(SEEDS, values, strict=True):
            records.append(
                {
                    "run_id": f"{name}-{arm}-{seed}",
                    "status": "FINISHED",
                    "scheme": scheme,
                    "seed": seed,
                    "val_loss": loss,
                    "overrides": OVERRIDES.get(arm, ""),
                }
            )
    path = tmp_path / name
    path.mkdir()
    pd.DataFrame.from_records(records).to_csv(path / "runs.csv", index=False)
    return path


def one_lr(anchor: list[float], anchor_emb: list[float]) -> dict[str, list[float]]:
    return {
        **{k: v for k, v in POINT.items() if not k.startswith("anchor")},
        "anchor": anchor,
        "anchor_emb": anchor_emb,
    }


def test_anchors_better_at_4e3_on_every_seed_read_as_the_lr(tmp_path):
    high = folder(tmp_path, "size", POINT)
    low = folder(tmp_path, "one_lr", one_lr([3.70, 3.72, 3.69], [3.71, 3.75, 3.70]))
    assert size_lr.main([str(high), str(low)]) == 0
    text = (low / "decision.md").read_text()
    anchor_line = next(line for line in text.splitlines() if line.startswith("| anchor |"))
    assert anchor_line.endswith(f"| {size_lr.WITH_LR} |")
    deltas = np.array([3.70, 3.72, 3.69]) - np.array(POINT["anchor"])
    ci = stats.ttest_1samp(deltas, 0).confidence_interval(0.95)
    assert f"{deltas.mean():+.4f} [{ci.low:+.4f}, {ci.high:+.4f}] (n = 3" in anchor_line
    assert f"{math.expm1(deltas.mean()) * 100:+.1f}% PPL" in anchor_line
    # the point read again at one LR: MeSH - anchor from the 4e-3 folder, beside the 8e-3 one
    gap_line = next(line for line in text.splitlines() if line.startswith("| mesh - anchor |"))
    at_one = np.array(POINT["mesh"]) - np.array([3.70, 3.72, 3.69])
    at_high = np.array(POINT["mesh"]) - np.array(POINT["anchor"])
    assert gap_line.startswith(f"| mesh - anchor | {at_one.mean():+.4f} [")
    assert f"| {at_high.mean():+.4f} [" in gap_line


@pytest.mark.parametrize(
    ("anchor", "reading"),
    [
        ([4.30, 4.25, 4.05], size_lr.NOT_WITH_LR),  # worse at 4e-3 on every seed
        ([4.00, 4.20, 3.90], size_lr.NOT_SEPARATED),  # better on one, worse on another
    ],
)
def test_the_other_readings(tmp_path, anchor, reading):
    changes = size_lr.decide(folder(tmp_path, "size", POINT), folder(tmp_path, "one_lr", one_lr(anchor, anchor)))
    assert next(line for line in changes.splitlines() if line.startswith("| anchor |")).endswith(f"| {reading} |")


def test_a_seed_short_is_not_read(tmp_path):
    low = one_lr([3.70, 3.72, 3.69], [3.71, 3.75, 3.70])
    low_path = folder(tmp_path, "one_lr", low)
    frame = pd.read_csv(low_path / "runs.csv")
    frame = frame[~((frame.scheme == "anchor") & (frame.seed == 302))]
    frame.to_csv(low_path / "runs.csv", index=False)
    text = size_lr.decide(folder(tmp_path, "size", POINT), low_path)
    line = next(line for line in text.splitlines() if line.startswith("| anchor |"))
    assert line.endswith(f"| {size_lr.NOT_READ} (2 of 3 seeds at both LRs) |")


def test_a_folder_with_both_lrs_of_an_arm_is_refused_in_one_line(tmp_path, capsys):
    high = folder(tmp_path, "size", POINT)
    both = pd.concat([pd.read_csv(high / "runs.csv")] * 2)
    both["run_id"] = [f"r{i}" for i in range(len(both))]
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    both.to_csv(mixed / "runs.csv", index=False)
    assert size_lr.main([str(high), str(mixed)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {mixed}: arm anchor has 2 runs of seed 300; give a folder with one run per arm and seed "
        "(mesh-results --filter)"
    ]


def test_the_committed_decision_is_what_the_committed_folders_give(monkeypatch):
    # The reproduction README quotes decision.md: it must be the rule applied to the runs.csv files
    # committed beside it (run.sh size-lr-report and make reports write it so), not a copy that drifts.
    repo = _SCRIPT.parents[3]
    monkeypatch.chdir(repo)  # the folders as run.sh names them, from the repository's root
    high, low = (_SCRIPT.parent.relative_to(repo) / "size_tokens" / name for name in ("size", "size_one_lr"))
    assert (low / "decision.md").read_text() == size_lr.decide(high, low)
