#!/usr/bin/env bash
# One GPU host, in the checkout: does Python cache its bytecode there, and what does importing
# torch.compile's stack cost with and without a bytecode cache (PYTHONPYCACHEPREFIX)?
#   OUT=<dir> bash tools/gpu-runs/bytecode-1.sh
set -u
echo "== env"; env | grep -E "^PYTHON|^TORCH|^CUDA" ; which python3; python3 -V
python3 - <<'PY'
import sys, os, importlib.util, torch, pathlib
print("dont_write_bytecode", sys.flags.dont_write_bytecode, "pycache_prefix", sys.pycache_prefix)
root = pathlib.Path(torch.__file__).parent
print("torch at", root, "writable", os.access(root, os.W_OK))
tag = sys.implementation.cache_tag
for sub in ("_dynamo", "_inductor", "fx", "."):
    d = root / sub
    py = list(d.glob("*.py")); pyc = list((d / "__pycache__").glob(f"*.{tag}.pyc"))
    print(f"{sub}: {len(py)} .py, {len(pyc)} .pyc ({tag})")
PY
imp='import time, torch; t=time.perf_counter(); import torch._dynamo, torch._inductor.compile_fx; print(f"dynamo+inductor import {time.perf_counter()-t:.2f} s")'
for i in 1 2 3; do python3 -c "$imp"; done
echo "== with PYTHONPYCACHEPREFIX"
for i in 1 2 3; do PYTHONPYCACHEPREFIX=/tmp/pyc python3 -c "$imp"; done
echo "== import torch alone"
for i in 1 2; do python3 -c 'import time; t=time.perf_counter(); import torch; print(f"torch {time.perf_counter()-t:.2f} s")'; PYTHONPYCACHEPREFIX=/tmp/pyc python3 -c 'import time; t=time.perf_counter(); import torch; print(f"torch (prefix) {time.perf_counter()-t:.2f} s")'; done
echo "== setup_phases as is, then with PYTHONPYCACHEPREFIX"
PYTHONPATH=src python3 bench/setup_phases.py 2>&1 | grep -E "compile|all|imports"
PYTHONPATH=src PYTHONPYCACHEPREFIX=/tmp/pyc python3 bench/setup_phases.py 2>&1 | grep -E "compile|all|imports"
python3 -X importtime -c 'import torch._dynamo, torch._inductor.compile_fx' 2> $OUT/importtime.txt
sort -t'|' -k2 -n -r $OUT/importtime.txt | head -25
