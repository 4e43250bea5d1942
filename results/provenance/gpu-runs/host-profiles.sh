#!/usr/bin/env bash
# One GPU (nvidia-h200), in the checkout: published cells run again alone, outside their studies, with
# three steps profiled after their timed ones (a multi-GPU cell as one emulated rank): where a
# host-bound step's time goes. Not a study: results stay in bench-out and come back as profiles.tgz
# (metrics.json, logs and rank traces). Each line of CELLS: results folder, study, cell, the rank
# emulated (-: the cell as it is), then any parameters changed (KEY=VALUE, cell_params.py's --set).
# TIMING: the timing settings (default: profile_steps=3).
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash results/provenance/gpu-runs/host-profiles.sh CELLS
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=results/provenance/gpu-runs
start=$(date +%s)
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node)'
echo "installed at $(( $(date +%s) - start )) s"
line=0
while read -r results study cell rank changes; do
  line=$(( line + 1 ))
  left=$(( ${BUDGET_S:-560} - ($(date +%s) - start) ))
  if (( left < 60 )); then echo "== no time for $study/$cell"; continue; fi
  extra=(); [ "$rank" = - ] || extra=(--emulate-rank "$rank")
  for change in $changes; do extra+=(--set "$change"); done
  params=$(python3 $here/cell_params.py --results "$results" "$study" "$cell" "${extra[@]}")
  out=bench-out/profiles/$study/$line-$cell
  mkdir -p "$out"
  begun=$(date +%s)
  timeout --signal=INT --kill-after=20 $left trainbench run-cell --study "$study" --cell "$cell" \
    --params "$params" --cpus-per-rank 16 --runtime-min 8 --timing "${TIMING-profile_steps=3}" \
    --output "$out/metrics.json" > "$out.log" 2>&1
  echo "== $line: $study/$cell (rank $rank${changes:+, $changes}): exit $?, $(( $(date +%s) - begun )) s"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); m=d['metrics']; b=m.get('breakdown') or {}; print('  ', d['status'], 'step', round(1e3*(m.get('step_time_s') or 0), 1), 'ms +-', m.get('ci_half_width'), 'pace', d['provenance'].get('host_pace_ms'), {k: round(1e3*v, 1) for k, v in (b.get('parts_s') or {}).items()})" "$out/metrics.json" 2>&1 | tail -1
done < "${1:?a file of cells}"
tar czf $OUT/profiles.tgz bench-out/profiles
ls -la $OUT
