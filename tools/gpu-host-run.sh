#!/usr/bin/env bash
# Run pipeline targets on a GPU host that reaches no package index, within a fixed time, and pack
# what they wrote: how the published results were made (a copy of the working tree, no .git).
# results/provenance/gpu-runs/README.md says how to build the wheelhouse and bring the results back.
#
#   tools/gpu-host-run.sh WHEELHOUSE SECONDS TARBALL TARGETS_FILE...
#
# TARGETS_FILE: Snakemake targets, one per line ('#' starts a comment). The files run in order, as
# separate Snakemake invocations sharing the SECONDS budget, so the first file's cells come first.
# When the budget ends Snakemake is interrupted: a cell still running leaves no metrics.json (see
# cellrun.py), finished cells keep theirs. TARBALL gets results/runs, results/history,
# results/search and the logs.
# Set TRAINBENCH_GIT_COMMIT to the commit the tree was copied from (provenance), and WORKSPACE to run
# the targets of another workspace (the validation studies: WORKSPACE=validation).
set -uo pipefail
cd "$(dirname "$0")/.."
house=${1:?usage: tools/gpu-host-run.sh WHEELHOUSE SECONDS TARBALL TARGETS_FILE...}
seconds=${2:?seconds}
tarball=${3:?tarball}
shift 3
workspace=${WORKSPACE:-.}
deadline=$(( $(date +%s) + seconds ))

bash tools/install_offline.sh "$house" || exit 1
# DeepSpeed's CPU Adam compiles once per host, not once per cell
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch-extensions}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
# a wheelhouse built --leave-out pulp (Snakemake's ILP scheduler) schedules greedily
scheduler=()
python3 -c "import pulp" 2>/dev/null || scheduler=(--scheduler greedy)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  || echo "no GPUs found: CPU cells only"

for file in "$@"; do
  left=$(( deadline - $(date +%s) ))
  if (( left < 30 )); then echo "== no time left for $file"; continue; fi
  mapfile -t targets < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$file")
  echo "== $file: ${#targets[@]} targets, ${left}s left"
  timeout --signal=INT --kill-after=60 "$left" \
    snakemake --directory "$workspace" --cores "$(nproc)" --resources gpu="$gpus" --keep-going \
      --printshellcmds "${scheduler[@]}" "${targets[@]}"
  echo "== $file: snakemake exit $?"
done

tar czf "$tarball" --ignore-failed-read -C "$workspace" results/runs results/history results/search \
  .snakemake/log 2>/dev/null
echo "packed $(tar tzf "$tarball" | grep -c metrics.json) metrics.json files into $tarball"
