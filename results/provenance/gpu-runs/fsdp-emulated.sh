#!/usr/bin/env bash
# One GPU host (nvidia-h200), in the checkout: the baseline's two-GPU FSDP2 cells (GPT-2 124M and 350M)
# as rank 0 of their 2 through the fake process group (emulate: true), one after the other, each with
# an allocator snapshot of its run (memory_snapshot) and 3 profiled steps after its timed ones: where
# the memory the memory model does not predict goes (bench/memory_model.py --snapshots), and where the
# step time goes without communication (metrics.breakdown). Not a study: the results stay in bench-out.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/fsdp-emulated.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
timing=min_windows=6,target_ci=0.02,max_timed_s=30,min_window_s=0.2,profile_steps=3,memory_snapshot=1
for size in 124m:32 350m:16; do
  cell="strategy~fsdp__model~gpt2-${size%:*}__gpus~2__micro_batch~${size#*:}"
  params=$(python3 tools/gpu-runs/cell_params.py baseline "$cell" --emulate-rank 0)
  begun=$(date +%s)
  trainbench run-cell --study baseline --cell "$cell" --params "$params" --cpus-per-rank 16 --runtime-min 8 \
    --timing "$timing" --output "bench-out/emulated/$cell/metrics.json" > "bench-out/emulated-${size%:*}.log" 2>&1
  echo "== $cell emulated: exit $?, $(( $(date +%s) - begun )) s"
  python3 - "bench-out/emulated/$cell/metrics.json" <<'PYTHON'
import json, sys
m = json.load(open(sys.argv[1]))
print(m["status"], m.get("reason"))
x = m.get("metrics") or {}
print("step", x.get("step_time_s"), x.get("step_time_s_ci"), "alloc", x.get("torch_peak_allocated_mib"),
      "reserved", x.get("torch_peak_reserved_mib"), "power", x.get("gpu_power_w"))
print("breakdown", json.dumps(x.get("breakdown")))
PYTHON
done
python3 bench/memory_model.py --snapshots bench-out/emulated 2>&1 | tee bench-out/snapshots.txt
python3 tools/gpu-runs/pack_out.py "$out" bench-out
