#!/usr/bin/env bash
# A host of 4 GPUs (nvidia-h200-x4), in the checkout, one command:
# 1. emulation_check's three pp 2 cells forced again, the real one beside its emulated last stage and
#    rank 3, to measure the fix of cf4cd82 (a later stage's receive buffer held zeros, its optimizer
#    skipped every step and its states were never allocated): bench/emulated_vs_real.py pairs them.
# 2. the 4-GPU studies' cells forced again in the time left by energy-rerun.sh (energy per step and
#    per token, issue 33), which brings back both phases' results.
# Snakemake is stopped at LIMIT seconds in all; cells are written whole or not at all.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=540 bash tools/gpu-runs/x4-pp-and-energy.sh STUDY ...
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
begun=$(date +%s)
pp=(results/runs/emulation_check/*__pp~2__*/metrics.json)
timeout -s INT "${LIMIT:-540}" snakemake -c all --keep-going "${scheduler[@]}" --forcerun train_cell -- "${pp[@]}" \
  > bench-out/snakemake-pp.log 2>&1
status=$?  # snakemake's, before anything else sets $?
echo "== pp cells: $(( $(date +%s) - begun )) s, exit status $status"
grep -E "trainbench .* wrote|received SIGINT" bench-out/snakemake-pp.log | sed 's/results\/runs\///' | cut -c1-200
python3 bench/emulated_vs_real.py results/runs/emulation_check --json bench-out/emulated_vs_real.json \
  > bench-out/emulated_vs_real.txt 2>&1; grep -E "pp~2|pp 2" bench-out/emulated_vs_real.txt | cut -c1-220
left=$(( ${LIMIT:-540} - ($(date +%s) - begun) ))
(( left > 0 )) || left=1  # timeout 0 would mean no limit at all
LIMIT=$left PACK_ALSO="results/runs/emulation_check results/history/emulation_check" \
  bash tools/gpu-runs/energy-rerun.sh "$@"
