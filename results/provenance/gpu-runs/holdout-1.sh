#!/usr/bin/env bash
# One H200 (nvidia-h200), in the checkout: the holdout study's cells, whose predictions were committed
# before they ran (results/predictions/holdout-h200.csv), every one run even where the memory model
# says it will not fit (TRAINBENCH_FORCE_INFEASIBLE=1: the verdict is what is being tested). The
# cells given as arguments (default: all); --keep-going, and the command stops Snakemake at LIMIT
# seconds so that what finished still comes back. Writes OUT/holdout-1.tgz only.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=480 bash tools/gpu-runs/holdout-1.sh [TARGET ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
free -g | head -2; nproc
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(results/tables/holdout.md)
started=$(date +%s)
TRAINBENCH_FORCE_INFEASIBLE=1 timeout -s INT "${LIMIT:-480}" snakemake -c all --keep-going "${targets[@]}" \
  > bench-out/snakemake.log 2>&1
rc=$?
echo "== snakemake: $(( $(date +%s) - started )) s, exit status $rc"
grep -E "^\[holdout/|trainbench:" bench-out/snakemake.log | grep -vE "window|warm-up" | tail -40
python3 bench/predicted_then_run.py results/predictions/holdout-h200.csv
tar czf "$out/holdout-1.tgz" bench-out results/runs/holdout results/tables/holdout.* results/plots/holdout_* \
  .snakemake/log 2>/dev/null
echo "packed $(tar tzf "$out/holdout-1.tgz" | wc -l) files"
