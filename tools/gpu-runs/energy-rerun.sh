#!/usr/bin/env bash
# One GPU host, in the checkout: published one-GPU studies run again by the pipeline, every cell
# forced (--forcerun train_cell), so that their results gain what the pipeline now measures (NVML
# energy per step and per token, power, clocks, topology) and their history a second run to set
# the first against (`trainbench compare --history`). --keep-going; Snakemake is stopped at LIMIT
# seconds so that what finished still comes back (cells are written whole or not at all).
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=540 bash tools/gpu-runs/energy-rerun.sh STUDY ...
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
targets=() paths=()
for study in "$@"; do
  targets+=("results/tables/$study.md")
  paths+=("results/runs/$study" "results/history/$study" "results/tables/$study".*)
done
started=$(date +%s)
# forced past the memory model's verdict, as the published cells were: an OOM stays a measured OOM
TRAINBENCH_FORCE_INFEASIBLE=1 timeout -s INT "${LIMIT:-540}" snakemake -c all --keep-going "${scheduler[@]}" --forcerun train_cell -- "${targets[@]}" \
  > bench-out/snakemake.log 2>&1
status=$?  # snakemake's (124 where the limit stopped it), before anything else sets $?
echo "== snakemake: $(( $(date +%s) - started )) s, exit status $status"
grep -E "trainbench .* wrote|received SIGINT" bench-out/snakemake.log | sed 's/results\/runs\///' | cut -c1-200
# PACK_ALSO: what a script that ran something before this one wants brought back too
python3 tools/gpu-runs/pack_out.py "$out" bench-out "${paths[@]}" ${PACK_ALSO:-} .snakemake/log
