# A study's table: the markdown (its answer, the cells with a result, findings, a count of the others),
# every column of the cells with a result (markdown), the CSV of the cells with a result, the plan (the
# cells without one) and the findings judged pair by pair.


rule study_table:
    input:
        metrics=get_study_metrics,
        searches=get_study_searches,
        grid=get_study_grid,
        models=MODELS_STAMP,
    output:
        # the page (rule study_page) renders both markdown files: the report lists the page, not them
        md=paths.TABLE_MD,
        every_column=paths.TABLE_ALL,
        csv=report(
            paths.TABLE_CSV,
            caption="../report/table_csv.rst",
            category="{study}",
            subcategory="data",
            labels={"shows": "measured cells, one row each (CSV, downloads)"},
        ),
        plan=report(
            paths.TABLE_PLAN,
            caption="../report/table_plan.rst",
            category="{study}",
            subcategory="data",
            labels={"shows": "planned and not-run cells, with predictions (CSV, downloads)"},
        ),
        # every pair each finding judged (thousands where planned cells pair up: 4 MB for llama), on
        # disk only: the markdown and the page give each finding's verdict and its first pairs
        findings=paths.TABLE_FINDINGS,
    log:
        paths.TABLE_LOG,
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        made_with=made_with_of(WORKFLOW.table_layout),
    script:
        "../scripts/make_tables.py"


# Every cell of every study on disk as one long table (parquet), for slicing across studies:
# `trainbench query`, pandas or DuckDB (docs/dataset.md).
rule dataset:
    input:
        cells=get_results_on_disk(),
        models=MODELS_STAMP,
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
