#!/usr/bin/env bash
# The CPU-scale reproduction: the commands that produced this folder, run from the repository root
# after `make setup data`. Embedded Shakespeare corpus, BPE-2048, seq 128, batch 16, 3 seeds,
# probes at the end of each run.
#   bash results/cpu-reproduction/run.sh tiny   # d=64, 1+2R2+1, 250 steps, one process (~35 min)
#   bash results/cpu-reproduction/run.sh mini   # d=128, 2+4R2+2, 200 steps, 2 processes x 1 thread (~50 min)
set -euo pipefail
PRESET="${1:-tiny}"
case "$PRESET" in
  tiny) STEPS=250; LAUNCH=() ;;
  mini) STEPS=200; LAUNCH=(launcher=parallel) ;;
  *) echo "run.sh: preset='$PRESET' is unknown: use tiny or mini" >&2; exit 2 ;;
esac
RUNS="runs/cpu-reproduction-$PRESET"
COMMON=(seeds=3 "model=$PRESET" "max_steps=$STEPS" val_every=50 checkpoint_every=50 "runs_dir=$RUNS")
for sweep in schemes buffer_slots skip_combos; do
  .venv/bin/mesh-sweep "$sweep" "${COMMON[@]}" "${LAUNCH[@]}" || echo "run.sh: $sweep had failed cells (listed above)"
  .venv/bin/mesh-results "$sweep" --runs-dir "$RUNS" --out "results/cpu-reproduction/$PRESET/$sweep"
done
