# Every cell of a study, whatever its status, into one CSV (all fields) and one markdown table, with the
# study's findings judged under it (and pair by pair in the findings CSV).


rule study_table:
    input:
        metrics=get_study_metrics,
        searches=get_study_searches,
        grid=get_study_grid,
    output:
        csv=paths.TABLE_CSV,
        md=paths.TABLE_MD,
        findings=paths.TABLE_FINDINGS,
    log:
        paths.TABLE_LOG,
    params:
        missing=get_missing_cells,
        short_of_gpus=get_cells_short_of_gpus,
        layout=get_study_layout,
        planning=get_study_planning,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/make_tables.py"
