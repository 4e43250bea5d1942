# The scaling study on one host of 4 GPUs, each cell alone on it, one at a time, the one-GPU cells first:
# `bash scaling.sh gpt2-124m`, then `bash scaling.sh gpt2-350m` on the same host.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
model=${1:?gpt2-124m or gpt2-350m}
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -6
command -v snakemake > /dev/null || bash tools/install_offline.sh .whl > $OUT/install.log 2>&1 \
  || { cat $OUT/install.log; exit 1; }
echo "installed at $(( $(date +%s) - start )) s"
p=results/runs/scaling
cells=$(trainbench cells scaling --tsv | awk -F'\t' -v m="model~$model" 'NR > 1 && index($2, m) {print $2}')
for c in $(echo "$cells" | grep gpus~1) $(echo "$cells" | grep -v gpus~1); do
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 50 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake $p/$c/metrics.json -c 16 --resources gpu=4 \
    > $OUT/snakemake-$c.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json; d=json.load(open('$p/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', round(m.get('tokens_per_s',0)), 'tok/s', (m.get('timing') or {}).get('gc'), d['provenance'].get('host_id'), d.get('reason') or '')" 2>/dev/null
done
tar czf $OUT/scaling-$model.tgz results/runs/scaling/*$model* results/history/scaling 2>/dev/null
ls -la $OUT
