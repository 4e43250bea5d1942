"""Adapter for rule study_table: read the study's metrics.json files, write its CSV and markdown, and its
findings judged (findings CSV, and a section of the markdown)."""

import sys

from trainbench.study.config import load_config
from trainbench.execute.results import read_cells, read_search
from trainbench.reporting.tables import with_planned, with_searches, write_tables

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    layout = snakemake.params.layout  # noqa: F821
    # the study as the workflow expanded it: its planned cells and the grid's row order
    study = load_config(snakemake.config).study(snakemake.wildcards.study)  # noqa: F821
    docs = with_planned(read_cells(snakemake.input.metrics), study,  # noqa: F821
                        short_of_gpus=snakemake.params.short_of_gpus)  # noqa: F821
    docs = with_searches(docs, [read_search(path) for path in snakemake.input.searches])  # noqa: F821
    write_tables(docs, study=study.name, description=layout["description"], id_keys=layout["id_keys"],
                 report=layout["report"], csv_path=snakemake.output.csv, md_path=snakemake.output.md,  # noqa: F821
                 plan_for=study.plan_for, findings=layout["findings"], references=layout["references"],
                 findings_path=snakemake.output.findings)  # noqa: F821
