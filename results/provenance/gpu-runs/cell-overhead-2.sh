#!/usr/bin/env bash
# One H100 (nvidia-h100-x1): where run-cell's own time goes on a GPU host, after cell-overhead-1.sh
# found the interpreter's bare start at 86 ms there (12 ms on the 2-core CI box) and run-cell's own
# part around a 1-GPU cell at 239 ms. Imports of `python -c pass` and of run-cell (-X importtime),
# the .pth files site runs, and cProfile of run-cell around the tiny 1-GPU cell and an unsupported
# cell. Writes only OUT/cell-overhead-2.tgz and what the caller tees.
#   TRAINBENCH_GIT_COMMIT=<sha> OUT=<dir> bash tools/gpu-runs/cell-overhead-2.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?OUT}
mkdir -p bench-out
bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 || { tail bench-out/install.log; exit 1; }
unset PYTHONDONTWRITEBYTECODE  # as the benchmark runs: modules' bytecode cached where they can be
python3 -c pass; python3 -c pass  # write what bytecode can be written
for flags in "" "-S" "-I" "-X frozen_modules=on"; do
  for i in 1 2 3 4 5; do /usr/bin/time -f "%e" python3 $flags -c pass 2>&1; done | sort -n | sed -n 3p \
    | xargs echo "python3 $flags -c pass, median of 5 (s):"
done
python3 -c "import site, sys; print(sys.prefix, site.getsitepackages())"
for d in $(python3 -c "import site; print(' '.join(site.getsitepackages()))"); do
  ls "$d"/*.pth 2>/dev/null | while read -r f; do echo "== $f"; head -c 300 "$f"; echo; done
done
python3 -X importtime -c pass 2> bench-out/importtime-pass.txt
sort -t'|' -k2 -n bench-out/importtime-pass.txt | tail -25
python3 - <<'EOF' > bench-out/argv.txt
import shlex, sys
sys.path.insert(0, "bench")
import plan_scaling as ps
from pathlib import Path
from trainbench.study.config import load_config
spec = {"description": "t", "settings": {**ps.TINY_CELL, "device": "cuda", "gpus": 1, "strategy": "single"},
        "include": [{}], "timing": ps.TINY_TIMING, "execution": {"runtime_min": 5, "cpus_per_rank": 1}}
[gpu] = load_config({"studies": {ps.STUDY: spec}}).study(ps.STUDY).cells
[unsupported] = load_config({"studies": {ps.STUDY: ps.study_spec(1, ps.UNSUPPORTED_SETTINGS, "one")}}).study(ps.STUDY).cells
print(shlex.join(ps.run_cell_argv(gpu, Path("bench-out/gpu/metrics.json"))))
print(shlex.join(ps.run_cell_argv(unsupported, Path("bench-out/unsupported/metrics.json"))))
EOF
gpu_args=$(sed -n 1p bench-out/argv.txt); unsupported_args=$(sed -n 2p bench-out/argv.txt)
eval "python3 -m trainbench run-cell $gpu_args" > /dev/null 2>&1  # warm: bytecode, CUDA's caches
for i in 1 2; do
  eval "python3 -X importtime -m cProfile -o bench-out/gpu-$i.prof -m trainbench run-cell $gpu_args" \
    > bench-out/gpu-$i.log 2> bench-out/gpu-importtime-$i.txt
  eval "python3 -m cProfile -o bench-out/unsupported-$i.prof -m trainbench run-cell $unsupported_args" \
    > /dev/null 2>&1
  rm -f bench-out/unsupported/metrics.json
done
python3 - <<'EOF'
import pstats
for name in ("gpu-2", "unsupported-2"):
    print(f"== cProfile of run-cell, {name} (cumulative, top 45)")
    pstats.Stats(f"bench-out/{name}.prof").sort_stats("cumulative").print_stats(45)
EOF
sort -t'|' -k2 -n bench-out/gpu-importtime-2.txt | tail -30
tar czf "$out/cell-overhead-2.tgz" bench-out 2>/dev/null
echo "packed $(tar tzf "$out/cell-overhead-2.tgz" | wc -l) files"
