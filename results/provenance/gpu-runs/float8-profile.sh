#!/usr/bin/env bash
# One H200 (issue 34): why float8 slows an emulated FSDP2 rank of GPT-5.8B (rank 0 of 8, compiled)
# 1.43x where it speeds up one GPU's GPT-2.5B. Both cells profiled by the pipeline
# (`trainbench profile`, 3 steps after the timed ones), then their kernels set side by side
# (bench/top_kernels.py), on the host, so that the answer comes back without the traces.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/float8-profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
cell=strategy~fsdp__model~gpt-5.8b__gpus~8__micro_batch~4__emulate~true__float8
traces=()
for recipe in null tensorwise; do
  started=$(date +%s)
  timeout -s INT "${LIMIT:-270}" python3 -m trainbench profile float8 "${cell}~${recipe}__compile~true" \
    > "bench-out/profile-$recipe.log" 2>&1
  status=$?  # the profile's, before anything else sets $?
  echo "== profile $recipe: $(( $(date +%s) - started )) s, exit status $status"
  grep -vE "window|warm-up" "bench-out/profile-$recipe.log" | tail -4 | cut -c1-240
  trace="results/runs/float8/${cell}~${recipe}__compile~true/profile/rank0.json.gz"
  [ -f "$trace" ] && traces+=("$trace")
done
[ ${#traces[@]} -gt 0 ] && python3 bench/top_kernels.py "${traces[@]}" --top 25 --host 8 \
  --json bench-out/top_kernels.json 2>&1 | tee bench-out/top_kernels.txt
python3 tools/gpu-runs/pack_out.py "$out" bench-out results/runs/float8 results/history/float8 .snakemake/log
