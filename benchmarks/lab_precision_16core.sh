#!/usr/bin/env bash
# FP16 precision alignment in the CPU lab (docs/lab-precision.md), sized for one 16-core machine in under 9 minutes:
#   1. warm-ups of seeds 150-165 (MoE, add task), 16 at a time, into a cache;
#   2. the discrepancy floor of each precision pair on those 16 warmed-up policies (benchmarks/lab_mismatch.py, one
#      process per seed), paired by benchmarks/lab_floor_pairs.py over all seeds, the discovery seeds 150-157 and the
#      unseen seeds 158-165;
#   3. `mismatch-ctrl lab --preset precision`: GRPO at K = 4 optimizer steps per rollout, 120 rollouts, on the exact
#      engine, BF16 everywhere, FP16 everywhere, and FP8 e4m3 / NVFP4 rollouts with a BF16 trainer, without and with
#      R3: the discovery seeds 150-155 and the unseen seeds 156-161 in two --out directories at once (42 runs each, 8
#      at a time each, seed by seed: a sweep cut by the time limit keeps every finished run in OUT), then
#      `mismatch-ctrl lab compare` of both, per directory and pooled.
# Everything is written under WORK; OUT receives three files (a device machine returns at most 8): results.md (the
# floor pairs and the comparisons), log.txt, and precision-runs.tar.gz (WORK: run folders, reports, floor JSON).
# Usage: bash benchmarks/lab_precision_16core.sh OUT   (OUT: where the results go; the GPU machine's $OUT)
# Needs python3 with torch, numpy, matplotlib and PyYAML; run from the repository root (PYTHONPATH=. is set here).
# A smoke test: STEPS=2 FLOOR_SEEDS="150 151" DISCOVERY=150 UNSEEN=151 JOBS=2 bash benchmarks/lab_precision_16core.sh OUT
set -euo pipefail
case "${1:-}" in  # --help: the header above; an option where OUT belongs: refused before any work
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "benchmarks/lab_precision_16core.sh: OUT must be a folder, not the option $1 (--help for the usage)" >&2; exit 2 ;;
esac
OUT=${1:?usage: bash benchmarks/lab_precision_16core.sh OUT}
PY=${PYTHON:-python3}
JOBS=${JOBS:-16}
CACHE=${CACHE:-/tmp/mismatch_ctrl_warmups}
WORK=${WORK:-/tmp/mismatch_ctrl_precision}
STEPS=${STEPS:-120}
FLOOR_SEEDS=${FLOOR_SEEDS:-$(seq -s ' ' 150 165)}
DISCOVERY=${DISCOVERY:-150,151,152,153,154,155}
UNSEEN=${UNSEEN:-156,157,158,159,160,161}
STEP_SECONDS=${STEP_SECONDS:-240}   # the most one warm-up or one seed's floors may take
SWEEP_SECONDS=${SWEEP_SECONDS:-360} # the most the two GRPO sweeps may take
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
mkdir -p "$OUT" "$WORK/floor" "$CACHE"
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "[$(date +%T)] $*"; }
pack() {
  for file in "$WORK"/floor/pairs-*.md "$WORK"/compare-*.md; do
    [ -f "$file" ] && printf '\n## %s\n\n' "${file#"$WORK"/}" && cat "$file"
  done > "$OUT/results.md"
  tar czf "$OUT/precision-runs.tar.gz" -C "$WORK" . && stamp "packed: $(du -h "$OUT/precision-runs.tar.gz" | cut -f1)"
}
trap pack EXIT
trap 'exit 143' TERM INT

stamp "warm-ups of seeds $FLOOR_SEEDS ($JOBS at a time)"
printf '%s\n' $FLOOR_SEEDS | xargs -P "$JOBS" -I{} timeout "$STEP_SECONDS" "$PY" -c "
import torch; torch.set_num_threads(1)
from mismatch_ctrl.lab.model.warmup import warmup_policy, warmup_preset
w = warmup_policy(warmup_preset('add', 'moe', {}), cache_dir='$CACHE')
print('warm-up seed {}:', w.steps, 'steps, sample accuracy', round(w.sample_accuracy, 2), flush=True)" \
  || stamp "a warm-up failed or took over $STEP_SECONDS s"

stamp "floors: 8 precision pairs x seeds $FLOOR_SEEDS"
printf '%s\n' $FLOOR_SEEDS | xargs -P "$JOBS" -I{} timeout "$STEP_SECONDS" "$PY" benchmarks/lab_mismatch.py --policies moe \
  --seeds {} --modes none bf16 fp16 bf16+train-bf16 fp16+train-fp16 e4m3 e4m3+train-bf16 nvfp4+train-bf16 \
  --repeats 1 --cache-dir "$CACHE" --json "$WORK/floor/seed{}.json" > "$WORK/floor/log.txt" 2>&1 \
  || stamp "a floor run failed (see $WORK/floor/log.txt)"
PAIRS="fp16+train-fp16/bf16+train-bf16 bf16+train-bf16/e4m3+train-bf16 fp16+train-fp16/e4m3+train-bf16
       bf16+train-bf16/bf16 fp16+train-fp16/fp16 e4m3+train-bf16/e4m3"
for subset in all 150,151,152,153,154,155,156,157 158,159,160,161,162,163,164,165; do
  # shellcheck disable=SC2086
  "$PY" benchmarks/lab_floor_pairs.py "$WORK"/floor/seed*.json --pairs $PAIRS \
    $([ "$subset" = all ] || echo "--seeds $subset") > "$WORK/floor/pairs-$subset.md" 2>&1 || true
done
cat "$WORK/floor/pairs-all.md"

stamp "GRPO at K = 4: seeds $DISCOVERY and $UNSEEN, $((JOBS / 2)) runs at a time each"
sweeps=()
for seeds in "$DISCOVERY" "$UNSEEN"; do
  timeout "$SWEEP_SECONDS" "$PY" -m mismatch_ctrl lab --preset precision --steps "$STEPS" --seeds "$seeds" \
    --jobs "$((JOBS / 2 > 0 ? JOBS / 2 : 1))" --device cpu --cache-dir "$CACHE" --out "$WORK/precision-k4-s${seeds%%,*}" \
    > "$WORK/precision-k4-s${seeds%%,*}.log" 2>&1 &
  sweeps+=($!)
done
wait "${sweeps[@]}" || true
DIRS=("$WORK/precision-k4-s${DISCOVERY%%,*}" "$WORK/precision-k4-s${UNSEEN%%,*}")
for dir in "${DIRS[@]}"; do
  tail -10 "$dir.log"
  timeout 60 "$PY" -m mismatch_ctrl lab --report-only --out "$dir" > /dev/null 2>&1 || stamp "no report for $dir"
done
for against in exact grpo@fp16+train-fp16 grpo; do
  "$PY" -m mismatch_ctrl lab compare --against "$against" "${DIRS[@]}" | tee "$WORK/compare-$against.md" || true
done
stamp "done"
