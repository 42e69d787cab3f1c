"""``mesh-sweep GRID seeds=auto`` (stages of seeds, decided by results/stats/sequential.py) and ``--plan``."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import mlflow
import pytest
from helpers import run_tool

from results.stats.comparison import seeds_needed
from results.stats.sequential import PRIOR_SD, PRIOR_SD_SOURCE, Design, sequential_seeds_needed
from sweeps.sweep import main, run_sweep

# The smallest grid cell (tests/conftest.py's GRID_CELL, two steps), without probes.
CELL = [
    "model=tiny",
    "probes.enabled=false",
    "max_steps=2",
    "val_every=2",
    "log_every=1",
    "checkpoint_every=2",
    "data.seq_len=32",
    "data.batch_size=4",
    "data.val_batches=1",
]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["seeds=auto", "seeds.stage=0"], "seeds.stage=0 is invalid: an integer >= 2"),
        (["seeds=auto", "seeds.stage=3", "seeds.max=2"], "seeds.max=2 is invalid: an integer >= seeds.stage=3"),
        (["seeds=auto", "seeds.alpha=1.5"], "seeds.alpha=1.5 is invalid: a number strictly between 0 and 1"),
        (["seeds.stage=2"], "seeds.stage=2 is invalid: needs seeds=auto beside it"),
        (["seeds=auto", "seeds.stag=2"], "did you mean 'stage'?"),
        (["seeds=auto", "seeds.first=-1"], "seeds.first=-1 is invalid: an integer >= 0"),
        (["seeds=auto", "seeds.first=x"], "seeds.first='x' is invalid: a int"),
        (["seeds=auto", "seeds.every_arm=yes"], "seeds.every_arm='yes' is invalid: true or false"),
        (["seeds=auto", "seeds.earlier=/nowhere"], "seeds.earlier='/nowhere' is invalid: a report folder of this grid"),
        (["seeds=auto", "--detach"], "--detach does not go with seeds=auto: each stage is decided before the next"),
        (["seeds=auto", "scheme=mesh"], "seeds=auto='schemes' is invalid: a grid whose arms test a primary claim"),
    ],
)
def test_bad_seeds_auto_requests_are_refused_in_one_line_before_compute(arguments, message, tmp_path, capsys):
    assert main(["schemes", *arguments, *CELL, f"runs_dir={tmp_path}"]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "schemes").exists()


@pytest.mark.parametrize("point", [["model=tiny", "max_steps=5700"], ["model=mini", "max_steps=2500"]])
def test_a_study_whose_file_declares_its_seeds_plans_its_budget_not_power(point, tmp_path, capsys):
    """size_tokens (issue 49 part 4) declares its seeds and rule: --plan prints each point's CPU-hours
    first and plans no power; the mini point costs more than the tiny one at 2.3x the tokens."""
    hours = []
    for arguments in (point, ["model=tiny", "max_steps=2500"]):
        assert main(["size_tokens", *arguments, "--plan", f"runs_dir={tmp_path}"]) == 0
        first, second = capsys.readouterr().out.splitlines()[:2]
        assert (
            first.startswith("size_tokens: 15 cells (5 configs x 3 seeds); estimate: ") and "CPU-h (FLOP model" in first
        )
        assert second.startswith("size_tokens --plan: its seeds and decision rule are declared in its sweep file")
        hours.append(float(first.split("estimate: ")[1].split(" CPU-h")[0]))
    assert hours[0] > 2 * hours[1]  # 5700 tiny steps, or mini's 8x FLOPs per token, against 2500 tiny steps
    assert not (tmp_path / "mlflow.db").exists()  # planned, nothing ran


def test_plan_without_runs_uses_the_prior_sd_and_the_flop_model(tmp_path, capsys):
    assert main(["schemes", "--plan", *CELL, f"runs_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "alpha 0.0125 per primary claim (Bonferroni over 4)" in out
    (line,) = [x for x in out.splitlines() if "mesh_below_base" in x and "warning" not in x]
    assert f"{PRIOR_SD_SOURCE}: " in line and "(FLOP model)" in line
    fixed = seeds_needed(-0.036, PRIOR_SD, 0.0125)
    cap = sequential_seeds_needed(Design(claims=4), -0.036, PRIOR_SD, fixed)
    assert f"{fixed} seeds per arm at fixed n, a cap of {cap} under the sequential design for 80% power" in line
    assert f"2 arms at {cap} seeds " in line  # the cost of what the grid would run
    power = Design(claims=4).power(-0.036, PRIOR_SD, paths=50_000)
    assert f"{power:.0%} power at 12 seeds" in line
    # below 50% at the cap: one warning line per claim, e.g. MeSH < anchor at the prior SD
    warned = [x for x in out.splitlines() if x.startswith("warning: mesh_below_anchor:")]
    needed = seeds_needed(-0.023, PRIOR_SD, 0.0125)
    assert len(warned) == 1 and warned[0].endswith(
        f"power at 12 seeds; {needed} seeds per arm at fixed n, more than 36 under the sequential design (searched to "
        "there) for 80% power"
    )
    assert not (tmp_path / "mlflow.db").exists()  # --plan creates no store


def test_plan_under_three_finished_seeds_uses_the_prior_sd_and_says_so_in_its_first_line(tmp_path, capsys):
    """Right after a two-seed grid (the demo's), the SD of 2 paired seeds is not planned on: the prior
    is, unless the observed is larger, and the first line says so."""
    assert main(["schemes", "scheme=base,mesh", "seeds=2", *CELL, f"runs_dir={tmp_path}"]) == 0
    capsys.readouterr()
    assert main(["schemes", "--plan", "scheme=base,mesh", *CELL, f"runs_dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.endswith(
        f"under 3 finished seeds per cell (2 here), so SD = the prior {PRIOR_SD:g} or the observed, whichever is larger"
    )
    (line,) = [x for x in out.splitlines() if x.startswith("  mesh_below_base")]
    observed = float(re.search(r"(?:not the )?SD ([\d.]+) (?:of|from) 2 finished paired seeds", line).group(1))
    sd = max(PRIOR_SD, observed)
    alpha = float(re.search(r"alpha ([\d.]+) per primary claim", first).group(1))
    assert f"{seeds_needed(-0.036, sd, alpha)} seeds per arm at fixed n, a cap of " in line
    assert (PRIOR_SD_SOURCE in line) == (observed <= PRIOR_SD)


def test_seeds_first_moves_the_grid_to_fresh_seeds(tmp_path):
    buffer = io.StringIO()
    assert run_sweep("schemes", ["seeds=auto", "seeds.first=100", *CELL, f"runs_dir={tmp_path}"], True, out=buffer) == 0
    out = buffer.getvalue()
    assert "seeds 100..111 (seeds.first=100)" in out and "power at the cap, before spending:" in out
    assert "seed=100" in out and "seed=0 " not in out


def parents(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("schemes").experiment_id])
    return (
        client,
        [r for r in runs if r.data.tags.get("kind") == "sweep"],
        [r for r in runs if r.data.tags.get("kind") != "sweep"],
    )


@pytest.mark.slow
def test_seeds_auto_runs_stages_records_them_resumes_and_plans_from_the_runs(tmp_path, capsys):
    args = ["seeds=auto", "seeds.stage=2", "seeds.max=4", "seeds.futility=false", "scheme=base,mesh", *CELL]
    args.append(f"runs_dir={tmp_path}")
    first_run = io.StringIO()
    assert run_sweep("schemes", args, out=first_run) == 0
    out = first_run.getvalue()
    assert "primary claims mesh_below_base;" in out and "stage 1: seeds 0..1 on 2 arm(s)" in out
    assert "next: seeds 2..3 on 2 arm(s); projected " in out  # the bound at n=2 (|t| > 115) is not crossed
    assert "stage 2: seeds 2..3 on 2 arm(s)" in out
    assert "seeds=auto stops: " in out
    client, grids, children = parents(tmp_path)
    assert len(children) == 8 and all(r.info.status == "FINISHED" for r in children)
    assert {r.data.params["seed"] for r in children} == {"0", "1", "2", "3"}
    (first,) = [p for p in grids if "seeds_auto.stage1" in p.data.tags]
    local = client.download_artifacts(first.info.run_id, "stages.json", str(tmp_path))
    document = json.loads(Path(local).read_text())
    assert [s["stage"] for s in document["stages"]] == [1, 2] and document["design"]["max"] == 4
    (last,) = document["stages"][-1]["verdicts"]
    assert last["n"] == 4 and last["verdict"] in ("holds", "contradicted", "inconclusive")
    assert document["claims"] == [last["claim"]]  # the family the design decided, for the report to read
    from results.pipeline import build_report

    # the report reads the design from that structured record (kept beside it), not from a console log
    report = build_report("auto", [], client.tracking_uri, tmp_path / "report", publish_to_parents=False)
    assert report.design is not None and report.design.log == tmp_path / "report" / "stages.json"
    assert json.loads((tmp_path / "report" / "stages.json").read_text()) == document
    assert "seeds_auto.stage2" in client.get_run(first.info.run_id).data.tags

    # The same command again, as a user re-runs it: everything finished, same verdict. In this
    # process (mesh-sweep's main): what it reads back is the store's, which the first run wrote.
    again = run_tool("mesh-sweep", "schemes", *args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already finished, 0 to run" in again.stdout and f"  {last['verdict']}  RCI" in again.stdout
    assert len(parents(tmp_path)[2]) == 8

    plan = run_tool("mesh-sweep", "schemes", "--plan", "scheme=base,mesh", *CELL, f"runs_dir={tmp_path}")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "from 4 finished paired seeds" in plan.stdout and "(measured run times)" in plan.stdout


@pytest.mark.slow
def test_a_grid_run_in_two_stores_carries_the_first_parts_runs_and_decides_as_one(tmp_path):
    """A seeds=auto grid split across stores (a machine whose runs do not outlive it): the first
    part stops after stage 1 (its budget), its report is the record; the second part, in a fresh
    store with seeds.earlier=that report, trains none of stage 1's cells, takes the same stage-1
    decision from them, trains stage 2 only and records both stages; --add joins the two reports."""
    from results.pipeline import build_report

    design = ["seeds=auto", "seeds.stage=2", "seeds.max=4", "seeds.futility=false", "scheme=base,mesh", *CELL]
    first_part, second_part = tmp_path / "first", tmp_path / "second"
    one = io.StringIO()
    run_sweep("schemes", [*design, "seeds.budget_cpu_h=0.000001", f"runs_dir={first_part}"], out=one)
    assert "seeds=auto stops: seeds.budget_cpu_h=" in one.getvalue() and "stage 2:" not in one.getvalue()
    client = mlflow.MlflowClient(f"sqlite:///{first_part / 'mlflow.db'}")
    folder = tmp_path / "report"
    build_report("schemes", ["schemes"], client.tracking_uri, folder, publish_to_parents=False)
    (stage1,) = [line for line in one.getvalue().splitlines() if line.startswith("mesh_below_base ")]

    two = io.StringIO()
    assert run_sweep("schemes", [*design, f"seeds.earlier={folder}", f"runs_dir={second_part}"], out=two) == 0
    text = two.getvalue()
    assert f"seeds.earlier: 4 finished run(s) of this grid in {folder / 'runs.csv'}" in text
    assert "stage 1: seeds 0..1 on 2 arm(s)\n  4 of its 4 cells finished in the earlier part\n" in text
    assert text.count("[mesh-sweep] schemes: 4 cells, 0 already finished, 4 to run") == 1  # stage 2 only
    assert stage1 in text.split("stage 2:")[0]  # stage 1 decided from the carried runs, as the first part did
    client, grids, children = parents(second_part)
    assert sorted(r.data.params["seed"] for r in children) == ["2", "2", "3", "3"]
    (recorded,) = [p for p in grids if "seeds_auto.stage2" in p.data.tags]
    local = client.download_artifacts(recorded.info.run_id, "stages.json", str(tmp_path))
    document = json.loads(Path(local).read_text())
    assert [[v["n"] for v in s["verdicts"]] for s in document["stages"]] == [[2], [4]]
    assert document["design"]["earlier"] == str(folder)
    joined = build_report("schemes", ["schemes"], client.tracking_uri, folder, publish_to_parents=False, add=True)
    assert sorted(joined.results.runs["seed"]) == ["0", "0", "1", "1", "2", "2", "3", "3"]


def test_an_arm_with_mesh_only_settings_is_tested_against_base_and_a_stage_without_a_comparison_decides_nothing(
    tmp_path,
):
    """The open-choices confirmation: a MeSH arm (``model_overrides.mesh_router_z_coef``) against the
    plain base row. Its MeSH-only setting cannot change a base run, so the rows are compared and the
    stage has a verdict (before, the rows were not compared and the empty stage stopped "decided")."""
    args = ["arm=mesh_z_loss,base", "seeds=auto", "seeds.stage=2", "seeds.max=4", "seeds.futility=false", *CELL]
    out = io.StringIO()
    assert run_sweep("mesh_open_choices", [*args, f"runs_dir={tmp_path}"], out=out) == 0
    text = out.getvalue()
    assert "primary claims mesh_below_base;" in text and "stage 1: seeds 0..1 on 2 arm(s)" in text
    assert "no decision on stage" not in text
    (line, *_) = [row for row in text.splitlines() if row.startswith("mesh_below_base ")]
    assert int(line.split()[1]) >= 2 and "mesh 1+2R2+1 B5 model_overrides.mesh_router_z_coef=0.001 vs base" in line


def test_untested_primary_claims_are_named():
    from results.commands.seeds_auto import untested_claims
    from results.verdicts.sequential import Verdict

    spoken = Verdict("mesh_below_base", "mesh vs base", 3, 0.01, 0.5, 391.5, "continue", "continue")
    assert untested_claims(["mesh_below_base", "mesh_below_anchor"], [spoken]) == ["mesh_below_anchor"]
    assert untested_claims(["mesh_below_base"], [spoken]) == []
    assert untested_claims(["mesh_below_base"], []) == ["mesh_below_base"]


def test_the_next_stage_is_named_by_its_seeds_from_seeds_first():
    from types import SimpleNamespace

    from results.commands.seeds_auto import _stop_reason
    from sweeps.grid import AutoSeeds

    auto = AutoSeeds(stage=3, max=12, first=100)
    design = Design(auto.stage, auto.max, auto.alpha, 2, auto.spending, auto.futility)
    resources = SimpleNamespace(gpus_per_node=0, nodes=1, cpus_per_task=1, tasks=1)
    launch = SimpleNamespace(resources=resources, launcher=SimpleNamespace(concurrency=2, memory_limit=lambda r: None))
    out = io.StringIO()
    assert _stop_reason({"mesh"}, 0, design, auto, {"mesh": 360.0}, 0.0, launch, out) == ""
    assert out.getvalue().startswith("next: seeds 103..105 on 1 arm(s); projected ")
    carried = io.StringIO()  # a stage whose runs all came from an earlier part: nothing timed here
    assert _stop_reason({"mesh"}, 0, design, auto, {}, 0.0, launch, carried) == ""
    assert carried.getvalue().startswith(
        "next: seeds 103..105 on 1 arm(s); no projection: no run of this stage was timed"
    )


@pytest.mark.slow
def test_a_stage_decides_at_its_own_n_when_later_seeds_already_ran(tmp_path):
    """What a driver killed during stage 2 leaves (stage 2's runs ended after it died): the re-run
    decided stage 1 on all four seeds and recorded that as stage 1's decision."""
    args = ["scheme=base,mesh", *CELL, f"runs_dir={tmp_path}"]
    assert run_sweep("schemes", ["seeds=4", *args], out=io.StringIO()) == 0  # seeds 0..3 ended, nobody looked
    out = io.StringIO()
    auto = ["seeds=auto", "seeds.stage=2", "seeds.max=4", "seeds.futility=false"]
    assert run_sweep("schemes", [*auto, *args], out=out) == 0
    client, grids, _ = parents(tmp_path)
    (first,) = [p for p in grids if "seeds_auto.stage1" in p.data.tags]
    document = json.loads(Path(client.download_artifacts(first.info.run_id, "stages.json", str(tmp_path))).read_text())
    assert [s["stage"] for s in document["stages"]] == [1, 2], out.getvalue()
    assert [[v["n"] for v in s["verdicts"]] for s in document["stages"]] == [[2], [4]]
    assert all(p.info.status != "RUNNING" for p in parents(tmp_path)[1])  # every stage's parent closed


@pytest.mark.parametrize(("effect", "sd"), [(-0.036, 0.0459), (0.042, 0.0184)])
def test_seeds_needed_under_the_sequential_design_is_the_first_cap_its_simulated_power_reaches(effect, sd):
    """The one-pass schemes grid's SDs: 22 seeds at fixed n for MeSH < base is not what the seeds=auto
    design needs; its first cap (a whole number of stages) whose simulated power reaches 80%."""
    design = Design(claims=4)
    fixed = seeds_needed(effect, sd, design.share)
    cap = sequential_seeds_needed(design, effect, sd, fixed)
    assert cap is not None and cap >= fixed and cap % design.stage == 0

    def power_at(n):
        return Design(design.stage, n, design.alpha, design.claims).power(effect, sd, paths=50_000)

    assert power_at(cap) >= 0.8
    if cap - design.stage >= max(2 * design.stage, fixed):
        assert power_at(cap - design.stage) < 0.8
    # the reproduction's MeSH < base: 22 seeds at fixed n, a cap of 24 for the design (the audit's figure)
    assert (fixed, cap) == ((22, 24) if effect < 0 else (6, 6))
    # a claim no cap up to 3x the design's reaches: said, not searched further
    assert sequential_seeds_needed(design, -0.023, 0.0515, seeds_needed(-0.023, 0.0515, design.share)) is None


def test_every_arm_keeps_the_rows_whose_claims_are_decided_on_the_open_claims_seeds():
    """seeds.every_arm=true (issue 49 part 3: anchor and anchor_emb on the same seeds as MeSH): while
    any primary claim is open every arm runs the next stage; once none is, none does."""
    from results.commands.seeds_auto import next_arms
    from results.verdicts.sequential import Verdict
    from sweeps.grid import split_auto_seeds

    mesh, base, anchor = ("scheme=mesh",), ("scheme=base",), ("scheme=anchor",)

    def verdict(claim: str, decision: str, arms: list) -> Verdict:
        return Verdict(claim, "", 6, 0.0, None, 8.39, decision, decision, arms)

    verdicts = [
        verdict("mesh_below_base", "continue", [mesh, base]),
        verdict("mesh_below_anchor", "futile", [mesh, anchor]),
    ]
    assert next_arms(verdicts, [mesh, base, anchor]) == {mesh, base}  # the default: the open claims' arms
    assert next_arms(verdicts, [mesh, base, anchor], every_arm=True) == {mesh, base, anchor}
    decided = [
        verdict("mesh_below_base", "futile", [mesh, base]),
        verdict("mesh_below_anchor", "futile", [mesh, anchor]),
    ]
    assert next_arms(decided, [mesh, base, anchor], every_arm=True) == set()
    auto, rest = split_auto_seeds(["seeds=auto", "seeds.every_arm=true", "scheme=mesh"])
    assert auto is not None and auto.every_arm and rest == ["scheme=mesh"]
