# validation's holdout_comm_emulated round on one H200, each cell alone on it, one at a time (predictions
# committed first: validation/results/predictions/holdout_comm_emulated-h200.csv): each cell one emulated rank.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions TRAINBENCH_FORCE_INFEASIBLE=1
start=$(date +%s)
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "installed at $(( $(date +%s) - start )) s"
cells=$(cd validation && trainbench cells holdout_comm_emulated --tsv | awk -F'\t' 'NR > 1 {print $2}')
for c in $cells; do
  t=results/runs/holdout_comm_emulated/$c/metrics.json
  [ -f validation/$t ] && continue
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 45 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake -d validation $t -c 16 --resources gpu=1 >> $OUT/run.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json; d=json.load(open('validation/$t')); m=d['metrics']; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', round(max(m.get('gpu_mem_used_mib') or [0])/1024,1), 'GiB', d['provenance'].get('host_id'), d.get('reason') or '')" 2>/dev/null
  # after every cell, so that a call cut short keeps what ran
  tar czf $OUT/holdout_comm_emulated.tgz --exclude='*.json.gz' validation/results/runs/holdout_comm_emulated \
    validation/results/history/holdout_comm_emulated 2>/dev/null
done
ls -la $OUT
