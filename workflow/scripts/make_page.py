"""Adapter for rule study_page: the study's page (its plots linked), the report's copy of it (its plots
embedded) and its part of the report's front page, from its table, its plots and its metrics.json files."""

import sys

from trainbench.reporting.documents import read_cells
from trainbench.reporting.report import write_study_page
with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    write_study_page(snakemake.output.page, study=snakemake.wildcards.study,  # noqa: F821
                     table_path=snakemake.input.table, plots_dir=snakemake.input.plots,  # noqa: F821
                     every_column_path=snakemake.input.every_column,  # noqa: F821
                     report_path=snakemake.output.report_page,  # noqa: F821
                     front_path=snakemake.output.front, findings_path=snakemake.input.findings,  # noqa: F821
                     docs=read_cells(snakemake.input.metrics))  # noqa: F821
