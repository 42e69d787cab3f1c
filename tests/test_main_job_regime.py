"""The main job's opening lines (its regime, what the one-pass reproduction found later) and its
plain-text ranking for the terminal."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from test_claims import runs_frame

from results.commands.demo_regime import ONE_PASS, Regime, later_training, later_training_lines
from results.render.answer import answer_lines, opening
from results.render.terminal import summary_lines
from results.rows.aggregate import aggregate
from results.runs.committed import read_runs_csv
from results.verdicts.engine import evaluate
from results.verdicts.schema import load_claims


def test_the_committed_one_pass_numbers_are_read_not_typed():
    runs = pd.read_csv(ONE_PASS / "runs.csv")
    runs = runs[runs["status"] == "FINISHED"]
    found = later_training()
    assert found is not None
    mean = runs.groupby("scheme")["val/docs/ppl"].mean()
    assert found.change("anchor") == pytest.approx(mean["mesh"] / mean["anchor"] - 1)
    assert found.change("base") == pytest.approx(mean["mesh"] / mean["base"] - 1)
    assert found.seeds == runs.groupby("scheme").size().to_dict()
    assert found.mesh_rank_at_end == list(mean.sort_values().index).index("mesh") + 1
    # The curves: MeSH's mean over the seeds every scheme ran is the lowest up to the first
    # crossing and below base's up to a later one (recomputed here from curves.csv directly).
    common = set.intersection(*(set(g["seed"]) for _, g in runs.groupby("scheme")))
    curves = pd.read_csv(ONE_PASS / "curves.csv")
    ids = runs.loc[runs["seed"].isin(common), "run_id"]
    curves = curves[(curves["metric"] == "val/docs/ppl") & curves["run_id"].isin(ids)]
    table = curves.pivot_table(index="tokens", columns="scheme", values="value", aggfunc="mean")
    lowest = table.min(axis=1)
    assert (table.loc[: found.mesh_first_until, "mesh"] == lowest.loc[: found.mesh_first_until]).all()
    later = table.index[table.index > found.mesh_first_until][0]
    assert table.loc[later, "mesh"] > lowest.loc[later]
    assert table.loc[found.mesh_above_base_until, "mesh"] < table.loc[found.mesh_above_base_until, "base"]
    assert (
        table.loc[table.index > found.mesh_above_base_until, "mesh"]
        > table.loc[table.index > found.mesh_above_base_until, "base"]
    ).all()


def _write(folder, finals, curve):
    """runs.csv and curves.csv of a grid: ``finals`` {scheme: [final PPL per seed]}, ``curve``
    {scheme: [mean PPL per validation]} (every seed the same curve)."""
    runs, points = [], []
    for scheme, values in finals.items():
        for seed, value in enumerate(values):
            run_id = f"{scheme}-{seed}"
            runs.append(
                dict(
                    run_id=run_id,
                    status="FINISHED",
                    scheme=scheme,
                    seed=seed,
                    tokens_planned=3000,
                    **{"val/docs/ppl": value},
                )
            )
            for step, ppl in enumerate(curve[scheme], 1):
                points.append(
                    dict(run_id=run_id, scheme=scheme, seed=seed, tokens=1000 * step, metric="val/docs/ppl", value=ppl)
                )
    folder.mkdir()
    pd.DataFrame(runs).to_csv(folder / "runs.csv", index=False)
    pd.DataFrame(points).to_csv(folder / "curves.csv", index=False)
    return folder


def test_a_grid_where_mesh_leads_then_falls_back(tmp_path):
    folder = _write(
        tmp_path / "grid",
        {"base": [50.0, 52.0], "anchor": [40.0, 40.0], "mesh": [55.0, 55.0]},
        {"base": [90.0, 70.0, 51.0], "anchor": [95.0, 60.0, 40.0], "mesh": [80.0, 65.0, 55.0]},
    )
    found = later_training(folder)
    assert found.mesh_first_until == 1000 and found.mesh_above_base_until == 2000
    assert found.change("base") == pytest.approx(55 / 51 - 1) and found.mesh_rank_at_end == 3
    (line,) = found.lines()
    # the decided result, named as another regime's: never "these tokens are the early phase"
    assert line.startswith(
        "The decided result is another regime's, not these runs': the one-pass reproduction "
        "(results/cpu-reproduction/one-pass: docs corpus, 3.0k tokens per run, 2 seeds per scheme, each scheme at its own LR), "
        "where MeSH ended rank 3 of 3 (its mean final PPL +7.8% vs base, +37.5% vs anchor, a ratio of means; "
    )
    assert "lowest mean PPL there until 1.0k tokens and beat base until 2.0k" in line
    assert "early phase" not in line and "These" not in line


def test_without_the_committed_reports_the_line_points_to_them(tmp_path):
    assert later_training(tmp_path) is None
    (line,) = later_training_lines(tmp_path)
    assert "results/cpu-reproduction/one-pass" in line


def test_the_regime_line():
    regime = Regime(("vanilla", "mesh"), 2, 400, 819_200, (200_000, 300_000), 1_600_000, "shakespeare", (0.003,))
    (line,) = regime.lines()
    assert line == (
        "Regime: 2 schemes x 2 seeds (under 3 seeds every test is fragile), 400 steps each = 819k tokens "
        "(2.7-4.1 tokens per non-embedding parameter, 0.51 passes over shakespeare's training split), "
        "one peak LR for every scheme (0.003)."
    )
    three = Regime(("base",), 3, 10, 2_000_000, (1_000_000,), None, "docs", (0.004, 0.008))
    assert three.lines() == [
        "Regime: 1 schemes x 3 seeds, 10 steps each = 2.00M tokens (2.0 tokens per non-embedding parameter), peak LRs 0.004, 0.008."
    ]


def test_the_terminal_ranking_is_plain_ranked_and_five_columns():
    results = aggregate(read_runs_csv(ONE_PASS / "runs.csv"), metric="val_loss")
    lines = summary_lines(results, evaluate(results, load_claims()))
    assert lines[0] == "tiny, compute depth 6: validation PPL (docs), lower is better"
    rows = lines[3:8]
    means = [float(re.search(r"([\d.]+) ± ", line).group(1)) for line in rows]
    assert means == sorted(means) and [line.split()[0] for line in rows] == ["1", "2", "3", "4", "5"]
    assert not any(mark in "\n".join(lines) for mark in ("`", "**", "<u>", "|"))
    (base,) = [line for line in rows if " base " in line]
    assert base.endswith("—  reference")
    (mesh,) = [line for line in rows if line.split()[1] == "mesh"]
    # Δ vs base: the log-PPL paired difference as a ratio, exp(mean Δ log PPL) - 1 over common seeds,
    # with its 95% CI: the same comparison claims.md tests, as report.md's ranking gives it
    runs = results.runs[results.runs["status"] == "FINISHED"]
    logs = {s: dict(zip(g["seed"], np.log(g["val/docs/ppl"]), strict=True)) for s, g in runs.groupby("scheme")}
    common = sorted(set(logs["mesh"]) & set(logs["base"]))
    ratio = math.expm1(np.mean([logs["mesh"][s] - logs["base"][s] for s in common]))
    assert f"{100 * ratio:+.1f}% [" in mesh and "mesh_below_base:" in mesh
    # the columns line up: every row's Δ ends where the header's ends
    ends = {line.index("]") if "]" in line else line.index("—") for line in rows}
    assert len(ends) == 1 and lines[2].index("Δ vs base [95% CI]") + len("Δ vs base [95% CI]") - 1 == ends.pop()


def test_a_verdict_on_two_seeds_says_fragile_in_the_terminal():
    frame = runs_frame(
        {
            ("tiny", "base", "1+2R2+1", ""): {"ppl": [120.0, 121.0, 999.0]},
            ("tiny", "mesh", "1+2R2+1", "5"): {"ppl": [110.0, 112.0, 999.0]},
        }
    )
    frame = frame[frame["seed"] != "2"]
    results = aggregate(frame)
    lines = summary_lines(results, evaluate(results, load_claims()))
    (mesh,) = [line for line in lines if " mesh " in line]
    assert "mesh_below_base:" in mesh and "(n=2, fragile)" in mesh
    assert math.isclose(float(re.search(r"([\d.]+) ± ", mesh).group(1)), 111.0)


def test_this_grids_answer_comes_first_in_words_with_its_n_and_fragile_under_three_seeds():
    frame = runs_frame(
        {
            ("tiny", "base", "1+2R2+1", ""): {"ppl": [120.0, 121.0, 999.0]},
            ("tiny", "anchor", "1+2R2+1", ""): {"ppl": [100.0, 101.0, 999.0]},
            ("tiny", "mesh", "1+2R2+1", "5"): {"ppl": [130.0, 132.0, 999.0]},
        }
    )
    results = aggregate(frame[frame["seed"] != "2"])
    evaluations = evaluate(results, load_claims())
    (line,) = answer_lines(results, evaluations)
    assert line.startswith("What these runs show (tiny, compute depth 6; ")
    assert "lower is better; n = 2 seeds per row): anchor 1+2R2+1 100.5 (first), base 1+2R2+1 120.5, " in line
    assert "mesh 1+2R2+1 B5 131.0 (last). Every test here is fragile at n = 2" in line
    # the outputs open with it, then the grid's context; a report no job described opens as before
    assert opening(results, evaluations, ["decided", "regime"]) == [line, "decided", "regime"]
    assert opening(results, evaluations, []) == []
