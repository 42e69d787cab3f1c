#!/usr/bin/env bash
# The CPU reproduction in the one-pass regime, from the repository root after `make setup data-large`.
# Corpus data=docs (the Linux kernel's and Python's documentation, 11.7M training tokens): a 2500-step
# run of batch 16 x 128 (5.1M tokens) sees 0.44 of its training split, never a document twice.
# Every stage resumes where it stopped; stages after `lr` take each scheme's best LR from lr/lr.csv.
#
#   bash results/cpu-reproduction/one-pass/run.sh lr report     # the LR sweep, then the reports
#   bash results/cpu-reproduction/one-pass/run.sh schemes       # the schemes grid, seeds=auto up to 12
#   bash results/cpu-reproduction/one-pass/run.sh plan          # seeds and CPU-hours each stage would need
#
# Stages, in the order the budget is spent:
#   lr       vanilla, base, anchor* and MeSH at peak LR 1e-3, 2e-3, 4e-3, 8e-3 (anchor*, MeSH also
#            1.6e-2), 2 seeds, a quarter of the
#            budget (625 steps, 1.3M tokens), no probes: each scheme's best LR
#   schemes  vanilla, base, anchor, anchor*, MeSH at tiny 1+2R2+1, each at its own LR, seeds=auto
#            (stages of 3, cap 12): the primary claims MeSH < base, < anchor, < anchor*, base > vanilla
#   k3       base and MeSH at the three-loop 1+1R3+1, seeds=auto
#   skip     the skip combinations at tiny not in the schemes grid, 3 seeds (reported with the schemes)
#   confirm  stage B of the screen: each selected arm against base and anchor, seeds=auto from seed 100
#   lr-disjoint  the LR sweep on seeds 20-21 (disjoint from every evaluation grid's), anchor at its
#            own LRs: declared, run after the screen
#   screen   MeSH's open choices, stage A (sweeps/conf/sweep/mesh_open_choices.yaml: arms, seeds 12-14
#            and the decision rule, declared before it ran), with base and anchor
#   depth    the loop count at test time (sweeps/conf/sweep/depth.yaml: arms, seeds 200-202 and the rule,
#            declared before it ran): base, anchor, anchor*, MeSH x fixed/sampled K, then MeSH at sampled
#            K under the cycle rule; every cell evaluated at K' = 1..8 and under exit as it ends. Its
#            runs live in $DEPTH_RUNS (runs/depth); `depth-report` adds them to depth/ (mesh-results
#            --add: a study run in parts, docs/depth.md).
#   schemes-relr  the schemes grid again at the LRs the disjoint-seed sweep chose, every arm on MeSH's
#            seeds, and the z-loss arm at both of its LRs on the same seeds (sweeps/conf/sweep/schemes_relr.yaml
#            and z_loss_lr.yaml: arms, seeds from 500 and the rules, declared before it ran); its runs
#            live in $RUNS; schemes-relr-report writes schemes_relr/, z_loss_lr/ (and its decision.md)
#            and the trend again with the point at the re-chosen LRs
#   size-tokens  MeSH vs anchor and base at more tokens (tiny, the whole docs split) and at a larger size
#            (mini, 5.1M tokens): sweeps/conf/sweep/size_tokens.yaml (arms, seeds 300-302 and the rule,
#            declared before it ran); its runs live in $SIZE_RUNS (runs/size_tokens), one grid a point;
#            size-tokens-plan prints each point's budget; size-tokens-report writes a report folder per
#            point (size_tokens/tokens, size_tokens/size) and the trend against the schemes grid
#            (size_tokens/trend.md, results.commands.trend), with the points that have run.
#   size-lr  the size point's anchors at 4e-3 (their disjoint-seed LR) on its seeds, so every arm at
#            mini is at one LR (sweeps/conf/sweep/size_lr.yaml: declared after the size point's anchors
#            were seen, before any of its runs); its runs live in $SIZE_RUNS, experiment size_lr;
#            size-lr-report writes size_tokens/size_one_lr (every arm at 4e-3), its decision.md
#            (one-pass/size_lr.py, the declared rule) and the trend with that point.
set -euo pipefail
RUNS="${RUNS:-runs/one-pass}"
DEPTH_RUNS="${DEPTH_RUNS:-runs/depth}"
SIZE_RUNS="${SIZE_RUNS:-runs/size_tokens}"
SIZE_POINTS=("model=tiny max_steps=5700" "model=mini max_steps=2500")  # the declared points: tokens, size
OUT=results/cpu-reproduction/one-pass
COMMON=(model=tiny data=docs "runs_dir=$RUNS")
FULL=(max_steps=2500 val_every=125 checkpoint_every=250)
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(lr schemes k3 skip report)

sweep() {  # a failed cell is listed by mesh-sweep and recorded as FAILED; the next grid still runs
  echo "+ mesh-sweep $*" >&2
  .venv/bin/mesh-sweep "$@" "${COMMON[@]}" || echo "run.sh: mesh-sweep $1 exited $? (see its table above)" >&2
}

report() {  # report DIR EXPERIMENT [FLAG...] (--add: join this store's runs to the committed report)
  echo "+ mesh-results $2 --out $OUT/$1 ${*:3}" >&2
  .venv/bin/mesh-results "$2" --runs-dir "$RUNS" --out "$OUT/$1" "${@:3}" || echo "run.sh: no $1 report (has its stage run?)" >&2
}

lr_args() {  # +optim.lr_by_scheme.<scheme>=<best LR> from the LR report; anchor takes anchor*'s, any
  # other scheme (the skip combinations) base's
  [ -f "$OUT/lr/lr.csv" ] || { echo "run.sh: no $OUT/lr/lr.csv: run the lr stage and its report first" >&2; exit 2; }
  .venv/bin/python - "$OUT/lr/lr.csv" <<'EOF'
import sys
import pandas as pd
best = pd.read_csv(sys.argv[1]).query("best")
lrs = dict(zip(best["scheme"], best["lr"]))
if "anchor_emb" in lrs:
    lrs.setdefault("anchor", lrs["anchor_emb"])  # anchor was not in the LR grid: its closest relative's LR
args = [f"+optim.lr_by_scheme.{scheme}={lr:g}" for scheme, lr in sorted(lrs.items())]
print(" ".join([*args, f"optim.lr={lrs['base']:g}"] if "base" in lrs else args))
EOF
}

for stage in "${STAGES[@]}"; do
  case "$stage" in
    lr)
      LR=(seeds=2 max_steps=625 val_every=125 checkpoint_every=125 probes.enabled=false)
      sweep lr "${LR[@]}"
      # anchor* was best at 8e-3, the edge, and MeSH within 1.6% of it there: one LR further for both
      sweep lr "${LR[@]}" scheme=anchor_emb,mesh optim.lr=0.016
      ;;
    lr-disjoint)
      # Declared 2026-12-04, before it ran: the LR sweep again on seeds 20-21, disjoint from every
      # evaluation grid's (schemes 0-11, the open-choices screen 12-14, its re-tuning 40-41, its
      # confirmation from 100), with anchor at its own LRs. Decision: each scheme's best mean val PPL
      # at step 625; where the best and the runner-up are within noise (results/verdicts/lr.py),
      # the report says so and the lower LR is kept. A scheme whose best LR changes gets the schemes
      # grid re-run at it (a new experiment, seeds=auto), and the verdicts that depend on it are
      # reported beside the old ones.
      LR=(scheme=vanilla,base,anchor,anchor_emb,mesh "seeds=[20,21]" max_steps=625 val_every=125
        checkpoint_every=125 probes.enabled=false tracking.experiment=onepass_lr_disjoint)
      sweep lr "${LR[@]}"
      sweep lr "${LR[@]}" scheme=anchor,anchor_emb,mesh optim.lr=0.016
      ;;
    schemes)
      # shellcheck disable=SC2046  # one word per override
      sweep schemes scheme=vanilla,base,anchor,anchor_emb,mesh seeds=auto seeds.max=12 "${FULL[@]}" \
        $(lr_args) tracking.experiment=onepass_schemes
      ;;
    k3)
      # shellcheck disable=SC2046
      sweep schemes scheme=base,mesh layout=1+1R3+1 seeds=auto seeds.max=12 "${FULL[@]}" $(lr_args) \
        tracking.experiment=onepass_k3
      ;;
    skip)
      # The combinations the schemes grid did not run; vanilla, base, anchor and MeSH are its runs (the
      # same seed gives the same run in either experiment), and the report reads both experiments.
      # shellcheck disable=SC2046
      sweep skip_combos scheme=residual+anchor,residual+anchor+anchor_emb,anchor+anchor_emb,static,dynamic \
        seeds=3 "${FULL[@]}" $(lr_args) tracking.experiment=onepass_skip_combos
      ;;
    screen)
      # shellcheck disable=SC2046
      sweep mesh_open_choices "seeds=[12,13,14]" "${FULL[@]}" $(lr_args) tracking.experiment=onepass_open_choices
      ;;
    confirm)
      # Stage B of the open-choices screen, as declared in sweeps/conf/sweep/mesh_open_choices.yaml:
      # each arm the screen's rule selected (open_choices/selected.txt, written by the report stage)
      # against base and anchor, seeds=auto from seed 100. An arm that changes the routers' step gets
      # its LR re-chosen first among 2e-3, 4e-3 and 8e-3 on seeds 40-41 at a quarter of the budget.
      # base's and anchor's runs are shared between the arms' grids (same config and seed: run once).
      SEL="$OUT/open_choices/selected.txt"
      if [ ! -s "$SEL" ]; then
        echo "run.sh: no arm selected in $SEL: stage B is not run" >&2
        continue
      fi
      while read -r arm; do
        lr=0.004
        case "$arm" in
          mesh_router_lr | mesh_rmsnorm | mesh_z_loss)
            sweep mesh_open_choices "arm=$arm" "seeds=[40,41]" max_steps=625 val_every=125 checkpoint_every=125 \
              probes.enabled=false optim.lr=0.002,0.004,0.008 "tracking.experiment=onepass_retune_$arm"
            report "retune_$arm" "onepass_retune_$arm"
            lr=$(.venv/bin/python -c "import sys, pandas as pd; print(f\"{pd.read_csv(sys.argv[1]).query('best').lr.iloc[0]:g}\")" \
              "$OUT/retune_$arm/lr.csv")
            ;;
        esac
        echo "run.sh: stage B arm $arm at LR $lr" >&2
        # shellcheck disable=SC2046
        sweep mesh_open_choices "arm=$arm,base,anchor" seeds=auto seeds.first=100 seeds.max=12 "${FULL[@]}" \
          $(lr_args | tr ' ' '\n' | grep -v '^+optim.lr_by_scheme.mesh=') "+optim.lr_by_scheme.mesh=$lr" \
          tracking.experiment=onepass_open_choices_confirm
      done <"$SEL"
      ;;
    depth)
      for arm in "" "arm=mesh_cycle scheme=mesh loops=poisson_lognormal"; do
        echo "+ mesh-sweep depth $arm" >&2
        # shellcheck disable=SC2086
        .venv/bin/mesh-sweep depth $arm "runs_dir=$DEPTH_RUNS" || echo "run.sh: mesh-sweep depth $arm exited $?" >&2
      done
      ;;
    depth-plan)  # the grid, then the ninth arm: each command's budget
      .venv/bin/mesh-sweep depth "runs_dir=$DEPTH_RUNS" --plan
      .venv/bin/mesh-sweep depth arm=mesh_cycle scheme=mesh loops=poisson_lognormal "runs_dir=$DEPTH_RUNS" --plan
      ;;
    depth-report)
      echo "+ mesh-results depth --out $OUT/depth" >&2
      .venv/bin/mesh-results depth --runs-dir "$DEPTH_RUNS" --out "$OUT/depth" --add || echo "run.sh: no depth report (has its stage run?)" >&2
      ;;
    schemes-relr)
      # Declared before it ran (2026-12-06 here, moved unchanged to the two sweep files 2026-12-07, the
      # z-loss rule written out): sweeps/conf/sweep/schemes_relr.yaml (the schemes grid at the LRs the
      # disjoint-seed sweep chose, seeds=auto from seed 500, every arm on MeSH's seeds) and
      # sweeps/conf/sweep/z_loss_lr.yaml (the z-loss arm at 4e-3 and 8e-3 with base, seeds 500-505).
      # run in parts where a store does not outlive a session: the committed report of the parts so
      # far carries their runs (seeds.earlier; their cells are not trained again), and --add joins them
      EARLIER=()
      [ -f "$OUT/schemes_relr/runs.csv" ] && EARLIER=("seeds.earlier=$OUT/schemes_relr")
      sweep schemes_relr seeds=auto seeds.first=500 seeds.max=12 seeds.every_arm=true "${EARLIER[@]}" "${FULL[@]}" \
        tracking.experiment=onepass_schemes_relr
      sweep z_loss_lr "${FULL[@]}" tracking.experiment=onepass_z_loss_lr
      sweep z_loss_lr arm=mesh_z_loss ++optim.lr_by_scheme.mesh=0.008 "${FULL[@]}" tracking.experiment=onepass_z_loss_lr
      ;;
    schemes-relr-report)
      report schemes_relr onepass_schemes_relr --add
      # each part's runs joined to the committed report (--add), then the declared rule: decision.md
      echo "+ mesh-results onepass_z_loss_lr --out $OUT/z_loss_lr --add" >&2
      .venv/bin/mesh-results onepass_z_loss_lr --runs-dir "$RUNS" --out "$OUT/z_loss_lr" --add \
        && .venv/bin/python "$OUT/z_loss_lr.py" "$OUT/z_loss_lr" >/dev/null \
        || echo "run.sh: no z_loss_lr report (has its stage run?)" >&2
      bash "$0" size-tokens-report  # the trend again, with the point at the re-chosen LRs
      ;;
    size-tokens)
      for point in "${SIZE_POINTS[@]}"; do
        echo "+ mesh-sweep size_tokens $point" >&2
        # shellcheck disable=SC2086
        .venv/bin/mesh-sweep size_tokens $point "runs_dir=$SIZE_RUNS" || echo "run.sh: mesh-sweep size_tokens $point exited $?" >&2
      done
      ;;
    size-lr)
      # Declared before it ran (sweeps/conf/sweep/size_lr.yaml, 2026-12-07): the size point's anchors at
      # the 4e-3 the disjoint-seed LR sweep chose, on the size point's seeds, so every arm at mini is at
      # one LR; into the size point's store
      .venv/bin/mesh-sweep size_lr "runs_dir=$SIZE_RUNS" || echo "run.sh: mesh-sweep size_lr exited $?" >&2
      ;;
    size-lr-report)  # the point with every arm at 4e-3 (size_lr's anchors with the size point's other arms)
      echo "+ mesh-results size_tokens,size_lr --out $OUT/size_tokens/size_one_lr" >&2
      .venv/bin/mesh-results size_tokens,size_lr --runs-dir "$SIZE_RUNS" --out "$OUT/size_tokens/size_one_lr" \
        --filter "params.model = 'mini' and params.peak_lr = '0.004'" \
        && .venv/bin/python "$OUT/size_lr.py" "$OUT/size_tokens/size" "$OUT/size_tokens/size_one_lr" >/dev/null \
        || echo "run.sh: no size_lr report (has size-lr run?)" >&2
      bash "$0" size-tokens-report  # the trend again, with the point at one LR
      ;;
    size-tokens-report)
      TREND=(--reference "tiny, 5.1M tokens=$OUT/schemes,$OUT/open_choices_confirm@optim.lr_by_scheme.mesh=0.004"
             --point "replicate: tiny, 5.1M tokens, seeds 200-202=$OUT/depth@loops.distribution=fixed")
      for point in "tiny tokens tiny, 11.7M tokens" "mini size mini, 5.1M tokens"; do
        read -r preset folder name <<< "$point"
        if [ ! -f "$SIZE_RUNS/mlflow.db" ] && [ -f "$OUT/size_tokens/$folder/runs.csv" ]; then
          TREND+=(--point "$name=$OUT/size_tokens/$folder")  # its store is gone: the committed report
        elif .venv/bin/mesh-results size_tokens --runs-dir "$SIZE_RUNS" --filter "params.model = '$preset'" \
             --out "$OUT/size_tokens/$folder"; then
          TREND+=(--point "$name=$OUT/size_tokens/$folder")
        else
          echo "run.sh: no $preset point yet (has size-tokens run it?)" >&2
        fi
      done
      if [ -f "$OUT/size_tokens/size_one_lr/runs.csv" ]; then  # run.sh size-lr-report
        TREND+=(--point "mini, 5.1M tokens, every arm at 4e-3=$OUT/size_tokens/size_one_lr")
      fi
      if [ -f "$OUT/schemes_relr/runs.csv" ]; then  # run.sh schemes-relr-report
        TREND+=(--point "tiny, 5.1M tokens, re-chosen LRs=$OUT/schemes_relr")
      fi
      .venv/bin/python -m results.commands.trend "$OUT/size_tokens" "${TREND[@]}"
      ;;
    size-tokens-plan)
      for point in "${SIZE_POINTS[@]}"; do
        # shellcheck disable=SC2086
        .venv/bin/mesh-sweep size_tokens $point "runs_dir=$SIZE_RUNS" --plan
      done
      ;;
    plan)
      # shellcheck disable=SC2046
      .venv/bin/mesh-sweep schemes scheme=vanilla,base,anchor,anchor_emb,mesh "${FULL[@]}" $(lr_args) \
        tracking.experiment=onepass_schemes "${COMMON[@]}" --plan
      ;;
    report)
      report lr lr
      report schemes onepass_schemes
      report k3 onepass_k3
      report skip_combos onepass_schemes,onepass_skip_combos
      [ -d "$RUNS" ] && report lr_disjoint onepass_lr_disjoint
      [ -d "$RUNS" ] && report open_choices onepass_open_choices \
        && .venv/bin/python "$OUT/open_choices.py" "$OUT/open_choices" >/dev/null  # the declared rule: decision.md
      [ -d "$RUNS" ] && report open_choices_confirm onepass_open_choices_confirm \
        && .venv/bin/python "$OUT/open_choices.py" --confirmation "$OUT/open_choices_confirm" >/dev/null  # readouts.md
      ;;
    *)
      echo "run.sh: stage '$stage' is unknown: use lr, lr-disjoint, schemes, k3, skip, screen, confirm, depth, depth-plan, depth-report, schemes-relr, schemes-relr-report, size-tokens, size-lr, size-lr-report, size-tokens-plan, size-tokens-report, plan or report" >&2
      exit 2
      ;;
  esac
done
