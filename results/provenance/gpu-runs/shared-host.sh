#!/usr/bin/env bash
# A host of 2 GPUs (nvidia-h200-x2), in the checkout: what a neighbour on the other GPU does to a timed
# cell. Two of baseline's cells through `trainbench run-cell`, each alone, then two copies at once on
# the two GPUs (TRAINBENCH_SHARE_HOST=1), and the host-bound one alone again (drift): FSDP2 350M's
# rank 0, emulated (its GPU waits on its host), and the one-GPU GPT-2 124M cell (GPU-bound). Each run
# times for 30 s at most. Prints each run's step time and interval, GPU power and host_alone.
# Arguments: which of the two (fsdp350m single124m; default both); DRIFT=0 skips the second alone run.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/shared-host.sh [fsdp350m] [single124m]
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
timing=min_windows=6,target_ci=0.02,max_timed_s=30,min_window_s=0.2,profile_steps=0,memory_snapshot=0
params() {  # a published baseline cell's parameters; $2=emulate: its rank 0 emulated
  if [ "$2" = emulate ]; then python3 tools/gpu-runs/cell_params.py baseline "$1" --emulate-rank 0
  else python3 tools/gpu-runs/cell_params.py baseline "$1"; fi
}
run() {  # cell params run-name
  trainbench run-cell --study baseline --cell "$1" --params "$2" --cpus-per-rank 8 --runtime-min 8 \
    --timing "$timing" --output "bench-out/shared/$3/metrics.json" > "bench-out/shared-$3.log" 2>&1
}
for spec in "strategy~fsdp__model~gpt2-350m__gpus~2__micro_batch~16 emulate fsdp350m" \
            "strategy~single__model~gpt2-124m__gpus~1__micro_batch~32 real single124m"; do
  read -r cell how name <<< "$spec"
  [ $# -eq 0 ] || [[ " $* " == *" $name "* ]] || continue
  p=$(params "$cell" "$how")
  begun=$(date +%s)
  run "$cell" "$p" "$name-alone-1"
  TRAINBENCH_SHARE_HOST=1 run "$cell" "$p" "$name-pair-a" &
  TRAINBENCH_SHARE_HOST=1 run "$cell" "$p" "$name-pair-b" &
  wait
  [ "$name" = fsdp350m ] && [ "${DRIFT:-1}" = 1 ] && run "$cell" "$p" "$name-alone-2"
  echo "== $name: $(( $(date +%s) - begun )) s"
done
python3 - <<'PYTHON'
import json
from pathlib import Path
for path in sorted(Path("bench-out/shared").glob("*/metrics.json")):
    m = json.loads(path.read_text())
    x, p = m.get("metrics") or {}, m["provenance"]
    ci = x.get("step_time_s_ci") or [0, 0]
    print(f"{path.parent.name:24s} {m['status']:4s} step {x.get('step_time_s', 0) * 1e3:7.1f} ms "
          f"[{ci[0] * 1e3:.1f}, {ci[1] * 1e3:.1f}] power {x.get('gpu_power_w')} W "
          f"GPU {p.get('cuda_visible_devices')} alone {p.get('host_alone')} {p['started'][11:19]}-{p['ended'][11:19]}")
PYTHON
python3 tools/gpu-runs/pack_out.py "$out" bench-out ${PACK_ALSO:-}  # PACK_ALSO: what a run before it wrote
