# One job per grid cell: launch its ranks, write results/runs/{study}/{cell}/metrics.json.
# OOM, timeout and failure after retries are results in that file, not failed jobs.


rule train_cell:
    output:
        metrics="results/runs/{study}/{cell}/metrics.json",
    log:
        "results/runs/{study}/{cell}/log",
    params:
        cell=get_cell_params,
        retries=get_cell_retries,
        cpus_per_rank=get_cell_cpus_per_rank,
        trainbench=get_trainbench_command(),
    threads: cell_resource("threads")
    resources:
        gpu=cell_resource("gpu"),
        nodes=cell_resource("nodes"),
        tasks=cell_resource("tasks"),
        cpus_per_task=cell_resource("cpus_per_task"),
        mem_mb=cell_resource("mem_mb"),
        runtime=cell_resource("runtime"),
    conda:
        "../../envs/train.yaml"
    shell:
        "{params.trainbench} run-cell --study {wildcards.study} --cell {wildcards.cell}"
        " --params {params.cell:q} --retries {params.retries} --cpus-per-rank {params.cpus_per_rank}"
        " --runtime-min {resources.runtime} --output {output.metrics} > {log} 2>&1"
