export TRAINBENCH_GIT_COMMIT=11e8ae1
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
bash tools/install_offline.sh .whl > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
p=results/runs/fsdp_reshard
for c in strategy~single__model~gpt2-350m__gpus~1__micro_batch~16 model~gpt2-350m__micro_batch~16__fsdp_reshard~after_step model~gpt2-350m__micro_batch~16__fsdp_reshard~after_forward strategy~single__model~gpt2-124m__gpus~1__micro_batch~32 model~gpt2-124m__micro_batch~32__fsdp_reshard~after_step model~gpt2-124m__micro_batch~32__fsdp_reshard~after_forward; do
  left=$(( 330 - ($(date +%s) - start) ))
  if (( left < 40 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake $p/$c/metrics.json -c 16 --resources gpu=2 > $OUT/snakemake-$c.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json,sys; d=json.load(open('$p/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round(m.get('step_time_s',0)*1e3,1), 'ms', round(m.get('tokens_per_s',0)), 'tok/s', d.get('reason') or '')" 2>/dev/null
done
tar czf $OUT/fsdp_reshard.tgz results/runs/fsdp_reshard results/history/fsdp_reshard results/.grid/fsdp_reshard.json 2>/dev/null
ls -la $OUT
