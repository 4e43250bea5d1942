#!/usr/bin/env bash
# One H200 (nvidia-h200), in the checkout: the baseline study as a newcomer runs it, then the same
# cells again on warm compile caches (a rerun: trainbench compare, and what the caches save), then
# the overhead benchmark on both one-GPU cells. Everything it wrote goes into OUT/baseline-2.tgz.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/baseline-2.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
bash tools/install_offline.sh .whl > "$out/install.log" 2>&1 || { tail "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
cells=(results/runs/baseline/strategy~single__model~gpt2-124m__gpus~1__micro_batch~32/metrics.json
       results/runs/baseline/strategy~single__model~gpt2-350m__gpus~1__micro_batch~16/metrics.json)
started=$(date +%s)
echo "== snakemake -c all (a newcomer's first run; compile caches empty)"
snakemake -c all 2>&1 | tee "$out/first-run.log" | grep -E "trainbench|window|Finished|steps \(|error" | tail -30
echo "== first run: $(( $(date +%s) - started )) s"
mkdir -p bench-out/cold && cp -r results/runs/baseline bench-out/cold/
started=$(date +%s)
echo "== the same cells again (warm compile caches)"
snakemake -c all results/tables/baseline.md --forcerun "${cells[@]}" 2>&1 | tee "$out/second-run.log" \
  | grep -E "wrote|error" | tail -10
echo "== second run: $(( $(date +%s) - started )) s"
mkdir -p bench-out/warm && cp -r results/runs/baseline bench-out/warm/
trainbench compare bench-out/cold bench-out/warm 2>&1 | head -12
python3 bench/overhead.py --rounds 2 --out bench-out/overhead 2>&1 | tail -8
tar czf "$out/baseline-2.tgz" bench-out results/runs/baseline results/tables/baseline.* results/plots/baseline_* \
  .snakemake/log 2>/dev/null
echo "packed $(tar tzf "$out/baseline-2.tgz" | wc -l) files"
