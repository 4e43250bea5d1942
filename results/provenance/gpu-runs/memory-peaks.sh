#!/usr/bin/env bash
# One GPU (nvidia-h200), in the checkout: published cells the memory model under-counts, each run again
# alone (a multi-GPU cell as its rank 0, emulated) with the allocator's history recorded, and what is
# live at each run's peak grouped by where it was allocated (memory_peaks.py): what the model misses.
# Not a study: results and snapshots stay in bench-out; the grouped peaks come back as peaks.txt.
# Each line of CELLS (default memory-peaks-1.cells): results folder, study, cell, the rank emulated (-:
# the cell as it is); TOP: the groups printed per snapshot.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash results/provenance/gpu-runs/memory-peaks.sh [CELLS]
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=results/provenance/gpu-runs
start=$(date +%s)
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "installed at $(( $(date +%s) - start )) s"
timing=min_windows=2,target_ci=0.5,max_timed_s=4,min_window_s=0.2,memory_snapshot=1
while read -r results study cell rank; do
  left=$(( ${BUDGET_S:-560} - ($(date +%s) - start) ))
  if (( left < 60 )); then echo "== no time for $study/$cell"; continue; fi
  if [ "$rank" = - ]; then
    params=$(python3 $here/cell_params.py --results "$results" "$study" "$cell")
  else
    params=$(python3 $here/cell_params.py --results "$results" "$study" "$cell" --emulate-rank "$rank")
  fi
  out=bench-out/peaks/$study/$cell
  mkdir -p "$out"
  begun=$(date +%s)
  timeout --signal=INT --kill-after=20 $left trainbench run-cell --study "$study" --cell "$cell" \
    --params "$params" --cpus-per-rank 16 --runtime-min 8 --timing "$timing" --output "$out/metrics.json" \
    > "$out.log" 2>&1
  echo "== $study/$cell (rank $rank): exit $?, $(( $(date +%s) - begun )) s"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); m=d['metrics']; print('  ', d['status'], 'alloc', m.get('torch_peak_allocated_mib'), 'reserved', m.get('torch_peak_reserved_mib'), 'snapshot', (m.get('memory_snapshot') or {}).get('peak_by_category_mib'))" "$out/metrics.json" 2>&1 | tail -1
  python3 $here/memory_peaks.py --top ${TOP:-25} $(find "$out" -name '*.pickle') 2>&1 | tee -a $OUT/peaks.txt
done < "${1:-$here/memory-peaks-1.cells}"
tar czf $OUT/peaks.tgz --exclude='*.pickle' --exclude='*.json.gz' bench-out/peaks
ls -la $OUT
