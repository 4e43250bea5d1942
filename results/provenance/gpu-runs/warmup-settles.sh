#!/usr/bin/env bash
# One GPU (nvidia-h200), in the checkout: megatron's fp16 GPT-345M ZeRO-1 and ZeRO-2 cells (2 GPUs) as their
# rank 0, emulated, with the study's timing: how long warm-up goes on before fp16 loss scaling settles, and
# whether the timed steps still skip. Not a study: the results stay in bench-out.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash results/provenance/gpu-runs/warmup-settles.sh
cd "$(dirname "$0")/../../.."
TIMING=${TIMING:-min_windows=6,target_ci=0.02,max_timed_s=15,min_window_s=0.2}
set -uo pipefail
start=$(date +%s)
python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl > $OUT/install.log 2>&1 && bash tools/install_offline.sh /tmp/whl >> $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
echo "installed at $(( $(date +%s) - start )) s"
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
for s in zero1 zero2; do
  cell="strategy~${s}__model~gpt-345m__gpus~2__tp~1__offload_optimizer~false"
  params=$(python3 results/provenance/gpu-runs/cell_params.py megatron "$cell" --emulate-rank 0)
  timeout 100 trainbench run-cell --study megatron --cell "$cell" --params "$params" --cpus-per-rank 16 --runtime-min 3 \
    --timing "$TIMING" --output "bench-out/warm/$cell/metrics.json" > "$OUT/$s.log" 2>&1
  echo "== $cell (rank 0 of 2, emulated): exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); m=d['metrics']; print('  ', d['status'], 'warm-up', m.get('warmup_steps'), 'skipped while timed', m.get('optimizer_steps_skipped'), 'timed steps', len(m.get('loss_curve') or []) - (m.get('warmup_steps') or 0), 'step', m.get('step_time_s'), d.get('sanity') or 'sane')" "bench-out/warm/$cell/metrics.json" 2>&1 | tail -1
  grep -i "warm-up" "$OUT/$s.log" | tail -4
done
