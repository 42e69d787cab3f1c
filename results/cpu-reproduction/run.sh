#!/usr/bin/env bash
# The CPU-scale reproduction: the commands that produced this folder, run from the repository root
# after `make setup data`. Tiny preset (d=64, 1+2R2+1, compute depth 6), embedded Shakespeare corpus,
# BPE-2048, seq 128, batch 16, 250 steps, 3 seeds, probes at the end of each run.
set -euo pipefail
COMMON=(seeds=3 model=tiny max_steps=250 val_every=50 checkpoint_every=50 runs_dir=runs/cpu-reproduction)
for sweep in schemes buffer_slots skip_combos; do
  .venv/bin/mesh-sweep "$sweep" "${COMMON[@]}"
  .venv/bin/mesh-results "$sweep" --runs-dir runs/cpu-reproduction --out "results/cpu-reproduction/$sweep"
done
