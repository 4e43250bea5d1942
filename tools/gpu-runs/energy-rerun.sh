#!/usr/bin/env bash
# One GPU host, in the checkout: published one-GPU studies run again by the pipeline, every cell
# forced (--forcerun train_cell), so that their results gain what the pipeline now measures (NVML
# energy per step and per token, power, clocks, topology) and their history a second run to set
# the first against (`trainbench compare --history`). --keep-going; Snakemake is stopped at LIMIT
# seconds so that what finished still comes back (cells are written whole or not at all). An argument
# STUDY/CELL (a glob of cell folders under results/runs) forces those cells alone, and its study's table.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=540 bash tools/gpu-runs/energy-rerun.sh STUDY|STUDY/CELL ...
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
targets=() paths=()
forced=()  # --forcerun train_cell for whole studies: it forces every cell a target needs
for arg in "$@"; do
  study=${arg%%/*}
  if [ "$arg" != "$study" ]; then
    # a cell alone: its result moved aside in this copy of the checkout, so that Snakemake runs it
    # again without forcing the rest of its study (a table target would need them all)
    cells=(results/runs/$arg/metrics.json)
    [ -e "${cells[0]}" ] || { echo "no cell results/runs/$arg"; exit 2; }
    for cell in "${cells[@]}"; do mv "$cell" "$cell.before"; done
    targets+=("${cells[@]}")
  else
    targets+=("results/tables/$study.md")
    forced=(--forcerun train_cell)
  fi
  paths+=("results/runs/$study" "results/history/$study" "results/tables/$study".*)
done
started=$(date +%s)
# forced past the memory model's verdict, as the published cells were: an OOM stays a measured OOM
TRAINBENCH_FORCE_INFEASIBLE=1 timeout -s INT "${LIMIT:-540}" snakemake -c all --keep-going "${scheduler[@]}" "${forced[@]}" -- "${targets[@]}" \
  > bench-out/snakemake.log 2>&1
status=$?  # snakemake's (124 where the limit stopped it), before anything else sets $?
echo "== snakemake: $(( $(date +%s) - started )) s, exit status $status"
grep -E "received SIGINT" bench-out/snakemake.log | cut -c1-200
for before in $(find results/runs -name metrics.json.before); do  # a cell the limit stopped keeps its result
  if [ -e "${before%.before}" ]; then rm "$before"; else mv "$before" "${before%.before}"; fi
done
# what each forced cell measured, as written (its metrics.json newer than the start)
python3 tools/gpu-runs/cells_since.py "$started" "${paths[@]}"
# PACK_ALSO: what a script that ran something before this one wants brought back too
python3 tools/gpu-runs/pack_out.py "$out" bench-out "${paths[@]}" ${PACK_ALSO:-} .snakemake/log
