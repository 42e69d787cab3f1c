#!/usr/bin/env bash
# The CPU-scale reproduction in the multi-epoch regime (superseded by one-pass/run.sh): every command
# that produced the multi-epoch reports of this folder, run from the repository root
# after `make setup data`. Every run: 2500 steps of batch 16 x 128 tokens (5.1M tokens, about 25
# tokens per non-embedding parameter at tiny), peak LR 2e-3 with the paper's schedule (1% warmup,
# cosine to 10%) for every preset, 3 seeds, probes at the end. Grids are packed onto the machine
# (launcher=auto) and resume where they stopped, so the script can be re-run after an interruption.
#
#   bash results/cpu-reproduction/run.sh            # every stage in order (about 9 hours on a 2-core machine)
#   bash results/cpu-reproduction/run.sh 1 2        # only stages 1 and 2
#   bash results/cpu-reproduction/run.sh report     # only the reports, from the runs present
#
# Stages (the order in which the budget is spent):
#   1  schemes (vanilla, base, residual, anchor, anchor*, MeSH) at tiny on Shakespeare, then on KJV
#   2  base and MeSH at a three-loop tiny layout (1+1R3+1) on Shakespeare: the balance claim
#   3  buffer_slots (B = 3..6) and skip_combos at tiny on Shakespeare
#   4  schemes at mini on Shakespeare
#   5  moe (vanilla, base, anchor, MeSH) at tiny-moe (8 experts, top-2) on Shakespeare: the looped MoE
set -euo pipefail
RUNS="${RUNS:-runs/cpu-reproduction}"
OUT=results/cpu-reproduction
COMMON=(seeds=3 max_steps=2500 optim.lr=2e-3 val_every=500 checkpoint_every=250 "runs_dir=$RUNS")
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(1 2 3 4 5 report)

sweep() {  # a failed cell is listed by mesh-sweep and recorded as FAILED; the next grid still runs
  echo "+ mesh-sweep $*" >&2
  .venv/bin/mesh-sweep "$@" "${COMMON[@]}" || echo "run.sh: mesh-sweep $1 exited $? (see its table above)" >&2
}

report() {  # report DIR EXPERIMENT...
  local dir="$1"
  shift
  echo "+ mesh-results $* --out $OUT/$dir" >&2
  .venv/bin/mesh-results "$@" --runs-dir "$RUNS" --out "$OUT/$dir"
}

for stage in "${STAGES[@]}"; do
  case "$stage" in
    1)
      sweep schemes model=tiny
      sweep schemes model=tiny data=kjv tracking.experiment=schemes_kjv
      ;;
    2) sweep schemes model=tiny scheme=base,mesh layout=1+1R3+1 tracking.experiment=schemes_k3 ;;
    3)
      sweep buffer_slots model=tiny
      sweep skip_combos model=tiny
      ;;
    4) sweep schemes model=mini tracking.experiment=schemes_mini ;;
    5) sweep moe model=tiny-moe ;;
    report)
      # A grid whose stage has not run yet is named and left out. One claims.md (all/) over every
      # Shakespeare grid present: the verdict table of README.md. KJV has its own report.
      all=()
      for grid in tiny-shakespeare:schemes tiny-k3:schemes_k3 buffer_slots:buffer_slots skip_combos:skip_combos \
        mini-shakespeare:schemes_mini tiny-moe:moe; do
        if report "${grid%%:*}" "${grid##*:}"; then all+=("${grid##*:}"); else echo "run.sh: no ${grid%%:*} report (has its stage run?)" >&2; fi
      done
      report tiny-kjv schemes_kjv || echo "run.sh: no tiny-kjv report (has stage 1 run?)" >&2
      report all "$(IFS=,; echo "${all[*]}")"  # mesh-results takes the experiments comma-separated
      ;;
    *)
      echo "run.sh: stage '$stage' is unknown: use 1, 2, 3, 4, 5 or report" >&2
      exit 2
      ;;
  esac
done
