#!/usr/bin/env bash
# Run to run on one GPU host: every pair of runs of the same cells, compared by `trainbench compare`
# (a repeat should show no significant change). The runs are committed under results/bench, two
# sessions on one H200 host each (commands: results/bench/overhead/*/overhead.txt, docs/measurement.md):
#   commit 14b960c: the overhead benchmark's three cell runs of each one-GPU baseline cell
#     (results/bench/overhead/gpt2-*/round-N/runs) and two `snakemake` runs of the same cells, the
#     second with --force (results/bench/rerun/snakemake-{1,2});
#   commit 6be6464 (vocabulary padded): `snakemake -c all` on empty compile caches and again with
#     --forcerun on warm ones (results/bench/rerun/cold-warm/{cold,warm}; results/provenance/gpu-runs/baseline-2.sh),
#     and the overhead benchmark's two cell runs of each (results/bench/overhead/baseline-6be6464);
#   commit b734edf (bytecode cache, fast exit; another H200 host): `snakemake -c all` twice
#     (results/bench/rerun/startup-b734edf/{first,second}; results/provenance/gpu-runs/startup-2.sh) and the
#     overhead benchmark's three cell runs of each (results/bench/overhead/baseline-b734edf).
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
# every pair of runs made in one session
all_pairs() {
  local runs=("$@") i j
  for ((i = 0; i < ${#runs[@]}; i++)); do
    for ((j = i + 1; j < ${#runs[@]}; j++)); do
      pairs+=("${runs[i]} ${runs[j]}")
    done
  done
}
all_pairs results/bench/rerun/cold-warm/cold results/bench/rerun/cold-warm/warm \
  results/bench/overhead/baseline-6be6464/round-{1,2}/runs
all_pairs results/bench/rerun/startup-b734edf/first results/bench/rerun/startup-b734edf/second \
  results/bench/overhead/baseline-b734edf/round-{1,2,3}/runs
for pair in "${pairs[@]}"; do
  echo "\$ trainbench compare $pair"
  trainbench compare $pair
  echo
done
