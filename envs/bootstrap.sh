#!/usr/bin/env bash
# Create (or update) the virtual environment the pipeline runs in: envs/bootstrap.sh [VENV] [--test]
#
# torch goes in first and alone: if the interpreter already has torch (a GPU host's CUDA build), the
# venv sees it through --system-site-packages and keeps it; otherwise the venv is isolated and
# TORCH_SPEC is installed
# (default torch==2.13.0; set TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu for a CPU build
# where the default index would give the multi-GB CUDA one).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
with_tests=0
for arg in "$@"; do
  case "$arg" in
    --test) with_tests=1 ;;
    *) venv="$arg" ;;
  esac
done
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  if "$python" -c "import torch" 2>/dev/null; then
    # keep the machine's own torch (a GPU host's CUDA build) and what came with it
    echo "creating $venv with $($python --version), seeing its packages (torch is there)"
    "$python" -m venv --system-site-packages "$venv"
  else
    echo "creating $venv with $($python --version)"
    "$python" -m venv "$venv"
  fi
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# Some machines' pip configuration names index folders that do not exist; pip warns about each one.
quiet_pip() { "${pip[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "installing ${TORCH_SPEC:-torch==2.13.0}"
  quiet_pip ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "${TORCH_SPEC:-torch==2.13.0}"
fi
echo "installing envs/requirements.txt and trainbench (editable)"
quiet_pip -r envs/requirements.txt
quiet_pip --no-deps -e .
if [ "$with_tests" = 1 ]; then
  quiet_pip -r envs/requirements-test.txt
fi
# DeepSpeed's CPU accelerator compiles its shared-memory collectives (a C++ op, 25-55 s on 2 cores)
# the first time a CPU cell starts its engine; built here, into the folder the cells' ranks use
# (this environment's own: trainbench.execute.launch.cache_environment), every CPU cell after loads
# it. A GPU machine's accelerator has no such op: nothing to do there. The environment's own tools
# first on PATH, as the ranks have them (launch.launch_environment): a build made with another ninja
# is built again.
PATH="$(cd "$venv/bin" && pwd):$PATH" "$venv/bin/python" - <<'PY' 2>&1 | grep -v "real_accelerator"
import os

from trainbench.execute.launch import cache_environment

os.environ.update({k: v for k, v in cache_environment(os.environ).items() if k == "TORCH_EXTENSIONS_DIR"})
import deepspeed.ops
from deepspeed.accelerator import get_accelerator

builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    builder.load(verbose=False)
    print(f"DeepSpeed's {builder.NAME} op built for CPU cells")
PY
"$venv/bin/python" -c "import torch, deepspeed, snakemake, trainbench; print('environment ready:', '$venv', 'torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'snakemake', snakemake.__version__)" 2>&1 | grep -v "real_accelerator"
