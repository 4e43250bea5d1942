"""Adapter for rule breakdown_plot: read the study's metrics.json files, draw where each profiled cell's
step went."""

import sys

from trainbench.execute.results import read_cells
from trainbench.reporting.plots import breakdown_plot

with open(snakemake.log[0], "w") as log:  # noqa: F821 - injected by Snakemake
    sys.stderr = log
    breakdown_plot(read_cells(snakemake.input.metrics), snakemake.params.layout["id_keys"],  # noqa: F821
                   snakemake.wildcards.study, snakemake.output[0])  # noqa: F821
