#!/usr/bin/env bash
# Install the pipeline into a Python that has most of its stack but no package index (the GPU hosts:
# torch, lightning, transformers, pandas, matplotlib are there; snakemake, deepspeed, jsonschema are
# not). The wheelhouse holds the missing packages, built elsewhere with
#   python3 tools/build_wheelhouse.py WHEELHOUSE --python 3.12 --skip envs/gpu-host-image.txt
# and this adds them as they are (--no-deps: nothing to resolve against an index), then the checkout.
# A wheelhouse without wheels adds nothing (an environment that has the stack already), and a
# checkout the Python imports trainbench from already is not installed again.
#
#   tools/install_offline.sh WHEELHOUSE [PYTHON]      (default PYTHON: python3)
set -euo pipefail
cd "$(dirname "$0")/.."
house=${1:?usage: tools/install_offline.sh WHEELHOUSE [PYTHON]}
python=${2:-python3}
[[ -d "$house" ]] || { echo "no wheelhouse at $house" >&2; exit 1; }
shopt -s nullglob
wheels=()
for wheel in "$house"/*.whl; do
  case "$(basename "$wheel")" in trainbench-*) ;; *) wheels+=("$wheel") ;; esac
done
if (( ${#wheels[@]} )); then
  "$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-cache-dir "${wheels[@]}"
else
  echo "no wheels in $house: nothing to add"
fi
# the checkout itself, editable; setuptools comes from the machine, not an isolated build environment
if "$python" -c "import pathlib, sys, trainbench; sys.exit(not pathlib.Path(trainbench.__file__).resolve()
                 .is_relative_to(pathlib.Path('src').resolve()))" 2>/dev/null; then
  echo "trainbench imports from this checkout already"
else
  "$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-build-isolation -e .
fi
"$python" -c "import snakemake, deepspeed, lightning, transformers, trainbench; print('installed:', 'snakemake', snakemake.__version__, 'deepspeed', deepspeed.__version__, 'lightning', lightning.__version__, 'transformers', transformers.__version__)" 2>&1 | grep -v real_accelerator
