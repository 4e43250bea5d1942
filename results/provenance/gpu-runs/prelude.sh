# Sourced by the GPU-run scripts, in the checkout, before their own work: OUT (the device tool's folder
# for what comes back) must be set; the carried wheelhouse is installed once per machine (a warm one
# keeps bench-out/install.log, so a script that runs another skips it); the GPUs are named; Snakemake's
# scheduler arguments are set (scheduler.sh).
out=${OUT:?OUT}
mkdir -p bench-out
if [ ! -s bench-out/install.log ]; then
  bash tools/install_offline.sh .whl > bench-out/install.log 2>&1 \
    || { tail bench-out/install.log; rm -f bench-out/install.log; exit 1; }
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version,power.limit --format=csv,noheader
source tools/gpu-runs/scheduler.sh
