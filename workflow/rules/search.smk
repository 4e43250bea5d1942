# The largest micro batch each cell trains (results/search/{study}/{cell}/max_batch.json): probes
# double then bisect the micro batch (src/trainbench/predict/batch_search.py). Each probe is a checkpoint
# job of its own, so the next probe is chosen from the last one's result, and an interrupted search
# resumes from the probes already on disk.


checkpoint search_probe:
    output:
        metrics=paths.PROBE,
    log:
        paths.PROBE_LOG,
    conda:
        "../../envs/train.yaml"
    threads: cell_resource("threads")
    resources:
        **CELL_RESOURCES,
    params:
        cell=get_probe_params,
        probe_id=get_probe_id,
    shell:
        "trainbench run-cell --study {wildcards.study} --cell {params.probe_id:q} --params {params.cell:q}"
        " --retries {resources.cell_retries} --cpus-per-rank {resources.cpus_per_rank}"
        " --runtime-min {resources.cell_runtime} --timing {resources.timing} --search-probe --output {output.metrics:q} > {log:q} 2>&1"


rule search_result:
    input:
        probes=get_search_probes,
    output:
        paths.SEARCH,
    log:
        paths.SEARCH_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        tolerance=lambda wildcards: get_study(wildcards).search["tolerance"],
        bound=lambda wildcards: get_study(wildcards).search["max_micro_batch"],
    shell:
        "trainbench search-summary --tolerance {params.tolerance} --max-micro-batch {params.bound} --output {output:q} {input.probes:q} > {log:q} 2>&1"
