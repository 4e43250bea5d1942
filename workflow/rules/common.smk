# The workflow's only Python layer: load and check config.yaml through the trainbench package, and
# the input functions the rules use. Every decision about cells lives in the package (tested there).
import os
import sys
from pathlib import Path

try:
    from trainbench.predict.batch_search import bounds_for, walk
    from trainbench import paths
    from trainbench.study.config import load_config
    from trainbench.errors import ConfigError
    from trainbench.reporting.freshness import prepare, set_aside_invalid, stamp_path
    from trainbench.execute.gpus import local_gpu_count, short_of_gpus
    from trainbench.study.grid import probe_cell, shared_resources
    from trainbench.execute.lifetime import stale_lock_hint, stop_cells_on_sigterm
    from trainbench.execute.results import read_json
    from trainbench.execute.slurm import StatusCommandError, ensure_status_command
except ImportError as error:
    sys.exit(f"error: cannot import trainbench ({error}); set up the environment first: make setup")


# A run killed by a signal it cannot catch leaves its lock: say how to go on, before Snakemake's own
# "cannot be locked" (not while unlocking, nor while another run here holds the lock).
if "--unlock" not in sys.argv and (hint := stale_lock_hint()):
    print(f"trainbench: {hint}", file=sys.stderr)

try:
    # Schema validation (workflow/schemas/config.schema.yaml) plus the semantic checks of every cell.
    CONFIG = load_config(config)
except ConfigError as error:
    sys.exit(f"error: config.yaml: {error}")

# Grid stamps let reruns follow config.yaml even without .snakemake metadata (a fresh clone):
# see src/trainbench/reporting/freshness.py. Rewritten only when a study's cells or their parameters change.
# A job run remotely (a SLURM job's own Snakemake) runs the one job it was given, whatever is stale:
# the Snakemake that submitted it decided that, so it reads no results (on a grid of 10,000 cells,
# seconds of every job's allocation).
if workflow.remote_exec:
    STALE_CELLS = {name: set() for name in CONFIG.studies}
else:
    STALE_CELLS = {name: prepare(study) for name, study in CONFIG.studies.items()}


onstart:
    # SIGTERM to Snakemake stops the running cells too, instead of waiting for them (lifetime.py)
    stop_cells_on_sigterm()
    # Under the SLURM executor: a status command that cannot see jobs finish makes Snakemake wait
    # forever without a word (sacct on a cluster without accounting); check it before submitting.
    try:
        ensure_status_command(workflow)
    except StatusCommandError as error:
        sys.exit(f"error: {error}")


# Jobs call `trainbench` from the environment running Snakemake (a venv need not be activated);
# under --sdm conda, Snakemake puts the rule's environment in front of this. Done through PATH rather
# than a path in the rule, so neither the rule's text nor its params depend on where the clone is.
envvars:
    "PATH",


search_path = os.environ["PATH"]
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), search_path])


wildcard_constraints:
    study=r"[A-Za-z0-9][A-Za-z0-9_-]*",
    cell=r"[^/]+",
    micro_batch=r"[0-9]+",


def signature_once(function):
    """Give Snakemake an input function's signature once. Snakemake inspects the signature
    (inspect.signature) of every input function two or three times per call; a cell's job calls
    fifteen (params, the grid stamp, each resource), so on a grid of 10,000 cells that was a third of
    a dry run. Snakemake's own wrappers of input functions (snakemake.ioutils) hand it theirs so."""
    try:
        from snakemake.common import get_function_params, overwrite_function_params
    except ImportError:  # another Snakemake: it inspects as before
        return function
    overwrite_function_params(function, get_function_params(function))
    return function


# Snakemake calls every callable resource through its own Resource.evaluate(self, *args, **kwargs),
# whose signature it inspects the same way, for every resource of every job. It takes any keyword, so
# Snakemake passes it the same arguments whether it inspects it each time or was told once.
try:
    from snakemake.resources import Resource

    signature_once(Resource.evaluate)
except ImportError:
    pass


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


@signature_once
def get_cell_params(wildcards):
    """The cell's parameters as one canonical string: reruns follow exactly its changes."""
    return get_cell(wildcards).canonical


# What every cell of config.yaml asks for alike (on a grid swept over batch sizes and seeds, most of
# it): given to Snakemake as values, which it takes as they are. A resource given as a function costs
# a call through Snakemake's input-function machinery for every job it plans (thirteen per cell job:
# 2 s of a dry run of 10,000 cells). A job run remotely plans one job: values gain it nothing, and
# finding them means every cell's resources (0.3 s of its start at 40,000 cells).
if workflow.remote_exec:
    SHARED_RESOURCES = {}
else:
    SHARED_RESOURCES = shared_resources(c for study in CONFIG.studies.values() for c in study.cells)


def cell_resource(name):
    """One of the cell's resources (see Cell.resources): its value where every cell shares it, else
    an input function returning the job's cell's."""
    if name in SHARED_RESOURCES:
        return SHARED_RESOURCES[name]

    def get_cell_resource(wildcards):
        return get_cell(wildcards).resources()[name]

    get_cell_resource.__name__ = f"get_cell_{name}"
    return signature_once(get_cell_resource)


# A cell job's resources (the train_cell and search_probe rules): how it runs, not what it measures,
# so changing them reruns nothing.
CELL_RESOURCES = {
    resource: cell_resource(name)
    for resource, name in (
        ("gpu", "gpu"),
        ("gres", "gres"),
        ("nodes", "nodes"),
        ("tasks", "tasks"),
        ("tasks_per_gpu", "tasks_per_gpu"),
        ("mpi", "mpi"),
        ("cpus_per_task", "cpus_per_task"),
        ("cpus_per_rank", "cpus_per_rank"),
        ("mem_mb", "mem_mb"),
        ("runtime", "runtime"),
        ("cell_retries", "retries"),
        ("timing", "timing"),
    )
}


@signature_once
def get_cell_grid(wildcards):
    """The study's grid stamp: a trigger if the cell's result was made with other parameters,
    ancient (never a trigger) otherwise."""
    cell = get_cell(wildcards)
    stamp = stamp_path(cell.study)
    return stamp if cell.cell_id in STALE_CELLS[cell.study] else ancient(stamp)


# A cell's grid-stamp input. With no stale cell in any study (the usual case: nothing changed since
# the results were made) every cell's stamp is ancient, and a pattern says so with no function for
# Snakemake to call per job (on a grid of 10,000 cells, 5% of a dry run). The input is the same file
# either way, as Snakemake's "input changed" trigger needs.
CELL_GRID_INPUT = get_cell_grid if any(STALE_CELLS.values()) else ancient(paths.GRID_STAMP)


def get_probe(wildcards):
    """A max-batch probe: its cell with the probe's micro batch."""
    return probe_cell(get_study(wildcards), get_cell(wildcards), int(wildcards.micro_batch))


@signature_once
def get_probe_params(wildcards):
    return get_probe(wildcards).canonical


@signature_once
def get_probe_id(wildcards):
    return get_probe(wildcards).cell_id


def get_search_probes(wildcards):
    """The search's probes so far. Asking for a probe not yet run makes Snakemake run it and call
    this again, one probe further."""
    study, cell = get_study(wildcards), get_cell(wildcards)
    paths = {}

    def status_of(batch):
        probe = dict(study=study.name, cell=cell.cell_id, micro_batch=batch)
        paths[batch] = checkpoints.search_probe.get(**probe).output.metrics
        if set_aside_invalid(paths[batch]):
            checkpoints.search_probe.get(**probe)  # now missing: Snakemake runs the probe again
        return read_json(paths[batch])["status"]

    walk(status_of, *bounds_for(study.search, cell.params), study.search["tolerance"])
    return list(paths.values())


def cells_run_here():
    """Whether cells run on this machine: not through a cluster executor, whose profile also says so
    for its dry runs (config placement: cluster)."""
    plugin = workflow.executor_plugin
    return CONFIG.placement == "local" and (plugin is None or plugin.common_settings.local_exec)


SAID_SHORT = set()


def get_cells_short_of_gpus(wildcards):
    """The study's measured cells that must run (no current result) but cannot on this machine, and
    why ("needs 4 GPUs"): left out of its table's inputs, shown as rows that say so, and named once
    when the workflow plans. Empty under a cluster executor."""
    study = get_study(wildcards)
    if not cells_run_here():
        return {}
    here = local_gpu_count()
    short = {}
    for cell in study.cells:
        why = short_of_gpus(cell.params, here) if cell.measured and not cell.unsupported else None
        if why and (not os.path.exists(cell.target) or cell.cell_id in STALE_CELLS[study.name]):
            short[cell.cell_id] = f"{why}, more than the machine that made this table has"
    if short and study.name not in SAID_SHORT:
        SAID_SHORT.add(study.name)
        print(
            f"trainbench: {study.name}: {len(short)} cell(s) need more GPUs than this machine has ({here}) and "
            f"will not run here: {', '.join(sorted(short)[:4])}{' ...' if len(short) > 4 else ''}. Their rows in "
            f"{paths.path(paths.TABLE_MD, study=study.name)} say so; run them on a bigger machine, or with "
            f"--profile profiles/slurm.",
            file=sys.stderr,
        )
    return short


def get_study_metrics(wildcards):
    short = get_cells_short_of_gpus(wildcards)
    return [cell.target for cell in get_study(wildcards).cells if cell.measured and cell.cell_id not in short]


def get_study_searches(wildcards):
    targets = get_study(wildcards).search_targets
    for path in targets:
        # a search summary that is not one is made again from its probes
        set_aside_invalid(path)
    return targets


def get_study_grid(wildcards):
    return stamp_path(get_study(wildcards).name)


def get_study_layout(wildcards):
    """What the table shows (a params change reruns the table alone)."""
    study = get_study(wildcards)
    return {
        "description": study.description,
        "id_keys": study.id_keys,
        "report": study.report,
        "findings": study.findings,
    }


def get_plot_layout(wildcards):
    """What the plots show (a params change reruns the plots alone)."""
    study = get_study(wildcards)
    return {"id_keys": study.id_keys, "plot_panels": list(study.plot_panels)}


def get_missing_cells(wildcards):
    """The study's measured cells without a result, as a rerun trigger of its table and plots.
    Snakemake regenerates no missing input of a job it finds up to date (as for deleted intermediate
    files); a result deleted, or set aside as invalid, must still run again and reach the table."""
    return sorted(
        c.cell_id for c in get_study(wildcards).cells if c.measured and not os.path.exists(c.target)
    )


def get_study_planning(wildcards):
    """What the table's planned rows depend on (see Study.planned), as a rerun trigger: their cells'
    parameter hashes, sorted, and the planning hardware. Reordering config.yaml changes neither."""
    study = get_study(wildcards)
    return {
        "plan_for": study.plan_for,
        "planned": sorted(f"{c.cell_id}={c.params_hash}" for c in study.planned),
    }


def get_pages_of_tabled_studies():
    """The page of every study that has a table on disk (rule report_all)."""
    return [
        paths.path(paths.STUDY_PAGE, study=name)
        for name in CONFIG.studies
        if os.path.exists(paths.path(paths.TABLE_MD, study=name))
    ]


def get_final_output():
    names = CONFIG.default_targets_studies(have_gpus=local_gpu_count() > 0)
    return [output for name in names for output in paths.study_outputs(name)]
