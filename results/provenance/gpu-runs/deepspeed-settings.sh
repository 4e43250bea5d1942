# The deepspeed_settings study on one host of 2 GPUs, each cell alone on it, one at a time: the cells of
# one model ($1: gpt2-124m or gpt2-350m), its one-GPU reference first.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
model=${1:?a model}
start=$(date +%s)
command -v snakemake > /dev/null || bash tools/install_offline.sh .whl > $OUT/install.log 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "installed at $(( $(date +%s) - start )) s"
cells=$(trainbench cells deepspeed_settings --tsv | awk -F'\t' -v m="model~$model" 'index($2, m) {print $2}' \
        | sort -t'~' -k2 | awk '/gpus~1/ {print; next} {rest = rest $0 "\n"} END {printf "%s", rest}')
for c in $cells; do
  t=results/runs/deepspeed_settings/$c/metrics.json
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 50 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake $t -c 16 --resources gpu=2 > $OUT/run-$model.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json; d=json.load(open('$t')); m=d['metrics']; b=(m.get('breakdown') or {}).get('parts_s') or {}; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', round(m.get('tokens_per_s') or 0), 'tok/s', round(m.get('gpu_mem_max_gib') or 0, 2), 'GiB', 'exposed', b.get('exposed_communication'), 'idle', b.get('idle'), d['provenance'].get('host_id'), d.get('reason') or '')" 2>/dev/null
done
tar czf $OUT/deepspeed_settings-$model.tgz --exclude=profile results/runs/deepspeed_settings results/history/deepspeed_settings 2>/dev/null
ls -la $OUT
