#!/usr/bin/env bash
# A host of 4 GPUs (nvidia-h200-x4), in the checkout: the emulation_check study, each cell run whole
# and as its heaviest rank emulated on one GPU, then every emulated rank set beside the real rank of
# its number (bench/emulated_vs_real.py; issue 35). --keep-going; Snakemake is stopped at LIMIT seconds
# so that what finished comes back: run it again (with the results it brought back committed) and it
# goes on with the cells still missing, 37 cells in all, 2 or 3 commands of 10 minutes.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=520 bash tools/gpu-runs/emulated-vs-real.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
nvidia-smi topo -m
started=$(date +%s)
timeout -s INT "${LIMIT:-520}" snakemake -c all --keep-going "${scheduler[@]}" results/tables/emulation_check.md \
  > bench-out/snakemake.log 2>&1
status=$?  # snakemake's (124 where the limit stopped it), before anything else sets $?
echo "== snakemake: $(( $(date +%s) - started )) s, exit status $status"
grep -E "trainbench .* wrote|received SIGINT" bench-out/snakemake.log | sed 's/results\/runs\///' | cut -c1-200
python3 bench/emulated_vs_real.py results/runs/emulation_check --json bench-out/emulated_vs_real.json \
  | tee bench-out/emulated_vs_real.txt
python3 tools/gpu-runs/pack_out.py "$out" bench-out results/runs/emulation_check results/history/emulation_check \
  results/tables/emulation_check.* .snakemake/log
