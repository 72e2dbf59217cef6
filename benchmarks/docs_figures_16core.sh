#!/usr/bin/env bash
# Redraw the docs figures that come from CPU lab runs, with today's plot styles, from the commands their pages name,
# on one 16-core machine (the lab's runs are CPU runs; this machine's kernels give other trajectories than the ones
# the pages' tables were measured on, so a redrawn figure goes with its own report.md, not with the old tables).
#   overview      docs/lab-overview.png   = OUT of `lab --preset demo-seeds` + `--methods dcgrpo_floor_guard` (lab.md)
#   offpolicy-k4  docs/lab-offpolicy-k4.png = plots/frontier.png of `lab --preset offpolicy` (lab-offpolicy.md)
#   frontier      docs/lab-frontier.png   = plots/frontier.png of `lab --preset frontier` (lab-frontier.md)
# Sizes: the 2-core times of these presets are in docs/times.md (the CPU decides: 2026-11-28's took up to 2.2x as
# long as 2026-11-26's). The 16-core minutes are estimates, those 2-core times divided by 8 (16 cores, not 2): about
# 1.5-3.5 (overview), 3-5 (offpolicy-k4) and 5-10 (frontier); the default FIGURES="overview offpolicy-k4" should fit
# one 9-minute command, with little to spare on a CPU as slow as 2026-11-28's.
# OUT receives per figure its PNG (named as in docs/), report.md and summary.json (a device machine returns at most
# 8 files), and log.txt.
# Usage: FIGURES="overview offpolicy-k4" bash benchmarks/docs_figures_16core.sh OUT   (run from the repository root)
# A smoke test: FIGURES=overview EXTRA="--seeds 230 --steps 2" JOBS=2 bash benchmarks/docs_figures_16core.sh OUT
set -euo pipefail
case "${1:-}" in  # --help: the header above; an option where OUT belongs: refused before any work
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "benchmarks/docs_figures_16core.sh: OUT must be a folder, not the option $1 (--help for the usage)" >&2; exit 2 ;;
esac
OUT=${1:?usage: bash benchmarks/docs_figures_16core.sh OUT}
PY=${PYTHON:-python3}
JOBS=${JOBS:-16}
FIGURES=${FIGURES:-overview offpolicy-k4}
WORK=${WORK:-/tmp/mismatch_ctrl_docs_figures}
EXTRA=${EXTRA:-}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/log.txt") 2>&1
stamp() { echo "[$(date +%T)] $*"; }
lab() { "$PY" -m mismatch_ctrl lab --jobs "$JOBS" "$@"; }
keep() {  # keep FIGURE RUN_DIR PLOT: the figure under its docs name, with the report and summary it came from
  cp "$2/plots/$3" "$OUT/lab-$1.png" && cp "$2/report.md" "$OUT/$1-report.md" && cp "$2/summary.json" "$OUT/$1-summary.json"
}
for figure in $FIGURES; do
  start=$SECONDS
  case $figure in
    overview)
      # shellcheck disable=SC2086
      lab --preset demo-seeds --out "$WORK/lab-seeds" $EXTRA
      # shellcheck disable=SC2086
      lab --preset demo-seeds --methods dcgrpo_floor_guard --out "$WORK/lab-seeds" $EXTRA
      lab --report-only --out "$WORK/lab-seeds"
      keep overview "$WORK/lab-seeds" overview.png ;;
    offpolicy-k4)
      # shellcheck disable=SC2086
      lab --preset offpolicy --out "$WORK/offpolicy-k4" $EXTRA
      keep offpolicy-k4 "$WORK/offpolicy-k4" frontier.png ;;
    frontier)
      # shellcheck disable=SC2086
      lab --preset frontier --out "$WORK/frontier" $EXTRA
      keep frontier "$WORK/frontier" frontier.png ;;
    *) echo "unknown figure $figure (overview, offpolicy-k4, frontier)" >&2; exit 2 ;;
  esac
  stamp "$figure: $((SECONDS - start)) s with --jobs $JOBS on $(nproc --all) cores"
done
