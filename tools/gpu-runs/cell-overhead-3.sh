#!/usr/bin/env bash
# cell-overhead-1.sh again at the session's last run-cell (its header then named a stale .git's commit), four
# repeats. Outcome: it ran past the device's 10-minute limit (four repeats, 600 s) and returned
# nothing but nvidia-smi's line; the figures published are cell-overhead-1's.
# One H100 (nvidia-h100-x1), in a copy of the checkout: what each cell costs besides its training on
# a GPU host (16 CPUs), today's run-cell beside 918ebb4's in one run (the execution section of the
# scaling benchmark: Snakemake's per-job cost, run-cell alone, run-cell around a launched CPU cell of
# 1 and 2 ranks and around a 1-GPU cell). The host's copy has no .git: 918ebb4's files come carried,
# made here with
#   mkdir .before-918ebb4 && git archive 918ebb4 Snakefile workflow profiles envs src | tar -x -C .before-918ebb4
# Writes only OUT/cell-overhead-3.tgz and what the caller tees.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/cell-overhead-3.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 bench/plan_scaling.py --skip planning measured scheduler --cells 150 --repeats 4 \
  --before .before-918ebb4 --out bench-out/plan_scaling > bench-out/plan_scaling.log 2>&1
echo "== plan_scaling exit $?"
tail -22 bench-out/plan_scaling.log
tar czf "$out/cell-overhead-3.tgz" bench-out 2>/dev/null
echo "packed $(tar tzf "$out/cell-overhead-3.tgz" | wc -l) files"
