#!/usr/bin/env bash
# One GPU (nvidia-h200), in the checkout: does the host's pace while a cell runs follow its step? A
# process beside the cells times the same fixed piece of Python as provenance's host_pace_ms, once
# every 0.25 s (one timing each, not the fastest of several), into $OUT/pace-samples.txt ("<unix
# time> <ms>"), while host-profiles.sh runs CELLS; pace_during_runs.py then sets each run's step time
# beside the samples of its timed windows and beside its start-of-cell host_pace_ms.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash results/provenance/gpu-runs/pace-during-runs.sh CELLS
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=results/provenance/gpu-runs
{ python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
python3 -I -S - > $OUT/pace-samples.txt <<'PY' &
import sys, time
def work(calls):
    table, total = {}, 0
    for i in range(calls):
        table[i & 255] = table.get(i & 255, 0) + len((i, i + 1))
        total += table[i & 255]
    return total
while True:
    started = time.perf_counter()
    work(20_000)
    print(f"{time.time():.3f} {(time.perf_counter() - started) * 1e3:.3f}", flush=True)
    time.sleep(0.25)
PY
sampler=$!
TIMING= BUDGET_S=${BUDGET_S:-420} bash $here/host-profiles.sh "${1:?a file of cells}"
kill $sampler
python3 $here/pace_during_runs.py $OUT/pace-samples.txt bench-out/profiles/*/*/metrics.json | tee $OUT/pace-during-runs.txt
