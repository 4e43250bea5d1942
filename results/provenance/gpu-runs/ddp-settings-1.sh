# The ddp_settings study on one host of 2 GPUs, each cell alone on it, one at a time; then the bandwidth
# table of the host where its GPUs are not those of a published one.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m | head -4
bash tools/install_offline.sh .whl > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
echo "installed at $(( $(date +%s) - start )) s"
p=results/runs/ddp_settings
tuned=ddp_compile~blocks__ddp_bucket_view~true
for c in strategy~single__model~gpt2-124m__gpus~1__micro_batch~32 model~gpt2-124m__micro_batch~32 \
         model~gpt2-124m__micro_batch~32__$tuned strategy~single__model~gpt2-350m__gpus~1__micro_batch~16 \
         model~gpt2-350m__micro_batch~16 model~gpt2-350m__micro_batch~16__$tuned; do
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 50 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake $p/$c/metrics.json -c 16 --resources gpu=2 > $OUT/snakemake-$c.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json,sys; d=json.load(open('$p/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', round(m.get('tokens_per_s',0)), 'tok/s', m.get('exposed_comm_ms'), d.get('reason') or '')" 2>/dev/null
done
tar czf $OUT/ddp_settings.tgz results/runs/ddp_settings results/history/ddp_settings results/.grid/ddp_settings.json 2>/dev/null
ls -la $OUT
