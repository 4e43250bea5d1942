#!/usr/bin/env bash
# One H200 (nvidia-h200): emulated ranks of the campaigns' large rows through the pipeline
# (docs/emulation.md), the targets of the given files in order, within LIMIT seconds; then a
# summary line per result. Writes OUT/<name>.tgz (results/runs of the three studies, the logs).
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=540 NAME=emulated-1 bash tools/gpu-runs/emulated-1.sh FILE...
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
name=${NAME:-emulated-1}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions TORCH_CUDA_ARCH_LIST=9.0
bash tools/gpu-host-run.sh .whl "${LIMIT:-540}" "$out/$name.tgz" "$@" > "$out/$name.log" 2>&1
grep -E "^\[trainbench|^== |packed|Error|error:" "$out/$name.log" | grep -vE "window|warm-up" | tail -60
python3 - "$@" <<'PY'
import json, sys
from pathlib import Path
for file in sys.argv[1:]:
    for line in Path(file).read_text().splitlines():
        target = line.split("#")[0].strip()
        if not target or not Path(target).exists():
            print("missing", target[:140]) if target else None
            continue
        d = json.loads(Path(target).read_text()); m = d["metrics"]; e = d.get("emulation") or {}
        print(d["status"], d["cell_id"][:110], "| used", m.get("gpu_mem_used_mib"), "alloc",
              m.get("torch_peak_allocated_mib"), "step", m.get("step_time_s"), "pred",
              d["predicted"].get("gpu_mem_mib"), "| host", m.get("host_mem_peak_mib"), "wall", m.get("wall_time_s"),
              "| written", e.get("outputs_written_by_trainbench"), "|", (d.get("reason") or "")[:160])
PY
