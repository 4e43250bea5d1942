#!/usr/bin/env bash
# One H200 (nvidia-h200), in the checkout: what the ranks' CPU threads do to an offloaded cell. The
# holdout study's ZeRO-2 + optimizer-offload cell (GPT-2.5B, micro batch 16, SDPA), run by Snakemake
# as before the fix (cpus_per_rank=1 through --set-resources: the one thread Snakemake's export gave
# the ranks), then as now (its 16). Timing capped at 6 windows. Writes OUT/threads-1.tgz only.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/threads-1.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
cell=results/runs/holdout/framework~deepspeed__strategy~zero2__micro_batch~16__offload_optimizer~true__attention~sdpa
timing=min_windows=6,target_ci=0.02,max_timed_s=20,min_window_s=0.2
for threads in 1 16; do
  started=$(date +%s)
  snakemake -c all "$cell/metrics.json" --forcerun "$cell/metrics.json" \
    --set-resources "train_cell:cpus_per_rank=$threads" "train_cell:timing=$timing" > "bench-out/threads-$threads.log" 2>&1
  echo "== cpus_per_rank $threads: $(( $(date +%s) - started )) s, exit status $?"
  mkdir -p "bench-out/threads-$threads" && cp -r "$cell" "bench-out/threads-$threads/"
  python3 -c "
import json, sys; d = json.load(open('$cell/metrics.json')); m = d['metrics']
print(d['status'], 'OMP_NUM_THREADS', d['provenance']['environment'].get('OMP_NUM_THREADS'),
      'step', m['step_time_s'], 'ci', m['step_time_s_ci'], 'phases', m['phases_s'])"
done
tar czf "$out/threads-1.tgz" bench-out 2>/dev/null
echo "packed $(tar tzf "$out/threads-1.tgz" | wc -l) files"
