"""Adapter for rule study_plots: read the study's metrics.json files, draw its plots."""

import sys

from trainbench.plots import write_plots
from trainbench.results import read_cells, read_search
from trainbench.tables import with_searches

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    docs = with_searches(read_cells(snakemake.input.metrics),  # noqa: F821
                         [read_search(path) for path in snakemake.input.searches])  # noqa: F821
    write_plots(docs, study=snakemake.wildcards.study,  # noqa: F821
                id_keys=snakemake.params.layout["id_keys"],  # noqa: F821
                panel_keys=snakemake.params.layout["plot_panels"],  # noqa: F821
                memory_path=snakemake.output.memory, throughput_path=snakemake.output.throughput)  # noqa: F821
