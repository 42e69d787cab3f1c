"""The "Over training" section of claims.md marks a comparison of fewer than three seeds a row
fragile, as the verdicts above it do: read back from a report mesh-results writes from a real
sqlite store of two seeds."""

from __future__ import annotations

import mlflow
from test_curves import log_curve_run

from results.commands.mesh_results import main

STEPS = (10, 20, 30)
ROWS = (("vanilla", "6"), ("base", "1+2R2+1"), ("mesh", "1+2R2+1"))


NOISE = {"vanilla": (0.004, -0.002), "base": (0.0, 0.0), "mesh": (0.01, -0.012)}  # per seed: paired spreads


def loss(scheme: str, seed: int, step: int) -> float:
    gap = {"vanilla": 0.03, "base": 0.0, "mesh": -0.02 * step / 10}[scheme]
    return 6.0 - step / 20 + 0.05 * seed + gap + NOISE[scheme][seed]


def test_every_comparison_over_training_at_two_seeds_carries_the_fragile_mark(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("curves2", artifact_location=(tmp_path / "artifacts").as_uri())
    for scheme, layout in ROWS:
        for seed in (0, 1):
            log_curve_run(
                client, experiment_id, scheme, layout, seed, {step: loss(scheme, seed, step) for step in STEPS}
            )
    out = tmp_path / "out"
    assert main(["curves2", "--tracking-uri", uri, "--out", str(out)]) == 0
    section = (out / "claims.md").read_text().split("## Over training", 1)[1].split("\n## ", 1)[0]
    items = [line for line in section.splitlines() if line.startswith("* ")]
    assert items and all(line.endswith(" (n=2, fragile)") for line in items), items
    assert any("`mesh_below_base`" in line for line in items)
