#!/usr/bin/env bash
# One H100 (nvidia-h100-x1), in a copy of the checkout: what each cell costs besides its training on
# a GPU host (16 CPUs), today's run-cell beside 918ebb4's in one run (the execution section of the
# scaling benchmark: Snakemake's per-job cost, run-cell alone, run-cell around a launched CPU cell of
# 1 and 2 ranks and around a 1-GPU cell). The host's copy has no .git: 918ebb4's files come carried,
# made here with
#   mkdir .before-918ebb4 && git archive 918ebb4 Snakefile workflow profiles envs src | tar -x -C .before-918ebb4
# Writes only OUT/cell-overhead-1.tgz and what the caller tees. (Run again at 9aafb57 with
# --repeats 4 to have the header name its commit, it ran past the device's 10-minute limit and
# returned nothing: the published figures are this run's, of c9c86f9.)
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/cell-overhead-1.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 bench/plan_scaling.py --skip planning measured scheduler --cells 150 --repeats 3 \
  --before .before-918ebb4 --out bench-out/plan_scaling > bench-out/plan_scaling.log 2>&1
echo "== plan_scaling exit $?"
tail -22 bench-out/plan_scaling.log
tar czf "$out/cell-overhead-1.tgz" bench-out 2>/dev/null
echo "packed $(tar tzf "$out/cell-overhead-1.tgz" | wc -l) files"
