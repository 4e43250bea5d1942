# Every cell of a study, whatever its status, into one CSV (all fields) and one markdown table, with the
# study's findings judged under it (and pair by pair in the findings CSV).


rule study_table:
    input:
        metrics=get_study_metrics,
        searches=get_study_searches,
        grid=get_study_grid,
    output:
        csv=report(
            paths.TABLE_CSV,
            caption="../report/table_csv.rst",
            category="{study}",
            subcategory="tables",
            labels={"shows": "table, every field of every cell (CSV)"},
        ),
        md=report(
            paths.TABLE_MD,
            caption="../report/table_md.rst",
            category="{study}",
            subcategory="tables",
            labels={"shows": "table (markdown)"},
        ),
        findings=report(
            paths.TABLE_FINDINGS,
            caption="../report/findings_csv.rst",
            category="{study}",
            subcategory="tables",
            labels={"shows": "findings, pair by pair (CSV)"},
        ),
    log:
        paths.TABLE_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        missing=get_missing_cells,
        short_of_gpus=get_cells_short_of_gpus,
        layout=get_study_layout,
        planning=get_study_planning,
        prediction_models=PREDICTION_MODELS,
    script:
        "../scripts/make_tables.py"


# Every cell of every study on disk as one long table (parquet), for slicing across studies:
# `trainbench query`, pandas or DuckDB (docs/dataset.md).
rule dataset:
    input:
        get_results_on_disk(),
    output:
        report(
            paths.DATASET,
            caption="../report/dataset.rst",
            category="dataset",
            labels={"shows": "every cell of every study, one row per figure (parquet)"},
        ),
    log:
        paths.DATASET_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        prediction_models=PREDICTION_MODELS,
    script:
        "../scripts/make_dataset.py"
