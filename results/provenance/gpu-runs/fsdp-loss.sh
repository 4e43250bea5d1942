#!/usr/bin/env bash
# A host of 2 GPUs (nvidia-h200-x2), in the checkout, one command:
# 1. bench/fsdp_loss.py on GPU 0: the baseline's two-GPU FSDP2 cells (GPT-2 124M and 350M) as rank 0
#    through the fake process group, their loss eager (as before GPT.compile_loss) and compiled, in
#    alternating windows: the peak each holds and its step time, side by side.
# 2. baseline's four two-GPU cells (DDP and FSDP2, both sizes) forced again by energy-rerun.sh, so that
#    FSDP2 with its loss compiled is set against DDP in one run, which brings back both phases' output.
# Snakemake is stopped at LIMIT seconds; cells are written whole or not at all.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=420 bash tools/gpu-runs/fsdp-loss.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
begun=$(date +%s)
for size in 124m:32 350m:16; do
  cell="baseline/strategy~fsdp__model~gpt2-${size%:*}__gpus~2__micro_batch~${size#*:}"
  echo "== bench/fsdp_loss.py --cell $cell"
  CUDA_VISIBLE_DEVICES=0 python3 bench/fsdp_loss.py --cell "$cell" --rounds 4 --steps 5 \
    --out "bench-out/fsdp_loss-${size%:*}" 2> "bench-out/fsdp_loss-${size%:*}.log" \
    || tail -20 "bench-out/fsdp_loss-${size%:*}.log"
done
echo "== benchmark: $(( $(date +%s) - begun )) s"
left=$(( ${LIMIT:-420} - ($(date +%s) - begun) ))
(( left > 0 )) || left=1  # timeout 0 would mean no limit at all
LIMIT=$left bash tools/gpu-runs/energy-rerun.sh 'baseline/*__gpus~2__*'
