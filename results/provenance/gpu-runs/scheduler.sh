# Sourced by the GPU-run scripts: Snakemake's arguments for its job scheduler. pulp (Snakemake's ILP
# scheduler, 16 MiB of bundled solvers) may stay out of the carried wheelhouse to keep the tree that
# travels under the device tool's 64 MiB; without it Snakemake is told to schedule greedily.
scheduler=()
python3 -c "import pulp" 2>/dev/null || scheduler=(--scheduler greedy)
