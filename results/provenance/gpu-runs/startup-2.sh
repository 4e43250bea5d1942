#!/usr/bin/env bash
# One H200 (nvidia-h200), in the checkout, after the bytecode cache and the ranks' fast exit
# (startup-1.sh measured what they save): the baseline study's one-GPU cells as `snakemake -c all`
# runs them (published), the overhead benchmark (is the cell still within 2% of the bare loop?),
# and the same cells once more (a rerun to compare). Writes only OUT/startup-2.tgz and what the
# caller tees (the device returns at most 8 files).
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/startup-2.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
cells=(results/runs/baseline/strategy~single__model~gpt2-124m__gpus~1__micro_batch~32/metrics.json
       results/runs/baseline/strategy~single__model~gpt2-350m__gpus~1__micro_batch~16/metrics.json)
for run in 1 2; do
  started=$(date +%s)
  snakemake -c all results/tables/baseline.md --forcerun "${cells[@]}" > "bench-out/snakemake-$run.log" 2>&1
  echo "== snakemake run $run: $(( $(date +%s) - started )) s"
  mkdir -p "bench-out/snakemake-$run" && cp -r results/runs/baseline "bench-out/snakemake-$run/"
  [ "$run" = 1 ] && { python3 bench/overhead.py --rounds 3 --out bench-out/overhead > bench-out/overhead.log 2>&1;
                      tail -6 bench-out/overhead.log; }
done
grep -h "teardown:" results/runs/baseline/*/log
trainbench compare bench-out/snakemake-1 bench-out/snakemake-2 2>&1 | head -12
trainbench cost baseline 2>&1 | head -12
tar czf "$out/startup-2.tgz" bench-out results/runs/baseline results/tables/baseline.* results/plots/baseline_* \
  .snakemake/log 2>/dev/null
echo "packed $(tar tzf "$out/startup-2.tgz" | wc -l) files"
