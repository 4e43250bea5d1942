# One job per grid cell: launch its ranks, write results/runs/{study}/{cell}/metrics.json.
# OOM, timeout and failure after retries are results in that file, not failed jobs.


rule train_cell:
    input:
        # the study's grid stamp, a trigger only when the cell's result is stale: see freshness.py
        grid=get_cell_grid,
    output:
        metrics="results/runs/{study}/{cell}/metrics.json",
    log:
        "results/runs/{study}/{cell}/log",
    params:
        # the cell's parameters, and nothing else: params are what trigger a rerun
        cell=get_cell_params,
    threads: cell_resource("threads")
    resources:
        # how the cell runs, not what it measures: changing these reruns nothing
        gpu=cell_resource("gpu"),
        gres=cell_resource("gres"),
        nodes=cell_resource("nodes"),
        tasks=cell_resource("tasks"),
        tasks_per_gpu=cell_resource("tasks_per_gpu"),
        mpi=cell_resource("mpi"),
        cpus_per_task=cell_resource("cpus_per_task"),
        mem_mb=cell_resource("mem_mb"),
        runtime=cell_resource("runtime"),
        cell_retries=cell_resource("retries"),
    conda:
        "../../envs/train.yaml"
    shell:
        "trainbench run-cell --study {wildcards.study} --cell {wildcards.cell} --params {params.cell:q}"
        " --retries {resources.cell_retries} --cpus-per-task {resources.cpus_per_task}"
        " --runtime-min {resources.runtime} --output {output.metrics} > {log} 2>&1"
