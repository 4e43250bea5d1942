#!/usr/bin/env bash
# One GPU host, in the checkout: one published offloaded cell run again by Snakemake at other CPU
# threads a rank (cpus_per_rank through --set-resources), each run alone, timing capped as the
# thread study's (results/bench/threads): a curve the time model never fits, to check its thread
# term against (bench/time_model.py --held-out results/bench/threads). Each run's cell folder is
# kept as OUT/threads/cpus-N/; OUT/threads.tgz holds them. PROFILE_STEPS=N profiles N steps after
# the timed ones (timing's profile_steps): each run's breakdown is in its metrics.json, and the host's
# ops by thread count are set side by side (bench/top_kernels.py --host) in OUT/top_kernels.txt; the
# traces stay behind.
#   [PROFILE_STEPS=3] TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/threads-sweep.sh STUDY/CELL THREADS...
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
key=${1:?usage: threads-sweep.sh STUDY/CELL THREADS...}
shift
cell=results/runs/$key
[ -e "$cell/metrics.json" ] || { echo "no cell $cell"; exit 2; }
mkdir -p bench-out && rm -rf bench-out/threads  # a sweep before this one on the same machine stays out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
source tools/gpu-runs/scheduler.sh
timing=min_windows=6,target_ci=0.02,max_timed_s=20,min_window_s=0.2${PROFILE_STEPS:+,profile_steps=$PROFILE_STEPS}
traces=()
for threads in "$@"; do
  started=$(date +%s)
  snakemake -c all "${scheduler[@]}" "$cell/metrics.json" --forcerun "$cell/metrics.json" \
    --set-resources "train_cell:cpus_per_rank=$threads" "train_cell:timing=$timing" \
    > "bench-out/snakemake-$threads.log" 2>&1
  status=$?
  echo "== cpus_per_rank $threads: $(( $(date +%s) - started )) s, exit status $status"
  mkdir -p "bench-out/threads/cpus-$threads" && cp -r "$cell" "bench-out/threads/cpus-$threads/"
  python3 -c "
import json; d = json.load(open('$cell/metrics.json')); m = d['metrics']
print(d['status'], 'OMP_NUM_THREADS', d['provenance']['environment'].get('OMP_NUM_THREADS'),
      'step', m.get('step_time_s'), 'ci', m.get('step_time_s_ci'), 'host pace', d['provenance'].get('host_pace_ms'))
if m.get('breakdown'): print('breakdown, s a step:', m['breakdown']['parts_s'], 'copies', m['breakdown']['copies_s'])"
  if [ -f "$cell/profile/rank0.json.gz" ]; then
    mkdir -p bench-out/traces && mv "$cell/profile/rank0.json.gz" "bench-out/traces/cpus-$threads.json.gz"
    traces+=("bench-out/traces/cpus-$threads.json.gz")
  fi
done
[ ${#traces[@]} -gt 0 ] && python3 bench/top_kernels.py "${traces[@]}" --top 10 --host 15 2>&1 | tee "$out/top_kernels.txt"
tar czf "$out/threads.tgz" --exclude=profile -C bench-out threads
echo "packed $(tar tzf "$out/threads.tgz" | wc -l) files"
