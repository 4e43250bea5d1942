#!/usr/bin/env bash
# One H200, two cells in one command, each under its own time limit:
# 1. the float8 study's compiled GPT-2.5B tensorwise cell again with the GPU allocator's history
#    recorded (`trainbench profile --memory`): what the GPU's compiled graph keeps, against the
#    memory model's float8 activations (a fresh host compiles this cell in about four minutes);
# 2. the profiles study's emulated LLaMA-7B Trainer FSDP rank with its parameters offloaded
#    (its first run's result was lost to a history file name over 255 bytes, fixed in 510af44).
# (a first run gave the LLaMA rank 200 s: it was stopped while profiling; the second ran it alone:
# SKIP_FLOAT8=1 LLAMA_LIMIT=480)
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> [SKIP_FLOAT8=1] [LLAMA_LIMIT=s] bash tools/gpu-runs/gpu-session-6.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
started=$(date +%s)
[ "${SKIP_FLOAT8:-0}" = 1 ] || timeout -s INT 350 python3 -m trainbench profile float8 model~gpt-2.5b__micro_batch~8__float8~tensorwise__compile~true \
  --memory > bench-out/profile-float8.log 2>&1
echo "== float8 profile --memory: $(( $(date +%s) - started )) s, exit status $?"
grep -vE "window|warm-up" bench-out/profile-float8.log | tail -8
llama=framework~hf_trainer__strategy~fsdp__model~llama-7b__seq_len~2048__precision~bf16__tf32~true__gpus~2__micro_batch~1__grad_accum~8__offload_param~true__activation_checkpointing~true__emulate~true__lr~2e-05__warmup_steps~1__timed_steps~2
started=$(date +%s)
timeout -s INT "${LLAMA_LIMIT:-200}" snakemake -c all --keep-going "results/runs/profiles/$llama/metrics.json" > bench-out/snakemake-profiles.log 2>&1
echo "== profiles llama offload: $(( $(date +%s) - started )) s, exit status $?"
grep -E "^\[profiles/|trainbench" bench-out/snakemake-profiles.log | grep -vE "window|warm-up" | tail -8
python3 tools/gpu-runs/pack_out.py "$out" bench-out results/runs/float8 results/history/float8 \
  results/runs/profiles results/history/profiles .snakemake/log
