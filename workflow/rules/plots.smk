# Per-study plots: peak memory of every GPU (CPU rank on CPU studies) and throughput, by cell.


rule study_plots:
    input:
        metrics=get_study_metrics,
        searches=get_study_searches,
        grid=get_study_grid,
    output:
        memory=report(
            paths.PLOT_MEMORY,
            caption="../report/memory_plot.rst",
            category="{study}",
            subcategory="plots",
            labels={"shows": "peak memory: measured and predicted"},
        ),
        throughput=report(
            paths.PLOT_THROUGHPUT,
            caption="../report/throughput_plot.rst",
            category="{study}",
            subcategory="plots",
            labels={"shows": "throughput with 95% intervals"},
        ),
    log:
        paths.PLOTS_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        missing=get_missing_cells,
        short_of_gpus=get_cells_short_of_gpus,
        planning=get_study_planning,
        layout=get_plot_layout,
        prediction_models=PREDICTION_MODELS,
    script:
        "../scripts/make_plots.py"


# A study that profiles its cells (timing: profile_steps): where each cell's step went.
rule breakdown_plot:
    input:
        metrics=get_study_metrics,
        grid=get_study_grid,
    output:
        report(
            paths.PLOT_BREAKDOWN,
            caption="../report/breakdown_plot.rst",
            category="{study}",
            subcategory="plots",
            labels={"shows": "where a step's time went: profiled and predicted"},
        ),
    log:
        paths.BREAKDOWN_PLOT_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        layout=get_plot_layout,
        prediction_models=PREDICTION_MODELS,
    script:
        "../scripts/make_breakdown_plot.py"
