#!/usr/bin/env bash
# Install the pipeline into a Python that has most of its stack but no package index (the GPU hosts:
# torch, lightning, transformers, pandas, matplotlib are there; snakemake, deepspeed, jsonschema are
# not). The wheelhouse holds the missing packages, built elsewhere with
#   python3 tools/build_wheelhouse.py WHEELHOUSE --python 3.12 --skip envs/gpu-host-image.txt
# and this adds them as they are (--no-deps: nothing to resolve against an index), then the checkout.
#
#   tools/install_offline.sh WHEELHOUSE [PYTHON]      (default PYTHON: python3)
set -euo pipefail
cd "$(dirname "$0")/.."
house=${1:?usage: tools/install_offline.sh WHEELHOUSE [PYTHON]}
python=${2:-python3}
wheels=()
for wheel in "$house"/*.whl; do
  case "$(basename "$wheel")" in trainbench-*) ;; *) wheels+=("$wheel") ;; esac
done
"$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-cache-dir "${wheels[@]}"
# the checkout itself, editable; setuptools comes from the machine, not an isolated build environment
"$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-build-isolation -e .
"$python" -c "import snakemake, deepspeed, lightning, transformers, trainbench; print('installed:', 'snakemake', snakemake.__version__, 'deepspeed', deepspeed.__version__, 'lightning', lightning.__version__, 'transformers', transformers.__version__)" 2>&1 | grep -v real_accelerator
