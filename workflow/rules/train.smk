# One job per grid cell: launch its ranks, write results/runs/{study}/{cell}/metrics.json.
# OOM, timeout and failure after retries are results in that file, not failed jobs.
# train_cell trains every study but those submitted as SLURM job arrays, which have a rule each
# (train_<study>: the SLURM plugin makes arrays of one rule's jobs; Workflow.train_rules).


for train_rule, studies in WORKFLOW.train_rules():

    rule:
        name:
            train_rule
        input:
            # the study's grid stamp, a trigger only when the cell's result is stale: see freshness.py
            grid=CELL_GRID_INPUT,
        output:
            metrics=paths.RUN,
        log:
            paths.RUN_LOG,
        wildcard_constraints:
            study=studies,
        conda:
            "../../envs/train.yaml"
        threads: cell_resource("threads")
        resources:
            **CELL_RESOURCES,
        params:
            # the cell's parameters, and nothing else: params are what trigger a rerun
            cell=get_cell_params,
        shell:
            "trainbench run-cell --study {wildcards.study} --cell {wildcards.cell} --params {params.cell:q}"
            " --retries {resources.cell_retries} --cpus-per-rank {resources.cpus_per_rank}"
            " --runtime-min {resources.cell_runtime} --timing {resources.timing} --output {output.metrics} > {log} 2>&1"


# The collectives' bus bandwidth and latency over {ranks} GPUs of this host, {interconnect} naming
# their type ("cpu": gloo ranks): `snakemake results/comm/h200-x2.json` (docs/communication.md).
rule commbench:
    output:
        table=paths.COMMBENCH,
    log:
        paths.COMMBENCH_LOG,
    wildcard_constraints:
        interconnect=r"[a-z0-9][a-z0-9-]*",
        ranks=r"\d+",
    conda:
        "../../envs/train.yaml"
    resources:
        gpu=lambda wildcards: 0 if wildcards.interconnect == "cpu" else int(wildcards.ranks),
    params:
        device=lambda wildcards: "cpu" if wildcards.interconnect == "cpu" else "cuda",
    shell:
        "trainbench commbench --ranks {wildcards.ranks} --device {params.device}"
        " --name {wildcards.interconnect}-x{wildcards.ranks} --out {output.table} > {log} 2>&1"


# The same across {nodes} nodes (2 or more) of {ranks} GPUs (or gloo ranks) each, through SLURM: one task
# per node and the job's command run without a step of its own, as a multi-node cell's; trainbench
# commbench then starts a launcher on every node with srun. `snakemake --profile profiles/slurm
# results/comm/h200-n2x8.json` (docs/communication.md).
rule commbench_nodes:
    output:
        table=paths.COMMBENCH_NODES,
    log:
        paths.COMMBENCH_NODES_LOG,
    wildcard_constraints:
        interconnect=r"[a-z0-9][a-z0-9-]*",
        nodes=r"[2-9]|[1-9]\d+",  # the plugin runs one node's job in a step of its own: <gpu>-x<ranks>
        ranks=r"\d+",
    conda:
        "../../envs/train.yaml"
    resources:
        gpu=None,
        gres=lambda wildcards: None if wildcards.interconnect == "cpu" else f"gpu:{wildcards.ranks}",
        nodes=lambda wildcards: int(wildcards.nodes),
        tasks=lambda wildcards: int(wildcards.nodes),
        tasks_per_gpu=lambda wildcards: None if wildcards.interconnect == "cpu" else 0,
        mpi="srun",
        cpus_per_task=lambda wildcards: int(wildcards.ranks) * (1 if wildcards.interconnect == "cpu" else 4),
        runtime=30,
    params:
        device=lambda wildcards: "cpu" if wildcards.interconnect == "cpu" else "cuda",
    shell:
        "trainbench commbench --nodes {wildcards.nodes} --ranks {wildcards.ranks} --device {params.device}"
        " --name {wildcards.interconnect}-n{wildcards.nodes}x{wildcards.ranks} --out {output.table} > {log} 2>&1"
