# The validation round unseen_architectures_tp (2 cells, predicted and committed before they ran) on one
# host of 2 GPUs, one cell at a time; then the bandwidth table where the host's GPUs have none published.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
start=$(date +%s)
command -v snakemake > /dev/null || bash tools/install_offline.sh .whl > $OUT/install.log 2>&1
echo "ready at $(( $(date +%s) - start )) s"
p=results/runs/unseen_architectures_tp
for c in model~qwen2-1.5b model~pythia-1.4b; do
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 60 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake -d validation $p/$c/metrics.json -c 16 --resources gpu=2 > $OUT/snakemake-$c.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json,sys; d=json.load(open('validation/$p/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', m.get('gpu_mem_max_gib'), 'GiB', d.get('reason') or '')" 2>/dev/null
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in *H100*) snakemake results/comm/h100-x2.json -c 16 --resources gpu=2 > $OUT/commbench.log 2>&1; echo "commbench exit $?";; esac
tar czf $OUT/unseen_tp.tgz validation/results/runs/unseen_architectures_tp validation/results/history/unseen_architectures_tp validation/results/.grid/unseen_architectures_tp.json results/comm 2>/dev/null
ls -la $OUT
