#!/usr/bin/env bash
# Create (or update) the virtual environment the pipeline runs in: envs/bootstrap.sh [VENV] [--test]
#
# torch goes in first and alone: if the interpreter already has torch (a GPU host's CUDA build), the
# venv sees it through --system-site-packages and keeps it; otherwise TORCH_SPEC is installed
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
  echo "creating $venv with $($python --version)"
  "$python" -m venv --system-site-packages "$venv"
fi
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "installing ${TORCH_SPEC:-torch==2.13.0}"
  "${pip[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "${TORCH_SPEC:-torch==2.13.0}"
fi
echo "installing envs/requirements.txt and trainbench (editable)"
"${pip[@]}" -r envs/requirements.txt
"${pip[@]}" --no-deps -e .
if [ "$with_tests" = 1 ]; then
  "${pip[@]}" -r envs/requirements-test.txt
fi
"$venv/bin/python" -c "import torch, deepspeed, snakemake, trainbench; print('environment ready:', '$venv', 'torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'snakemake', snakemake.__version__)" 2>&1 | grep -v "real_accelerator"
