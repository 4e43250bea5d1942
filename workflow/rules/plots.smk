# Per-study plots: peak memory of every GPU (CPU rank on CPU studies) and throughput, by cell.


rule study_plots:
    input:
        metrics=get_study_metrics,
        searches=get_study_searches,
        grid=get_study_grid,
    output:
        memory=paths.PLOT_MEMORY,
        throughput=paths.PLOT_THROUGHPUT,
    log:
        paths.PLOTS_LOG,
    params:
        missing=get_missing_cells,
        short_of_gpus=get_cells_short_of_gpus,
        planning=get_study_planning,
        layout=get_plot_layout,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/make_plots.py"
