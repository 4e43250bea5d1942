#!/usr/bin/env bash
# One H200 (nvidia-h200), in the checkout: the holdout study's offloaded cells with the CPU threads
# fixed (b222dfd: 16 per rank, where holdout-1 ran them on the one Snakemake exported). The cells
# given as arguments run, forced where a result exists, even where the memory model says they will not
# fit (TRAINBENCH_FORCE_INFEASIBLE=1: the verdict is what is tested). With THREADS="2 4 8", the first
# target then runs again at each of those cpus_per_rank (timing capped), its files kept apart: the
# threads' curve in the same run. Stops Snakemake at LIMIT seconds. Writes OUT/holdout-2.tgz only.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=480 [THREADS="2 4 8"] bash tools/gpu-runs/holdout-2.sh TARGET ...
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc
started=$(date +%s)
TRAINBENCH_FORCE_INFEASIBLE=1 timeout -s INT "${LIMIT:-480}" snakemake -c all --keep-going "$@" --forcerun "$@" \
  > bench-out/snakemake.log 2>&1
echo "== snakemake: $(( $(date +%s) - started )) s, exit status $?"
grep -E "^\[holdout/|trainbench:" bench-out/snakemake.log | grep -vE "window|warm-up" | tail -30
summary() {  # status, threads, step time and interval, phases of one metrics.json
  python3 -c "
import json, sys; d = json.load(open(sys.argv[1])); m = d['metrics']
print(d['status'], 'OMP_NUM_THREADS', d['provenance']['environment'].get('OMP_NUM_THREADS'),
      'step', m.get('step_time_s'), 'ci', m.get('step_time_s_ci'), 'phases', m.get('phases_s'))" "$1"
}
for target in "$@"; do echo "$target"; summary "$target"; done
cell=$(dirname "$1")
timing=min_windows=6,target_ci=0.02,max_timed_s=20,min_window_s=0.2
if [ -n "${THREADS:-}" ]; then
  mkdir -p bench-out/threads-own && cp -r "$cell" bench-out/threads-own/  # as run at its cpus_per_rank
  for threads in $THREADS; do
    started=$(date +%s)
    timeout -s INT "${LIMIT:-480}" snakemake -c all "$1" --forcerun "$1" --set-resources \
      "train_cell:cpus_per_rank=$threads" "train_cell:timing=$timing" > "bench-out/threads-$threads.log" 2>&1
    echo "== cpus_per_rank $threads: $(( $(date +%s) - started )) s, exit status $?"
    mkdir -p "bench-out/threads-$threads" && cp -r "$cell" "bench-out/threads-$threads/"
    summary "$1"
  done
  # the cell's published result stays the one made at its own cpus_per_rank
  rm -r "$cell" && cp -r "bench-out/threads-own/$(basename "$cell")" "$cell"
fi
python3 bench/predicted_then_run.py results/predictions/holdout-h200.csv
tar czf "$out/holdout-2.tgz" bench-out results/runs/holdout results/tables/holdout.* .snakemake/log 2>/dev/null
echo "packed $(tar tzf "$out/holdout-2.tgz" | wc -l) files"
