# Per-study plots: peak memory of every GPU (CPU rank on CPU studies) and throughput, by cell.


rule study_plots:
    input:
        metrics=get_study_metrics,
        searches=get_study_searches,
        grid=get_study_grid,
    output:
        memory="results/plots/{study}_memory.png",
        throughput="results/plots/{study}_throughput.png",
    log:
        "results/logs/plots/{study}.log",
    params:
        missing=get_missing_cells,
        layout=get_plot_layout,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/make_plots.py"
