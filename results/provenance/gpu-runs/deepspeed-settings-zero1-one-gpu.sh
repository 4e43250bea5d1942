# deepspeed_settings' two ZeRO-1 cells on one GPU, on the host that ran the rest of the study.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at} TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
command -v snakemake > /dev/null || bash tools/install_offline.sh .whl > $OUT/install.log 2>&1
for m in gpt2-124m__gpus~1__micro_batch~32 gpt2-350m__gpus~1__micro_batch~16; do
  t=results/runs/deepspeed_settings/strategy~zero1__model~$m/metrics.json
  snakemake $t -c 16 --resources gpu=2 > $OUT/run-$m.log 2>&1; echo "exit $?"
  python3 -c "import json; d=json.load(open('$t')); m=d['metrics']; print(d['status'], round(m['step_time_s']*1e3,1), 'ms', round(m['tokens_per_s']), 'tok/s', d['provenance'].get('host_id'))"
done
