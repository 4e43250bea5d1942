#!/usr/bin/env bash
# One H200: the float8 study's compiled GPT-2.5B rowwise cell through the pipeline (its prediction is
# committed in results/predictions/float8-h200.csv), then the compiled tensorwise cell again with the
# GPU allocator's history recorded (`trainbench profile --memory`), so the memory model's float8
# activations can be set against what the GPU's compiled graph keeps.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/float8-5.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
rowwise=results/runs/float8/model~gpt-2.5b__micro_batch~8__float8~rowwise__compile~true/metrics.json
started=$(date +%s)
timeout -s INT 300 snakemake -c all --keep-going "$rowwise" > bench-out/snakemake.log 2>&1
echo "== rowwise: $(( $(date +%s) - started )) s, exit status $?"
grep -E "^\[float8/|trainbench:" bench-out/snakemake.log | grep -vE "window|warm-up" | tail -15
started=$(date +%s)
timeout -s INT 230 python3 -m trainbench profile float8 model~gpt-2.5b__micro_batch~8__float8~tensorwise__compile~true \
  --memory > bench-out/profile.log 2>&1
echo "== profile --memory: $(( $(date +%s) - started )) s, exit status $?"
grep -vE "window|warm-up" bench-out/profile.log | tail -15
python3 bench/predicted_then_run.py results/predictions/float8-h200.csv
python3 tools/gpu-runs/pack_out.py "$out" bench-out results/runs/float8 results/history/float8 .snakemake/log
