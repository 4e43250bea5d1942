# Every measured cell of a study run again on one host, each cell alone on it, one at a time, the one-GPU
# cells first, so that scaling is against the one-GPU cell of the same host and boot:
# `bash rerun-study.sh <study>`. Results and history go to $OUT as <study>.tgz after every cell, and
# Snakemake's output to $OUT/run.log.
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
study=${1:?a study}
start=$(date +%s)
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
echo "installed at $(( $(date +%s) - start )) s"
gpus=$(nvidia-smi -L | wc -l)
p=results/runs/$study
cells=$(trainbench cells $study --tsv | awk -F'\t' -v g=$gpus 'NR > 1 && $3 == "ok" && $4 + 0 <= g {print $2}')
for c in $(echo "$cells" | grep -E '(^|_)gpus~1(_|$)|strategy~single') $(echo "$cells" | grep -vE '(^|_)gpus~1(_|$)|strategy~single'); do
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 35 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake -f $p/$c/metrics.json -c 16 --resources gpu=$gpus >> $OUT/run.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json; d=json.load(open('$p/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round((m.get('step_time_s') or 0)*1e3,1), 'ms', round(m.get('tokens_per_s') or 0), 'tok/s', d['provenance'].get('host_id'))" 2>/dev/null
  tar czf $OUT/$study.tgz --exclude='*.json.gz' $p results/history/$study 2>/dev/null
done
