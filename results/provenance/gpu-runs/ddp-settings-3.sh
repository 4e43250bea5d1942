# The six cells of ddp_settings that ddp-settings-1.sh ran, again on the host that ran its 100 MiB cells
# (ddp-settings-2.sh), so that the whole study is measured on one host; then the qwen2 cell of
# unseen_architectures_tp, profiled.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
start=$(date +%s)
command -v snakemake > /dev/null || bash tools/install_offline.sh .whl > $OUT/install.log 2>&1
p=results/runs/ddp_settings
tuned=ddp_compile~blocks__ddp_bucket_view~true
for c in $p/strategy~single__model~gpt2-124m__gpus~1__micro_batch~32 $p/model~gpt2-124m__micro_batch~32 \
         $p/model~gpt2-124m__micro_batch~32__$tuned $p/strategy~single__model~gpt2-350m__gpus~1__micro_batch~16 \
         $p/model~gpt2-350m__micro_batch~16 $p/model~gpt2-350m__micro_batch~16__$tuned \
         validation/results/runs/unseen_architectures_tp/model~qwen2-1.5b; do
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 60 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  rm -f $c/metrics.json
  case $c in validation/*) timeout --signal=INT --kill-after=20 $left snakemake -d validation ${c#validation/}/metrics.json -c 16 --resources gpu=2 > $OUT/run.log 2>&1;;
             *) timeout --signal=INT --kill-after=20 $left snakemake $c/metrics.json -c 16 --resources gpu=2 > $OUT/run.log 2>&1;; esac
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json,sys; d=json.load(open('$c/metrics.json')); m=d['metrics']; b=m.get('breakdown') or {}; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', round(m.get('tokens_per_s') or 0), 'tok/s', 'exposed', (b.get('parts_s') or {}).get('exposed_communication'), 'idle', (b.get('parts_s') or {}).get('idle'), d['provenance'].get('host_id'), d.get('reason') or '')" 2>/dev/null
done
tar czf $OUT/ddp_settings-3.tgz --exclude=profile results/runs/ddp_settings results/history/ddp_settings validation/results/runs/unseen_architectures_tp validation/results/history/unseen_architectures_tp 2>/dev/null
ls -la $OUT
