#!/usr/bin/env bash
# One H200 (nvidia-h200), in the checkout: what the bytecode cache and the ranks' fast exit save of a
# cell's wall time (issue 18). The baseline study's two one-GPU cells, first on empty caches, then
# re-run in rounds of three variants in alternating order, so that drift cancels:
#   before    ranks compile torch's sources each time (no bytecode cache) and exit through the
#             interpreter's shutdown: the pipeline as it was
#   bytecode  the bytecode cache (launch.cache_environment), the interpreter's shutdown
#   after     the bytecode cache and the fast exit: the pipeline as it is now
# Everything it wrote goes into OUT/startup-1.tgz.
#   OUT=<dir> bash tools/gpu-runs/startup-1.sh [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
rounds=${1:-2}
bash tools/install_offline.sh .whl > "$out/install.log" 2>&1 || { tail "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-} PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-}"
cells=(results/runs/baseline/strategy~single__model~gpt2-124m__gpus~1__micro_batch~32/metrics.json
       results/runs/baseline/strategy~single__model~gpt2-350m__gpus~1__micro_batch~16/metrics.json)
started=$(date +%s)
echo "== snakemake -c all results/tables/baseline.md --forcerun (caches empty)"
snakemake -c all results/tables/baseline.md --forcerun "${cells[@]}" > "$out/first-run.log" 2>&1
echo "== first run: $(( $(date +%s) - started )) s"
mkdir -p bench-out/first && cp -r results/runs/baseline bench-out/first/
for round in $(seq "$rounds"); do
  order=(before bytecode after); (( round % 2 == 0 )) && order=(after bytecode before)
  for variant in "${order[@]}"; do
    case $variant in
      before) env=(PYTHONPYCACHEPREFIX=/tmp/no-bytecode TRAINBENCH_WORKER_EXIT=interpreter) ;;
      bytecode) env=(TRAINBENCH_WORKER_EXIT=interpreter) ;;
      after) env=() ;;
    esac
    started=$(date +%s)
    env "${env[@]}" snakemake -c all results/tables/baseline.md --forcerun "${cells[@]}" \
      > "$out/$variant-$round.log" 2>&1
    echo "== round $round $variant: $(( $(date +%s) - started )) s"
    mkdir -p "bench-out/$variant-$round" && cp -r results/runs/baseline "bench-out/$variant-$round/"
  done
done
grep -h "teardown:" results/runs/baseline/*/log
python3 - <<'PY'
import glob, json, statistics
rows = {}
for path in sorted(glob.glob("bench-out/*/baseline/*/metrics.json")):
    variant = path.split("/")[1].rsplit("-", 1)[0]
    m = json.load(open(path))
    model = m["params"]["model"]
    rows.setdefault((model, variant), []).append(m["metrics"])
phases = ["launch", "imports", "setup", "first_step", "warmup", "timed", "teardown"]
print(f"{'cell':<10} {'variant':<9} {'runs':>4} " + " ".join(f"{p:>10}" for p in phases)
      + f" {'wall':>6} {'share':>6} {'step ms':>8}")
for (model, variant), ms in sorted(rows.items()):
    med = lambda f: statistics.median(f(m) for m in ms)
    print(f"{model:<10} {variant:<9} {len(ms):>4} "
          + " ".join(f"{med(lambda m: m['phases_s'][p]):>10.2f}" for p in phases)
          + f" {med(lambda m: m['wall_time_s']):>6.1f} {med(lambda m: m['timed_share']):>6.3f}"
          + f" {1000 * med(lambda m: m['step_time_s']):>8.1f}")
PY
echo "== the pipeline's own processes: importing what run-cell imports"
for i in 1 2 3; do
  python3 -c 'import time; t=time.perf_counter(); import trainbench.cli, trainbench.execute.cellrun; print(f"as is      {time.perf_counter()-t:.2f} s")'
  env PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=/tmp/cli-bytecode python3 -c 'import time; t=time.perf_counter(); import trainbench.cli, trainbench.execute.cellrun; print(f"cached     {time.perf_counter()-t:.2f} s")'
done
tar czf "$out/startup-1.tgz" bench-out results/runs/baseline results/tables/baseline.* results/plots/baseline_* \
  .snakemake/log 2>/dev/null
echo "packed $(tar tzf "$out/startup-1.tgz" | wc -l) files"
