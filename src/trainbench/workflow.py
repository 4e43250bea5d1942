"""The Snakefile's side of the package: config.yaml as the workflow loads it, and every decision its
input functions make (which cells run, which must rerun, what a table waits for, what a job asks the
scheduler for). workflow/rules/common.smk only hands these to Snakemake; tests/test_workflow_layer.py
checks them without Snakemake. Nothing here reaches into Snakemake's internals.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trainbench import paths, predict, registry
from trainbench.errors import ConfigError
from trainbench.execute.gpus import local_gpu_count
from trainbench.study.grid import short_of_gpus
from trainbench.contract.result import read_json
from trainbench.contract.result import write_text_atomic
from trainbench.execute.slurm import StatusCommandError, ensure_status_command
from trainbench.execute.watch import stale_lock_hint, stop_cells_on_sigterm
from trainbench.predict import communication
from trainbench.predict.batch_search import bounds_for, walk
from trainbench.reporting import findings, references
from trainbench.reporting.columns import report_problems
from trainbench.reporting.freshness import (CURRENT, prepare, refresh_models_stamp, result_state,
                                             set_aside_invalid, stamp_path)
from trainbench.study.config import Config, load_config
from trainbench.study.grid import Cell, Study, no_runner_problems, probe_cell, shared_resources

# Snakemake resource name -> the cell's resource (Cell.resources) it takes its value from. How a cell
# runs, not what it measures: changing them reruns nothing.
CELL_RESOURCES = {
    "gpu": "gpu", "gres": "gres", "nodes": "nodes", "tasks": "tasks", "tasks_per_gpu": "tasks_per_gpu",
    "mpi": "mpi", "cpus_per_task": "cpus_per_task", "cpus_per_rank": "cpus_per_rank", "mem_mb": "mem_mb",
    "runtime": "runtime", "cell_runtime": "cell_runtime", "cell_retries": "retries", "timing": "timing",
    "slurm_partition": "slurm_partition", "slurm_account": "slurm_account", "constraint": "constraint",
    "gpu_model": "gpu_model",
}
# Where a cell's SLURM job runs (a study's execution). A rule's resource replaces the profile's
# --default-resources of that name even where it is None, so these are declared to Snakemake only
# where some cell names one.
SLURM_PLACEMENT = ("slurm_partition", "slurm_account", "constraint", "gpu_model")
# what a study's name may be (the {study} wildcard)
STUDY_NAME = r"[A-Za-z0-9][A-Za-z0-9_-]*"
# What the memory and time models' predictions are computed from: every module of the predict package
# (the models, the time model's fitted constants, the batch search's model_largest) and of the registry
# they look models, frameworks and GPUs up in (so a module added to either counts too), the cell
# parameters they read and the view they read them through, and the reporting module that puts their
# figures in tables and plots. Not `advise`: it reads the models, and no table shows its figures.
PREDICTION_PACKAGES = (predict, registry)
PREDICTION_FILES = (".py", ".json")
PREDICTION_MODULES = ("study/params.py", "study/cell_view.py", "reporting/predictions.py")  # trainbench/
NOT_PREDICTION_INPUTS = ("predict/advise.py",)


def prediction_inputs(here: Path | None = None) -> list[tuple[str, Path]]:
    """What the models' predictions are read from, each with the name it is hashed under: the files
    above, and the bandwidth tables the time model times collectives by (communication.table_files)."""
    top = Path(predict.__file__).parents[1]  # the trainbench package
    files = [f for package in PREDICTION_PACKAGES for f in Path(package.__file__).parent.iterdir()
             if f.suffix in PREDICTION_FILES] + [top / module for module in PREDICTION_MODULES]
    return [(str(f.relative_to(top)), f) for f in sorted(files)
            if str(f.relative_to(top)) not in NOT_PREDICTION_INPUTS] + [
        (str(communication.COMM_DIR / f.name), f) for f in communication.table_files(here)]


def prediction_models_digest(here: Path | None = None) -> str:
    """A digest of prediction_inputs (Workflow.prediction_models)."""
    digest = hashlib.sha256()
    for name, file in prediction_inputs(here):
        content = file.read_bytes()
        # name and length before the bytes: a file renamed, or bytes moved between files, count
        digest.update(f"{name}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()[:16]


# The results of a study defined in a file git ignores (a user's own, in studies/local/) are ignored too:
# results/.gitignore names them (and itself), as the project's .gitignore names smoke's. Every folder and
# file the workflow writes a study's results to, relative to results/.
LOCAL_IGNORE = "results/.gitignore"
LOCAL_RESULTS = ("/runs/{study}/", "/history/{study}/", "/search/{study}/", "/plots/{study}/",
                 "/tables/{study}.*", "/.grid/{study}.json")
LOCAL_IGNORE_HEADER = (
    "# Written by the workflow: the results of the studies defined in files git ignores (studies/local/),\n"
    "# a user's own, as those files are. It ignores itself, and keeps a study that went until one of the\n"
    "# project's takes its name.\n/.gitignore\n")


def ignored_studies(config: Config) -> set[str] | None:
    """The studies defined in a study file git ignores, or outside the repository; None where git cannot
    say (no git, or no repository: nothing to keep out of one). A study file not yet added is not one:
    its results are the project's to add with it."""
    files = {origin for origin in config.origins.values() if origin != config.source}
    inside = sorted(f for f in files if not Path(f).is_absolute())
    ignored = {f for f in files if Path(f).is_absolute()}
    if inside:
        try:
            checked = subprocess.run(["git", "check-ignore", "--", *inside], cwd=config.base,
                                     capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return None
        if checked.returncode not in (0, 1):  # 1: none ignored; 128: not a repository
            return None
        ignored |= set(checked.stdout.splitlines())
    return {name for name, origin in config.origins.items() if origin in ignored}


def ignore_local_results(config: Config) -> Path | None:
    """Name the results of the ignored studies in results/.gitignore, rewritten where that changes; a
    study named before and no longer defined stays named (its results are still the user's). Returns
    the file, or None where there is none."""
    ignored = ignored_studies(config)
    path = config.base / LOCAL_IGNORE
    if ignored is None:
        return path if path.exists() else None
    before = set(re.findall(r"^/runs/(.+)/$", path.read_text(), re.M)) if path.exists() else set()
    names = sorted(ignored | (before - set(config.studies)))
    if not names and not path.exists():
        return None
    text = LOCAL_IGNORE_HEADER + "".join(line.format(study=name) + "\n"
                                         for name in names for line in LOCAL_RESULTS)
    if not path.exists() or path.read_text() != text:
        write_text_atomic(path, text)
    return path


def array_rule(study: str) -> str:
    """The rule that trains a study submitted as SLURM job arrays (--slurm-array-jobs names it)."""
    return "train_" + study.replace("-", "_")


def array_studies(config: Config) -> list[str]:
    """The studies submitted as SLURM job arrays (execution.slurm_array), each under a rule of its own."""
    return [name for name, study in config.studies.items() if study.slurm_array]


def load_checked(source: dict[str, Any] | str | Path) -> Config:
    """config.yaml as the workflow and the command line take it: the studies (study.config.load_config)
    and what each study reports, its table columns and its findings, checked before any job runs."""
    config = load_config(source)
    if config.models:
        # your models built, checked and counted (on fake tensors) before any job runs: a definition
        # that cannot train is refused here, by name; each is counted once (results/models/<name>.json)
        from trainbench.training.user_models import FACTS_DIR, count_registered

        try:
            count_registered(config.base / FACTS_DIR)
        except ConfigError as error:  # its lines name the model: here they get the file that defines it
            raise ConfigError(config.place(error.problems)) from None
    problems: list[str] = []
    for name, study in config.studies.items():
        problems += report_problems(name, study.report)
        params = [c.params.as_dict() for c in study.cells]
        problems += findings.problems(name, study.findings, params, study.id_keys)
        problems += references.problems(name, study.references, params)
    rules: dict[str, str] = {}
    for name in array_studies(config):
        rule = array_rule(name)
        if rule == "train_cell" or rule in rules:
            taken = "trains every other study" if rule == "train_cell" else f"study {rules[rule]} has"
            problems.append(f"studies.{name}.execution.slurm_array: its rule would be {rule!r}, which "
                            f"{taken} already; rename the study")
        rules[rule] = name
    if problems:
        raise ConfigError(config.place(problems))
    return config


# What the report offers for download, by suffix, that Python's table of types lacks
REPORT_TYPES = {".parquet": "application/vnd.apache.parquet"}


def open_workflow(config: dict[str, Any], *, remote: bool, argv: list[str]) -> Workflow:
    """The Workflow of config.yaml as Snakemake parses the Snakefile (common.smk), or an exit naming what
    is wrong (each line names its file: config.yaml, or the study file that defines the study or model).
    Before Snakemake goes on: a run killed by a signal it cannot catch leaves its lock, so say how to go
    on before Snakemake's own "cannot be locked" (not while unlocking, nor while another run here holds
    the lock); and the report's file types, which `snakemake --report` reads in this process."""
    if "--unlock" not in argv and (hint := stale_lock_hint()):
        print(f"trainbench: {hint}", file=sys.stderr)
    for suffix, kind in REPORT_TYPES.items():
        mimetypes.add_type(kind, suffix)
    try:
        return Workflow(load_checked(config), remote=remote, gpus_here=local_gpu_count())
    except ConfigError as error:
        sys.exit(f"error: {error}")


def jobs_search_path(path: str, python: str = sys.executable) -> str:
    """PATH for the jobs: this Python's environment first, so that a job's `trainbench` is the one that
    runs Snakemake (a venv need not be activated; under --sdm conda Snakemake puts a rule's environment
    in front). Through PATH rather than a path in the rules, so that neither a rule's text nor its
    params depend on where the clone is."""
    here = str(Path(python).parent)
    return path if path.split(os.pathsep)[0] == here else os.pathsep.join([here, path])


def on_start(workflow: Any) -> None:
    """Snakemake's onstart: what changes this process once it runs jobs, and not while it parses, plans
    a dry run or writes a report. The jobs' PATH (jobs_search_path; a SLURM job gets it through the
    Snakefile's `envvars`); SIGTERM stopping the running cells too, not only Snakemake (watch.py); and
    under the SLURM executor, a status command that sees jobs finish, checked before any is submitted
    (sacct on a cluster without accounting would leave Snakemake waiting without a word)."""
    os.environ["PATH"] = jobs_search_path(os.environ["PATH"])
    stop_cells_on_sigterm()
    try:
        ensure_status_command(workflow)
    except StatusCommandError as error:
        sys.exit(f"error: {error}")


class Workflow:
    """The loaded config, and what the rules ask of it.

    `remote`: this Snakemake runs one job somewhere else (a SLURM job's own Snakemake). It was told
    which job, so it reads no results to find stale cells and plans no shared resources (on a grid of
    10,000 cells, seconds of every job's allocation)."""

    def __init__(self, config: Config, *, remote: bool = False, gpus_here: int | None = None):
        no_runner = [p for study in config.studies.values() for p in no_runner_problems(study)]
        if no_runner:
            raise ConfigError(config.place(no_runner))
        self.config = config
        # Cells whose result was made with other parameters, by study: they rerun (freshness.prepare
        # also rewrites the grid stamps reruns follow without .snakemake metadata, a fresh clone, and
        # makes a table run again where a cell missing from it can run now: `gpus_here`, this machine's
        # GPUs, where Snakemake plans cells; None where it only reads the plan).
        runs_here = None if gpus_here is None else self.runs_here(gpus_here)
        self.stale: dict[str, set[str]] = (
            {name: set() for name in config.studies} if remote
            else {name: prepare(study, runs_here=runs_here) for name, study in config.studies.items()})
        # What every cell asks for alike, given to Snakemake as values: a resource given as a function
        # costs a call through Snakemake's input-function machinery for every job it plans (thirteen per
        # cell job: 2 s of a dry run of 10,000 cells).
        self.shared_resources = {} if remote else shared_resources(
            study.job_resources(c) for study in config.studies.values() for c in study.cells)
        if not remote:  # a user's own studies' results stay out of `git status`, as their files do
            ignore_local_results(config)
        self._said_short: set[str] = set()
        self._prediction_models: str | None = None
        self.remote = remote

    def study(self, name: str) -> Study:
        return self.config.study(name)

    def cell(self, study: str, cell: str) -> Cell:
        return self.study(study).cell(cell)

    def target_study(self, name: str) -> Study:
        """The study a target names, or an exit saying that it names none (an input function's)."""
        try:
            return self.study(name)
        except ConfigError as error:
            sys.exit(f"error: target names {error}")

    def target_cell(self, study: str, cell: str) -> Cell:
        """The cell a target names, or an exit saying that it names none (an input function's)."""
        try:
            return self.cell(study, cell)
        except ConfigError as error:
            sys.exit(f"error: target names {error}")

    def cell_resource_names(self) -> dict[str, str]:
        """The resources of a cell's job (CELL_RESOURCES), the SLURM placement ones only where a cell
        of config.yaml names one."""
        cells = [c for study in self.config.studies.values() for c in study.cells]
        named = {name for name in SLURM_PLACEMENT if self.shared_resources.get(name, "") is not None
                 and any(c.resources()[name] is not None for c in cells)}
        return {resource: name for resource, name in CELL_RESOURCES.items()
                if name not in SLURM_PLACEMENT or name in named}

    def train_rules(self) -> list[tuple[str, str]]:
        """The training rules, each with the studies it trains (a pattern of the {study} wildcard):
        `train_cell` for every study but those submitted as SLURM job arrays, and `train_<study>` for
        each of those. Snakemake's SLURM plugin makes an array of one rule's ready jobs and gives it the
        first job's request, so a rule of its own per array study keeps an array to cells that ask for
        the same (grid.array_problems)."""
        arrays = array_studies(self.config)
        if not arrays:
            return [("train_cell", STUDY_NAME)]
        # not one of them: no array study's name followed by anything but more of a name
        others = f"(?!(?:{'|'.join(re.escape(name) for name in arrays)})(?![A-Za-z0-9_-])){STUDY_NAME}"
        return [("train_cell", others), *((array_rule(name), re.escape(name)) for name in arrays)]

    def cell_resource(self, name: str) -> Any | Callable[[str, str], Any]:
        """One of a cell's resources: its value where every cell shares it, else a function of the job's
        study and cell giving that cell's."""
        if name in self.shared_resources:
            return self.shared_resources[name]
        return lambda study, cell: self.study(study).job_resources(self.cell(study, cell))[name]

    def any_stale(self) -> bool:
        return any(self.stale.values())

    def grid_input_triggers(self, cell: Cell) -> bool:
        """Whether the cell's grid stamp is a rerun trigger of its job (its result was made with other
        parameters); otherwise the workflow marks the stamp ancient."""
        return cell.cell_id in self.stale[cell.study]

    def runs_here(self, gpus_here: int) -> Callable[[Cell], bool]:
        """Whether a cell can run from here: any where config.yaml places cells on a cluster; on this
        machine, one that asks for no more GPUs than it has (an unsupported cell runs anywhere: it
        records why)."""
        if self.config.placement != "local":
            return lambda cell: True
        return lambda cell: cell.unsupported or short_of_gpus(cell.params, gpus_here) is None

    def runs_cells_here(self, executor_plugin: Any) -> bool:
        """Whether cells run on this machine: config.yaml's placement is local and Snakemake's executor
        (its plugin, None for the local one) runs jobs here; a cluster profile says so for its dry
        runs too (placement: cluster)."""
        return self.config.placement == "local" and (
            executor_plugin is None or executor_plugin.common_settings.local_exec)

    def probe(self, study: str, cell: str, micro_batch: int) -> Cell:
        """A max-batch probe: the cell with the probe's micro batch."""
        return probe_cell(self.study(study), self.cell(study, cell), micro_batch)

    @staticmethod
    def search_probes(study: Study, cell: Cell, probe_output: Callable[[int], str]) -> list[str]:
        """The max-batch search's probes so far, walked from the memory model's bounds.
        `probe_output(batch)` gives the probe's metrics.json; asking the workflow for one not yet run
        stops the walk there (Snakemake runs it, then asks again, one probe further)."""
        found: dict[int, str] = {}

        def status_of(batch: int) -> str:
            found[batch] = probe_output(batch)
            if set_aside_invalid(found[batch]):
                probe_output(batch)  # now missing: the workflow runs the probe again
            return read_json(found[batch])["status"]

        walk(status_of, *bounds_for(study.search, cell.params), study.search["tolerance"],
             known=Workflow.probes_on_disk(study, cell))
        return list(found.values())

    @staticmethod
    def probes_on_disk(study: Study, cell: Cell, root: Path = Path(".")) -> list[int]:
        """The micro batches of a cell's search whose probes are on disk and current (run with the
        parameters the config gives them now): the walk reads them before asking for more."""
        current = []
        for found in root.glob(paths.probe_glob(study.name, cell.cell_id)):
            batch = int(found.parent.name.removeprefix("mb~"))
            if result_state(probe_cell(study, cell, batch), found).kind == CURRENT:
                current.append(batch)
        return sorted(current)

    def cells_short_of_gpus(self, study: Study, gpus_here: int) -> dict[str, str]:
        """The study's measured cells that must run (no current result) but cannot on this machine, and
        why ("needs 4 GPUs"): left out of its table's inputs and shown as rows that say so. Named once per
        study on stderr when the workflow plans."""
        short = {}
        for cell in study.cells:
            why = short_of_gpus(cell.params, gpus_here) if cell.measured and not cell.unsupported else None
            if why and (not os.path.exists(cell.target) or cell.cell_id in self.stale[study.name]):
                short[cell.cell_id] = f"{why}, more than the machine that made this table has"
        if short and study.name not in self._said_short:
            self._said_short.add(study.name)
            print(f"trainbench: {study.name}: {len(short)} cell(s) need more GPUs than this machine has "
                  f"({gpus_here}) and will not run here: {', '.join(sorted(short)[:4])}"
                  f"{' ...' if len(short) > 4 else ''}. Their rows in "
                  f"{paths.path(paths.TABLE_MD, study=study.name)} say so; run them on a bigger machine, or "
                  f"with --profile profiles/slurm.", file=sys.stderr)
        return short

    @staticmethod
    def study_metrics(study: Study, short: Iterable[str]) -> list[str]:
        """What the study's table and plots read: its measured cells' results, but for those this machine
        cannot run."""
        short = set(short)
        return [cell.target for cell in study.cells if cell.measured and cell.cell_id not in short]

    @staticmethod
    def study_searches(study: Study) -> list[str]:
        """The max-batch searches the study's table reports; a summary that is not one is set aside, and
        made again from its probes."""
        for path in study.search_targets:
            set_aside_invalid(path)
        return study.search_targets

    @staticmethod
    def grid_stamp(study: Study) -> str:
        return stamp_path(study.name)

    @staticmethod
    def table_layout(study: Study) -> dict[str, Any]:
        """What the table shows (a change reruns the table alone)."""
        return {"description": study.description, "id_keys": study.id_keys, "report": study.report,
                "findings": study.findings, "references": study.references}

    @staticmethod
    def plot_layout(study: Study) -> dict[str, Any]:
        """What the plots show (a change reruns the plots alone)."""
        return {"id_keys": study.id_keys, "plot_panels": list(study.plot_panels)}

    @staticmethod
    def missing_cells(study: Study) -> list[str]:
        """The measured cells without a result, as a rerun trigger of the table and plots: Snakemake
        regenerates no missing input of a job it finds up to date, and a result deleted, or set aside
        as invalid, must still run again and reach the table."""
        return sorted(c.cell_id for c in study.cells if c.measured and not os.path.exists(c.target))

    @staticmethod
    def planning(study: Study) -> dict[str, Any]:
        """What the table's planned rows depend on (Study.planned), as a rerun trigger: their cells'
        parameter hashes, sorted, and the planning hardware. Reordering config.yaml changes neither."""
        return {"plan_for": study.plan_for,
                "planned": sorted(f"{c.cell_id}={c.params_hash}" for c in study.planned)}

    def prediction_models(self) -> str:
        """A digest of what the memory and time models' predictions depend on (PREDICTION_*), as a
        rerun trigger of every rule whose output shows predictions: tables, plots and the dataset show
        the current models' figures (reporting/predictions.py), and Snakemake tracks no code a rule's
        script imports, so without it a refit of the time model's constants left them stale. Read
        from the trainbench this workflow imports, the one the rules' scripts run; computed once."""
        if self._prediction_models is None:
            self._prediction_models = prediction_models_digest()
        return self._prediction_models

    def models_stamp(self) -> str:
        """The file that holds prediction_models (freshness.refresh_models_stamp), written where it
        changed; not by a SLURM job's own Snakemake, which runs a cell and shows no prediction."""
        if self.remote:
            return paths.MODELS_STAMP
        return refresh_models_stamp(self.prediction_models())

    def pages_of_tabled_studies(self) -> list[str]:
        """The report's copy of the page of every study that has a table on disk (rule report_all): the
        copy, not the page kept beside the table, which a clone has already, so that a clone makes it
        (Snakemake reruns a rule for a missing output only where that output is asked for)."""
        return [paths.path(paths.REPORT_PAGE, study=name) for name in self.config.studies
                if os.path.exists(paths.path(paths.TABLE_MD, study=name))]

    def final_output(self, have_gpus: bool, reporting: bool = False) -> list[str]:
        """The default target: every output of the studies config.yaml names for this kind of machine.
        For `snakemake --report` where those studies were never run here (a fresh clone: no smoke
        table), what is on disk instead: every tabled study's tables, plots and page, those that exist
        (the published studies), so that the report needs nothing run first."""
        names = self.config.default_targets_studies(have_gpus=have_gpus)
        outputs = [output for name in names
                   for output in paths.study_outputs(name)]
        # (a workspace of no default study, as the validation one, has nothing of its own to report)
        if reporting and not (outputs and all(os.path.exists(o) for o in outputs)):
            return self.tabled_outputs()
        return outputs

    def results_on_disk(self) -> list[str]:
        """Every result of config.yaml's cells that exists (what the dataset holds)."""
        return [cell.target for study in self.config.studies.values() for cell in study.cells
                if os.path.exists(cell.target)]

    def tabled_outputs(self) -> list[str]:
        """The tables, plots and pages on disk of every study that has a table, and the dataset (what a
        report of published results shows)."""
        tabled = [name for name in self.config.studies
                  if os.path.exists(paths.path(paths.TABLE_MD, study=name))]
        return [output for name in tabled
                for output in paths.study_outputs(name)
                if os.path.exists(output)] + ([paths.DATASET] if os.path.exists(paths.DATASET) else [])
