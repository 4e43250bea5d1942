# Per-study plots, one folder a study (paths.PLOTS_DIR; src/trainbench/reporting/plots.py): peak memory of
# every GPU (CPU rank on CPU studies) and throughput by cell, split into several files where a study has
# more cells than a figure holds; scaling efficiency where the study varies GPU counts from one GPU;
# where each profiled cell's step went, once a cell has a profile. A plot that would show nothing
# measured is not made (a study that measured nothing yet gets its predictions, titled so). plots.json in
# the folder lists them in reading order (none, for a study with nothing to plot): the study's page shows
# them in that order, and the report's front page its first ones; they are not items of the report again.


rule study_plots:
    input:
        metrics=get_study_metrics,
        searches=get_study_searches,
        grid=get_study_grid,
        models=MODELS_STAMP,
    output:
        directory(paths.PLOTS_DIR),
    log:
        paths.PLOTS_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        # what they show, the planned cells, those without a result and the models, as one line
        # (common.smk): a change redraws them
        made_with=made_with_of(WORKFLOW.plot_layout),
    script:
        "../scripts/make_plots.py"
