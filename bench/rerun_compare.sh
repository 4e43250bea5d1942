#!/usr/bin/env bash
# Run to run on one GPU host: every pair of runs of the same cells, compared by `trainbench compare`
# (a repeat should show no significant change). The runs are committed under results/bench:
#   - the overhead benchmark's three cell runs of each one-GPU baseline cell (results/bench/overhead/*/round-N/runs),
#   - two `snakemake` runs of the same cells, the second with --force (results/bench/rerun/snakemake-{1,2}),
# all on one H200 host in one session (commands: results/bench/overhead/*/overhead.txt, README).
#
#   bash bench/rerun_compare.sh > results/bench/rerun/compare.txt
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=()
for model in gpt2-124m gpt2-350m; do
  for pair in "1 2" "1 3" "2 3"; do
    set -- $pair
    pairs+=("results/bench/overhead/$model/round-$1/runs results/bench/overhead/$model/round-$2/runs")
  done
done
pairs+=("results/bench/rerun/snakemake-1 results/bench/rerun/snakemake-2")
for pair in "${pairs[@]}"; do
  echo "\$ trainbench compare $pair"
  trainbench compare $pair
  echo
done
