# The workflow's only Python layer: load and check config.yaml through the trainbench package, and
# the input functions the rules use. Every decision about cells lives in the package (tested there).
import sys

try:
    from trainbench.config import load_config
    from trainbench.errors import ConfigError
    from trainbench.gpus import local_gpu_count
except ImportError as error:
    sys.exit(f"error: cannot import trainbench ({error}); set up the environment first: make setup")

from snakemake.settings.types import DeploymentMethod

try:
    # Schema validation (workflow/schemas/config.schema.yaml) plus the semantic checks of every cell.
    CONFIG = load_config(config)
except ConfigError as error:
    sys.exit(f"error: config.yaml: {error}")


wildcard_constraints:
    study=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    cell=r"[^/]+",


def get_study(wildcards):
    try:
        return CONFIG.study(wildcards.study)
    except ConfigError as error:
        sys.exit(f"error: target names {error}")


def get_cell(wildcards):
    try:
        return get_study(wildcards).cell(wildcards.cell)
    except ConfigError as error:
        sys.exit(f"error: target names {error}")


def get_cell_params(wildcards):
    """The cell's parameters as one canonical string: reruns follow exactly its changes."""
    return get_cell(wildcards).canonical


def get_cell_retries(wildcards):
    return get_cell(wildcards).execution["retries"]


def get_cell_cpus_per_rank(wildcards):
    return get_cell(wildcards).execution["cpus_per_rank"]


def cell_resource(name):
    """An input function returning one of the cell's resources (see Cell.resources)."""

    def get_cell_resource(wildcards):
        return get_cell(wildcards).resources()[name]

    get_cell_resource.__name__ = f"get_cell_{name}"
    return get_cell_resource


def get_study_metrics(wildcards):
    return get_study(wildcards).targets


def get_study_layout(wildcards):
    study = get_study(wildcards)
    return {"description": study.description, "id_keys": study.id_keys, "report": study.report}


def get_trainbench_command():
    """How jobs call the package: through the interpreter running Snakemake, unless a conda
    environment (--sdm conda) provides its own python on PATH."""
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
        return "python -m trainbench"
    return f"{sys.executable} -m trainbench"


def get_final_output():
    names = CONFIG.default_targets_studies(have_gpus=local_gpu_count() > 0)
    outputs = []
    for name in names:
        outputs += [f"results/tables/{name}.md", f"results/tables/{name}.csv",
                    f"results/plots/{name}_memory.png", f"results/plots/{name}_throughput.png"]
    return outputs
