# The workflow's only Python layer: load config.yaml and hand Snakemake what trainbench.workflow
# decides (which cells run and rerun, what a table waits for, what a job asks for), as input functions.
# What changes the process (the jobs' PATH, signal handling) runs in onstart, not while Snakemake parses.
import sys

try:
    from trainbench import paths
    from trainbench.execute.gpus import local_gpu_count
    from trainbench.reporting.tables import made_with
    from trainbench.workflow import STUDY_NAME, on_start, open_workflow
except ImportError as error:
    sys.exit(f"error: cannot import trainbench ({error}); set up the environment first: make setup")


WORKFLOW = open_workflow(config, remote=workflow.remote_exec, argv=sys.argv)


onstart:
    # the jobs' PATH, cells stopped with Snakemake, the SLURM status command (trainbench.workflow.on_start)
    on_start(workflow)


# Jobs call `trainbench` from the environment running Snakemake (on_start puts it first on PATH); a
# SLURM job's PATH is the submitting Snakemake's.
envvars:
    "PATH",


wildcard_constraints:
    study=STUDY_NAME,
    cell=r"[^/]+",
    micro_batch=r"[0-9]+",


def get_study(wildcards):
    return WORKFLOW.target_study(wildcards.study)


def get_cell(wildcards):
    return WORKFLOW.target_cell(wildcards.study, wildcards.cell)


def get_cell_params(wildcards):
    """The cell's parameters as one canonical string: reruns follow exactly its changes."""
    return get_cell(wildcards).canonical


def cell_resource(name):
    """One of the cell's resources: a value where every cell shares it, else an input function."""
    value = WORKFLOW.cell_resource(name)
    if not callable(value):
        return value

    def get_cell_resource(wildcards):
        return value(wildcards.study, wildcards.cell)

    get_cell_resource.__name__ = f"get_cell_{name}"
    return get_cell_resource


# A cell job's resources (the train_cell and search_probe rules)
CELL_RESOURCES = {resource: cell_resource(name) for resource, name in WORKFLOW.cell_resource_names().items()}


def get_cell_grid(wildcards):
    """The study's grid stamp: a trigger if the cell's result was made with other parameters."""
    cell = get_cell(wildcards)
    stamp = WORKFLOW.grid_stamp(get_study(wildcards))
    return stamp if WORKFLOW.grid_input_triggers(cell) else ancient(stamp)


# With no stale cell in any study (nothing changed since the results were made) every cell's stamp is
# ancient: a pattern says so with no function for Snakemake to call per job (5% of a dry run of
# 10,000 cells). The input is the same file either way, as Snakemake's "input changed" trigger needs.
CELL_GRID_INPUT = get_cell_grid if WORKFLOW.any_stale() else ancient(paths.GRID_STAMP)


def get_probe(wildcards):
    return WORKFLOW.probe(wildcards.study, wildcards.cell, int(wildcards.micro_batch))


def get_probe_params(wildcards):
    return get_probe(wildcards).canonical


def get_probe_id(wildcards):
    return get_probe(wildcards).cell_id


def get_search_probes(wildcards):
    """The search's probes so far (Workflow.search_probes): each call one probe further."""

    def probe_output(batch):
        probe = dict(study=wildcards.study, cell=wildcards.cell, micro_batch=batch)
        return checkpoints.search_probe.get(**probe).output.metrics

    return WORKFLOW.search_probes(get_study(wildcards), get_cell(wildcards), probe_output)


def get_cells_short_of_gpus(wildcards):
    """Cells this machine cannot run (Workflow.cells_short_of_gpus); none where it runs none."""
    if not WORKFLOW.runs_cells_here(workflow.executor_plugin):
        return {}
    return WORKFLOW.cells_short_of_gpus(get_study(wildcards), local_gpu_count())


def get_study_metrics(wildcards):
    return WORKFLOW.study_metrics(get_study(wildcards), get_cells_short_of_gpus(wildcards))


def of_study(decide):
    """An input function giving what `decide` (a Workflow method) says of the job's study."""

    def get(wildcards):
        return decide(get_study(wildcards))

    get.__name__ = f"get_{decide.__name__}"
    return get


get_study_searches = of_study(WORKFLOW.study_searches)
get_study_grid = of_study(WORKFLOW.grid_stamp)
# The models' predictions shown by tables, plots and the dataset: a param of theirs, so a change of the
# models reruns them (Workflow.prediction_models). One value for every job, no function to call per job.
PREDICTION_MODELS = WORKFLOW.prediction_models()
# ... and an input of theirs, rewritten when the models change, which reruns them where Snakemake has
# no record of their params (a fresh clone)
MODELS_STAMP = WORKFLOW.models_stamp()


def made_with_of(layout):
    """An input function: what a study's table or plots are made from besides their inputs (`layout`:
    what they show, a Workflow method), as one line (tables.made_with): a change reruns the job, and the
    report's info panel shows the line."""

    def get(wildcards):
        study = get_study(wildcards)
        return made_with(
            layout(study),
            WORKFLOW.planning(study),
            WORKFLOW.missing_cells(study),
            get_cells_short_of_gpus(wildcards),
            PREDICTION_MODELS,
        )

    get.__name__ = f"get_made_with_{layout.__name__}"
    return get


def get_pages_of_tabled_studies():
    return WORKFLOW.pages_of_tabled_studies()


def get_results_on_disk():
    return WORKFLOW.results_on_disk()


def get_final_output():
    # `snakemake --report` reads Snakemake's own command line: the Snakefile is not told otherwise
    reporting = any(arg == "--report" or arg.startswith("--report=") for arg in sys.argv)
    return WORKFLOW.final_output(have_gpus=local_gpu_count() > 0, reporting=reporting)
