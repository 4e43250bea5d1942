# tuning-check.yaml's cells on the host that re-made baseline and lightning (study-one-host.sh's install)
export TRAINBENCH_GIT_COMMIT=${TRAINBENCH_GIT_COMMIT:?the commit the cells ran at}
export TORCH_EXTENSIONS_DIR=/tmp/torch-extensions
mkdir -p studies/local && cp results/provenance/gpu-runs/tuning-check.yaml studies/local/
command -v snakemake > /dev/null || { python3 tools/wheelhouse_archive.py unpack .whlpack/wheels.tar.xz /tmp/whl \
  && bash tools/install_offline.sh /tmp/whl; } > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 1; }
for c in $(trainbench cells tuning_check --tsv | awk -F'\t' 'NR > 1 {print $2}'); do
  echo "== $c"
  snakemake results/runs/tuning_check/$c/metrics.json -c 16 --resources gpu=4 > /dev/null 2>&1
  python3 -c "import json; d=json.load(open('results/runs/tuning_check/$c/metrics.json')); m=d['metrics']; print('  ', d['status'], round((m.get('step_time_s') or 0)*1e3,1), 'ms', round(m.get('tokens_per_s') or 0), 'tok/s', m.get('ci_half_width'), (m.get('timing') or {}).get('gc'), d['provenance'].get('host_id'))"
done
tar czf $OUT/tuning_check.tgz --exclude='*.json.gz' results/runs/tuning_check results/history/tuning_check
