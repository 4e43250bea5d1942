#!/usr/bin/env bash
# One GPU host, in the checkout: a study whose predictions are committed in
# results/predictions/<study>-<gpu>.csv, every cell run even where the memory model says it will not fit
# (TRAINBENCH_FORCE_INFEASIBLE=1: the verdict is what is tested), then held against the predictions
# (bench/predicted_then_run.py). --keep-going; Snakemake is stopped at LIMIT seconds so that what
# finished still comes back. Writes OUT/results.tgz and
# the profiles' traces in parts (tools/gpu-runs/pack_out.py).
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> LIMIT=480 GPU=h200 bash tools/gpu-runs/predicted-then-run.sh STUDY [TARGET ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
study=${1:?STUDY}
shift
source tools/gpu-runs/prelude.sh
free -g | head -2; nproc
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("results/tables/$study.md")
started=$(date +%s)
TRAINBENCH_FORCE_INFEASIBLE=1 timeout -s INT "${LIMIT:-480}" snakemake -c all --keep-going "${scheduler[@]}" "${targets[@]}" \
  > bench-out/snakemake.log 2>&1
status=$?  # snakemake's (124 where the limit stopped it), before anything else sets $?
echo "== snakemake: $(( $(date +%s) - started )) s, exit status $status"
grep -E "^\[$study/|trainbench:" bench-out/snakemake.log | grep -vE "window|warm-up" | tail -40
predictions="results/predictions/$study-${GPU:-h200}.csv"
[ -f "$predictions" ] && python3 bench/predicted_then_run.py "$predictions"
# the tool brings back 8 files of 16 MiB at most: profiles' traces in parts (pack_out.py)
python3 tools/gpu-runs/pack_out.py "$out" bench-out "results/runs/$study" "results/history/$study" \
  results/tables/"$study".* \
  results/plots/"$study"_* .snakemake/log ${PACK_ALSO:-}  # PACK_ALSO: what a run before this one wrote
