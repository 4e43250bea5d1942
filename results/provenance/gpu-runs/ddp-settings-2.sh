# The ddp_settings cells with buckets of 100 MiB, on the host of ddp-settings-1.sh (warm); then the two
# cells of unseen_architectures_tp again, profiled.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
start=$(date +%s)
command -v snakemake > /dev/null || bash tools/install_offline.sh .whl > $OUT/install.log 2>&1
for c in results/runs/ddp_settings/model~gpt2-350m__micro_batch~16__ddp_bucket_cap_mb~100 \
         results/runs/ddp_settings/model~gpt2-124m__micro_batch~32__ddp_bucket_cap_mb~100 \
         validation/results/runs/unseen_architectures_tp/model~qwen2-1.5b; do
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 60 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  case $c in validation/*) rm -f $c/metrics.json; (cd validation && timeout --signal=INT --kill-after=20 $left snakemake ${c#validation/}/metrics.json -c 16 --resources gpu=2 --forcerun train_cell > $OUT/run.log 2>&1);;
             *) timeout --signal=INT --kill-after=20 $left snakemake $c/metrics.json -c 16 --resources gpu=2 > $OUT/run.log 2>&1;; esac
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json,sys; d=json.load(open('$c/metrics.json')); m=d['metrics']; b=m.get('breakdown') or {}; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', round(m.get('tokens_per_s') or 0), 'tok/s', 'exposed', (b.get('parts_s') or {}).get('exposed_communication'), 'idle', (b.get('parts_s') or {}).get('idle'), d.get('reason') or '')" 2>/dev/null
done
tar czf $OUT/ddp_settings-2.tgz results/runs/ddp_settings results/history/ddp_settings results/.grid/ddp_settings.json validation/results/runs/unseen_architectures_tp validation/results/history/unseen_architectures_tp 2>/dev/null
ls -la $OUT
