# A study's measured cells run again on one host, each alone on it, one at a time, the one-GPU cells
# first: `bash rerun-cells.sh <study> <which> [<cells: an extended grep pattern over their ids>]`, where
# <which> is
#   all         every measured cell, so that scaling is against the one-GPU cell of the same host and
#               boot (rerun-study.sh)
#   unprofiled  the real multi-GPU cells that have no profile yet, run with the study's `profile_steps`
#               (profile-cells.sh)
#   not-sane    the cells whose result is marked not sane (diverged, or fp16 steps skipped while timed)
#   missing     the cells with no result yet: a predicted-then-run round's (WORKSPACE=validation), its
#               predictions committed first; cells predicted not to fit run too
# Cells needing more GPUs than the host has are left out. WORKSPACE (default: the repository's root)
# is the workflow's folder. Results and history go to $OUT as <study>.tgz after every cell (profile
# traces left out: their figures are in metrics.json), and Snakemake's output to $OUT/run.log.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
study=${1:?a study}
which=${2:?all, unprofiled, not-sane or missing}
pattern=${3:-.}
[ "$which" = missing ] && export TRAINBENCH_FORCE_INFEASIBLE=1
start=$(date +%s)
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "installed at $(( $(date +%s) - start )) s"
gpus=$(nvidia-smi -L | wc -l)
w=${WORKSPACE:+$WORKSPACE/}  # the workspace's folder, as a prefix of its paths
p=${w}results/runs/$study
# the cells the mode is about: with a result that is ok, or (missing) none yet; planned cells never
cells=$(cd "${WORKSPACE:-.}" && trainbench cells "$study" --tsv \
  | awk -F'\t' -v g="$gpus" -v which="$which" 'NR > 1 && $4 + 0 <= g \
      && (which == "missing" ? $3 ~ /^missing/ : $3 == "ok") {print $2}' | grep -E "$pattern")
one_gpu='(^|_)gpus~1(_|$)|strategy~single'
for c in $(grep -E "$one_gpu" <<< "$cells") $(grep -vE "$one_gpu" <<< "$cells"); do
  python3 - "$p/$c/metrics.json" "$which" "$c" <<'PY' || continue
import json, os, sys
path, which, cell = sys.argv[1:]
if which == "missing" or not os.path.exists(path):
    sys.exit(not (which == "missing" and not os.path.exists(path)))
doc = json.load(open(path))
if doc.get("status") != "ok":
    sys.exit(1)
real_multi_gpu = "emulate~true" not in cell and doc["provenance"].get("gpu_count", 1) > 1
sys.exit(not {"all": True, "not-sane": bool(doc.get("sanity")),
              "unprofiled": real_multi_gpu and not doc["metrics"].get("breakdown")}[which])
PY
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 50 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake -d "${WORKSPACE:-.}" -f "results/runs/$study/$c/metrics.json" \
    -c 16 --resources gpu=$gpus >> $OUT/run.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json; d=json.load(open('$p/$c/metrics.json')); m=d['metrics']; b=m.get('breakdown') or {}; print('  ', d['status'], round((m.get('step_time_s') or 0)*1e3,1), 'ms', round(m.get('tokens_per_s') or 0), 'tok/s', 'exposed comm', round(1e3*(b.get('parts_s') or {}).get('exposed_communication', float('nan')), 1), 'warm-up', m.get('warmup_steps'), 'skipped', m.get('optimizer_steps_skipped'), d.get('sanity') or 'sane', d['provenance'].get('host_id'), d.get('reason') or '')" 2>/dev/null
  tar czf $OUT/$study.tgz --exclude='*.json.gz' "$p" "${w}results/history/$study" 2>/dev/null
done
ls -la $OUT
