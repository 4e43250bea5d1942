# A study's cells that are not up to date, on one host, each cell alone on it, one at a time, the
# one-GPU cells first: `bash study-one-host.sh <study> [<cells, an extended grep pattern>]`. Cells
# needing more GPUs than the host has are left out. Results, history and logs go to $OUT as <study>.tgz
# (profile traces left out: their figures are in each metrics.json).
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
study=${1:?a study}
pattern=${2:-.}
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# the wheelhouse travels packed (tools/wheelhouse_archive.py) to stay within what a copy may carry
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
echo "installed at $(( $(date +%s) - start )) s"
gpus=$(nvidia-smi -L | wc -l)
p=results/runs/$study
cells=$(trainbench cells $study --tsv | awk -F'\t' -v g=$gpus 'NR > 1 && $3 !~ /^(ok|unsupported)$/ && $4 + 0 <= g {print $2}' \
  | grep -E "$pattern")
for c in $(echo "$cells" | grep -E 'gpus~1(_|$)') $(echo "$cells" | grep -vE 'gpus~1(_|$)'); do
  left=$(( ${BUDGET_S:-570} - ($(date +%s) - start) ))
  if (( left < 60 )); then echo "== no time for $c"; continue; fi
  echo "== $c ($left s left)"
  timeout --signal=INT --kill-after=20 $left snakemake $p/$c/metrics.json -c 16 --resources gpu=$gpus \
    > $OUT/snakemake-$c.log 2>&1
  echo "   exit $? at $(( $(date +%s) - start )) s"
  python3 -c "import json; d=json.load(open('$p/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round((m.get('step_time_s') or 0)*1e3,1), 'ms', round(m.get('tokens_per_s') or m.get('samples_per_s') or 0), 'tok|samples/s', d['provenance'].get('host_id'), d.get('reason') or '')" 2>/dev/null
done
tar czf $OUT/$study.tgz --exclude='*.json.gz' $p results/history/$study 2>/dev/null
ls -la $OUT
