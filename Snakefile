# Benchmarks of distributed training set-ups: one training run per grid cell of config.yaml,
# aggregated into results/tables/<study>.{csv,md} and results/plots/. See README.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


# the front page of `snakemake --report report.html`
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/plots.smk"
include: "workflow/rules/search.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_output(),
