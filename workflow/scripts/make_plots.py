"""Adapter for rule study_plots: read the study's metrics.json files, draw its plots (planned cells at
their predictions) into its plot folder."""

import sys

from trainbench.study.config import load_config
from trainbench.reporting.plots import write_plots
from trainbench.execute.results import read_cells, read_search
from trainbench.reporting.tables import with_planned, with_searches

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    study = load_config(snakemake.config).study(snakemake.wildcards.study)  # noqa: F821
    docs = with_planned(read_cells(snakemake.input.metrics), study,  # noqa: F821
                        short_of_gpus=snakemake.params.short_of_gpus)  # noqa: F821
    docs = with_searches(docs, [read_search(path) for path in snakemake.input.searches])  # noqa: F821
    written = write_plots(docs, study=study.name, id_keys=snakemake.params.layout["id_keys"],  # noqa: F821
                          panel_keys=snakemake.params.layout["plot_panels"],  # noqa: F821
                          profiled=study.profiled, directory=snakemake.output[0])  # noqa: F821
    print(f"{len(written)} plots: {', '.join(path.name for path in written)}", file=log)
