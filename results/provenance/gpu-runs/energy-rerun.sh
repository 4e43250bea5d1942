#!/usr/bin/env bash
# One GPU host, in the checkout: published one-GPU studies run again by the pipeline, every cell
# forced (--forcerun train_cell), so that their results gain what the pipeline now measures (NVML
# energy per step and per token, power, clocks, topology) and their history a second run to set
# the first against (`trainbench compare --history`). --keep-going; Snakemake is stopped at LIMIT
# seconds so that what finished still comes back (cells are written whole or not at all). An argument
# STUDY/CELL (a glob of cell folders under results/runs) forces those cells alone (tables are made again
# where the results come back); a rerun whose status is not its published one comes back beside it, as
# metrics.json.rerun, and the published result stays.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=540 bash tools/gpu-runs/energy-rerun.sh STUDY|STUDY/CELL ...
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/gpu-runs/prelude.sh
targets=() studies=() aside=()
forced=()  # --forcerun train_cell for whole studies: it forces every cell a target needs
for arg in "$@"; do  # every argument checked before anything is moved
  study=${arg%%/*}
  [ -d "results/runs/$study" ] || { echo "no study results/runs/$study"; exit 2; }
  if [ "$arg" != "$study" ]; then
    cells=(results/runs/$arg/metrics.json)
    [ -e "${cells[0]}" ] || { echo "no cell results/runs/$arg"; exit 2; }
    aside+=("${cells[@]}")
    targets+=("${cells[@]}")
  else
    targets+=("results/tables/$study.md")
    forced=(--forcerun train_cell)
  fi
  [[ " ${studies[*]} " == *" $study "* ]] || studies+=("$study")
done
# a cell alone: its result moved aside in this copy of the checkout, so that Snakemake runs it again
# without forcing the rest of its study (a table target would need them all)
for cell in $(printf '%s\n' "${aside[@]}" | sort -u); do mv "$cell" "$cell.before"; done
paths=()
for study in "${studies[@]}"; do
  paths+=("results/runs/$study" "results/history/$study" "results/tables/$study".*)
done
started=$(date +%s)
# forced past the memory model's verdict, as the published cells were: an OOM stays a measured OOM
TRAINBENCH_FORCE_INFEASIBLE=1 timeout -s INT "${LIMIT:-540}" snakemake -c all --keep-going "${scheduler[@]}" "${forced[@]}" -- "${targets[@]}" \
  > bench-out/snakemake.log 2>&1
status=$?  # snakemake's (124 where the limit stopped it), before anything else sets $?
echo "== snakemake: $(( $(date +%s) - started )) s, exit status $status"
grep -E "received SIGINT" bench-out/snakemake.log | cut -c1-200
# a cell the limit stopped keeps its published result; one whose rerun came out another way (failed, where
# it was ok) keeps it too, the rerun beside it
python3 - <<'PYTHON'
import json
from pathlib import Path
for before in Path("results/runs").glob("*/*/metrics.json.before"):
    result = before.with_suffix("")
    if result.exists() and json.loads(result.read_text())["status"] != json.loads(before.read_text())["status"]:
        result.rename(result.with_suffix(".json.rerun"))
    if result.exists():
        before.unlink()
    else:
        before.rename(result)
PYTHON
# what each forced cell measured, as written (its metrics.json newer than the start)
python3 tools/gpu-runs/cells_since.py "$started" "${paths[@]}"
# PACK_ALSO: what a script that ran something before this one wants brought back too
python3 tools/gpu-runs/pack_out.py "$out" bench-out "${paths[@]}" ${PACK_ALSO:-} .snakemake/log
exit "$status"  # snakemake's: 124 where the limit stopped it
