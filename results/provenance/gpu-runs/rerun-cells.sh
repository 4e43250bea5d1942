# A study's real cells run again on one host, each alone on it, one at a time: those whose id matches
# an extended grep pattern, or, with the pattern `not-sane`, those whose result is marked not sane
# (diverged, or fp16 steps skipped while timed): `bash rerun-cells.sh <study> <pattern>`. Cells
# needing more GPUs than the host has are left out. Results and history go to $OUT as <study>.tgz
# after every cell (profile traces left out: their figures are in metrics.json), Snakemake's output to
# $OUT/run.log.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
study=${1:?a study}
pattern=${2:?a pattern over cell ids, or not-sane}
start=$(date +%s)
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
echo "installed at $(( $(date +%s) - start )) s"
gpus=$(nvidia-smi -L | wc -l)
p=results/runs/$study
cells=$(trainbench cells $study --tsv | awk -F'\t' -v g=$gpus 'NR > 1 && $3 == "ok" && $4 + 0 <= g \
  && $4 !~ /emulated/ {print $2}' | grep -v 'emulate~true')
for c in $cells; do
  if [[ $pattern == not-sane ]]; then
    python3 -c "import json, sys; sys.exit(not json.load(open('$p/$c/metrics.json')).get('sanity'))" || continue
  else
    grep -qE "$pattern" <<< "$c" || continue
  fi
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 50 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake -f $p/$c/metrics.json -c 16 --resources gpu=$gpus \
    >> $OUT/run.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json; d=json.load(open('$p/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round((m.get('step_time_s') or 0)*1e3,1), 'ms', 'warm-up', m.get('warmup_steps'), 'skipped', m.get('optimizer_steps_skipped'), d.get('sanity') or 'sane', d['provenance'].get('host_id'))" 2>/dev/null
  tar czf $OUT/$study.tgz --exclude='*.json.gz' $p results/history/$study 2>/dev/null
done
ls -la $OUT
