#!/usr/bin/env bash
# One H100 (nvidia-h100-x1): DeepSpeed's op builds as a phase of their own (`builds`). One ZeRO-2 cell
# with its optimizer offloaded (DeepSpeedCPUAdam) run twice by the pipeline: first with an empty
# TORCH_EXTENSIONS_DIR (it compiles CPU Adam, as the first offloaded cell on a freshly lent host or a
# new environment does), then again with the build in place. `trainbench cost` after each says what
# the build cost and the timed share without it. Writes only OUT/op-builds-1.tgz and what the caller
# tees.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/op-builds-1.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
cat > bench-out/op_builds.yaml <<'EOF'
studies:
  op_builds:
    description: >
      One ZeRO-2 cell with its optimizer offloaded to the CPU (DeepSpeedCPUAdam), run twice: with an
      empty TORCH_EXTENSIONS_DIR, then with CPU Adam built (tools/gpu-runs/op-builds-1.sh).
    settings: {model: gpt-345m, seq_len: 1024, precision: bf16, gpus: 1, micro_batch: 8, warmup_steps: 2,
               timed_steps: 6, framework: deepspeed, strategy: zero2, offload_optimizer: true}
    include: [{}]
    execution: {runtime_min: 10, cpus_per_rank: 16}
EOF
export TORCH_EXTENSIONS_DIR
TORCH_EXTENSIONS_DIR=$(mktemp -d /tmp/torch-extensions-XXXX)  # empty: the first run compiles
target=results/runs/op_builds/default/metrics.json
for run in 1 2; do
  started=$(date +%s)
  snakemake -c all --configfile bench-out/op_builds.yaml --forcerun "$target" -- "$target" \
    > "bench-out/snakemake-$run.log" 2>&1
  echo "== run $run: snakemake exit $?, $(( $(date +%s) - started )) s"
  mkdir -p "bench-out/run-$run" && cp -r results/runs/op_builds "bench-out/run-$run/"
  python3 -c "import json, sys; m = json.load(open(sys.argv[1]))['metrics']; print('status ok' if m['wall_time_s'] else '', 'phases_s', m['phases_s'], 'wall', m['wall_time_s'], 'timed share', m['timed_share'])" "$target"
  trainbench cost op_builds --config bench-out/op_builds.yaml
done
ls "$TORCH_EXTENSIONS_DIR"/*/ 2>/dev/null | head
tar czf "$out/op-builds-1.tgz" bench-out .snakemake/log 2>/dev/null
echo "packed $(tar tzf "$out/op-builds-1.tgz" | wc -l) files"
