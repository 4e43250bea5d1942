"""Shared fixtures: a copy of the workflow in a temporary directory, and Snakemake runs against it.

End-to-end tests never touch the repository's own results/: each gets the Snakefile, rules,
schema, profiles and envs copied next to a config.yaml of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# the campaigns too: a test that writes the repository's config.yaml gets the study files it names (the
# project's: project_files leaves out a user's own, studies/local/, which may name files it does not copy)
WORKFLOW_FILES = ("Snakefile", "workflow", "profiles", "envs", "studies")

# Everything the tests start (and DeepSpeed's op builds in this process) uses the environment's own
# tools, as for a user who activated it: a machine's other ninja would rebuild DeepSpeed's CPU ops.
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

# The suite runs in parallel workers (make test: pytest-xdist, a test file to a worker). A cell that asks
# for GPUs takes them, and its host lock, from the machine's slot pool (execute/gpus.py): each worker
# gets a pool of its own, so that one worker's cells never wait on, or time beside, another's.
if "TRAINBENCH_GPU_POOL_DIR" not in os.environ:
    import atexit
    import tempfile

    os.environ["TRAINBENCH_GPU_POOL_DIR"] = tempfile.mkdtemp(
        prefix=f"trainbench-pool-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    atexit.register(shutil.rmtree, os.environ["TRAINBENCH_GPU_POOL_DIR"], ignore_errors=True)


# The files that take longest (real training, SLURM jobs, Snakemake runs: a minute or more each in a CI
# run), heaviest first. xdist hands the two workers whole files in collection order; by default it first
# reorders them by their number of tests, which put the heaviest files of two or three tests
# (test_readme.py, test_bench.py) last: one worker ran them for minutes while the other had nothing
# left. Heaviest first, the short files fill in at the end. Only an order: a file not listed runs after
# these, and a stale list costs minutes, never a result. From a full run's --durations=0, by file.
# The two halves of the architectures sweep go first, one to each worker, so that they run at once.
SLOWEST_FILES = ("test_architectures.py", "test_architectures_sweep.py", "test_slurm.py", "test_workflow.py",
                 "test_readme.py", "test_emulation.py", "test_plots.py", "test_user_models.py",
                 "test_bench.py", "test_model_checks.py", "test_cellrun.py", "test_report.py",
                 "test_float8.py", "test_lifetime.py", "test_checkpoint_in_cpu.py", "test_rank_failures.py",
                 "test_pipeline_parallel.py", "test_profiling.py", "test_gpus.py", "test_batch_search.py",
                 "test_frameworks.py", "test_tools.py", "test_tensor_parallel.py", "test_lightning.py",
                 "test_commbench.py", "test_hf_trainer.py", "test_sharded_tensor_parallel.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist's --no-loadscope-reorder: keep the order below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's tests in order


# Tests time the fewest windows there can be: six of the fewest steps, whatever their interval. The time
# cap ends timing at the sixth window: without it a busy machine (two test workers on two cores) widens
# the interval past ±100% and a cell times a seventh, and runs meant to take the same steps did not.
# (0.001 s, under any six steps: written without an exponent, since YAML 1.1 reads 1e-09 as a string.)
FAST_TIMING = {"target_ci": 1.0, "min_window_s": 0, "max_timed_s": 0.001}


# A cell small enough to run on CPU ranks in seconds (tests that run cells through cellrun directly).
TINY = {"model": "gpt2-tiny", "device": "cpu", "seq_len": 16, "micro_batch": 2, "warmup_steps": 1,
        "timed_steps": 2}


def make_cell(**params):
    """A checked Cell of TINY updated with `params`, timed as briefly as a cell can be."""
    from trainbench.study.grid import Cell, check_cell
    from trainbench.study.params import CellParams
    resolve = CellParams.resolve
    from trainbench.study.timing import TimingSettings

    p = resolve({**TINY, **params})
    errors, unsupported = check_cell(p)
    assert not errors, errors
    return Cell("t", "c", p, execution={"cpus_per_rank": 1}, timing=TimingSettings(**FAST_TIMING),
                unsupported=unsupported)


def tiny_study(**settings) -> dict:
    """A study of CPU cells small enough to run in seconds."""
    base = {"model": "gpt2-tiny", "device": "cpu", "seq_len": 16, "warmup_steps": 1, "timed_steps": 2}
    base.update(settings)
    return {"description": "test study", "settings": base, "timing": dict(FAST_TIMING),
            "execution": {"runtime_min": 5, "cpus_per_rank": 1, "mem_mb_per_rank": 1000, "retries": 0}}


def timed_three_steps(doc: dict) -> dict:
    """`doc`, a result, as if timed as the campaigns did (edited in place, and returned): its first 3
    steps, each alone, their median its step time, so no interval, and no timing of its host's Python."""
    import statistics

    from trainbench.contract.result import INTERVAL_KEYS

    metrics = doc["metrics"]
    metrics["step_times_s"] = metrics["step_times_s"][:3]
    metrics["step_time_s"] = round(statistics.median(metrics["step_times_s"]), 6)
    for key in ("timing", *INTERVAL_KEYS):
        metrics.pop(key, None)
    doc["provenance"].pop("host_pace_ms", None)
    return doc


def tracked_files(repo: Path = REPO) -> list[str]:
    """The repository's files as a clone of it has them: git's tracked files (results included)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, text=True, check=True)
    return [name for name in listed.stdout.split("\0") if name and (repo / name).exists()]


def published_results(workspace: Path = REPO) -> list[Path]:
    """The metrics.json of every cell published in a workspace (the repository's, or validation/): those
    git tracks. A study run here that is not published (smoke, a user's own in studies/local/) leaves its
    results in the same folders, git-ignored, and is not held to what the published ones are."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "results/runs/*/*/metrics.json"], cwd=workspace,
                            capture_output=True, text=True, check=True)
    return sorted(workspace / name for name in listed.stdout.split("\0") if name)


def project_files(folder: str, repo: Path = REPO) -> list[str]:
    """The files under `folder` that are the project's: tracked, or new and not ignored (a study file
    about to be added). What git ignores is a user's own (studies/local/, with the model files its
    studies name elsewhere) or a build's: a test's workspace must not depend on it."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                             folder], cwd=repo, capture_output=True, text=True, check=True)
    return sorted({name for name in listed.stdout.split("\0") if name and (repo / name).is_file()})


def _project_view() -> Path:
    """The repository as the suite reads it: each of its top-level entries linked, but config.yaml and
    studies/ copied, the study files the project's alone (project_files). A user's own studies and
    models in studies/local/, which config.yaml's study_files take in, change no test: the tests load
    PROJECT_CONFIG, not the repository's config.yaml. One per test process, removed when it ends."""
    import atexit
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="trainbench-project-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for entry in REPO.iterdir():
        if entry.name not in ("config.yaml", "studies", ".git"):
            (root / entry.name).symlink_to(entry)
    for name in ["config.yaml", *project_files("studies")]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    return root


PROJECT = _project_view()
PROJECT_CONFIG = PROJECT / "config.yaml"


def loaded_in(workspace: Path) -> Path:
    """Where a workspace's config is loaded from: the repository's without a user's own study files."""
    return PROJECT if workspace == REPO else workspace


def shell_environment() -> dict[str, str]:
    """The environment of a user who activated the project's venv (its bin first on PATH)."""
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")])}


class Workflow:
    def __init__(self, root: Path, *, clone: bool = False, repo: Path = REPO):
        """A copy of the workflow files in `root` (the project's, as project_files finds them); with
        clone=True every tracked file, as a fresh `git clone` has them (results and all), with no
        .snakemake metadata."""
        self.root = root
        files = (tracked_files(repo) if clone else
                 [name for top in WORKFLOW_FILES for name in project_files(top, repo)])
        for name in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, root / name)

    @classmethod
    def at(cls, root: Path) -> "Workflow":
        """A workflow directory that exists already (a copy of another test's)."""
        flow = cls.__new__(cls)
        flow.root = root
        return flow

    def write_config(self, config: dict | str) -> None:
        text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
        (self.root / "config.yaml").write_text(text)

    def snakemake(self, *args: str, check: bool = True, env: dict | None = None,
                  timeout: float = 900) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
        result = subprocess.run(command, cwd=self.root, capture_output=True, text=True, timeout=timeout,
                                env={**os.environ, **(env or {})})
        if check and result.returncode != 0:
            raise AssertionError(f"snakemake {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout[-4000:]}\n{result.stderr[-6000:]}")
        return result

    def shell(self, command: str, *, check: bool = True, timeout: float = 900,
              env: dict | None = None) -> subprocess.CompletedProcess:
        """A command line as a user types it (venv activated), in the workflow's directory."""
        result = subprocess.run(command, shell=True, cwd=self.root, capture_output=True, text=True,
                                timeout=timeout, env={**shell_environment(), **(env or {})})
        if check and result.returncode != 0:
            raise AssertionError(f"`{command}` failed ({result.returncode}):\n"
                                 f"{result.stdout[-4000:]}\n{result.stderr[-6000:]}")
        return result

    def planned(self, *targets: str) -> dict[str, set[str]]:
        """Jobs a dry run would execute, as {rule: {output paths}}."""
        result = self.snakemake("-n", *targets)
        return parse_dry_run(result.stdout + result.stderr)

    def ran(self, *args: str, env: dict | None = None) -> dict[str, set[str]]:
        """A real run's jobs, as {rule: {output paths}}: what it executed, read from its log as planned()
        reads a dry run's (a real run prints each job as a dry run lists it)."""
        result = self.snakemake(*args, env=env)
        return parse_dry_run(result.stdout + result.stderr)

    def path(self, relative: str) -> Path:
        return self.root / relative


def parse_dry_run(text: str) -> dict[str, set[str]]:
    jobs: dict[str, set[str]] = {}
    rule = None
    for line in text.splitlines():
        match = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line.strip())
        if match:
            rule = match.group(1)
            jobs.setdefault(rule, set())
            continue
        if rule and line.strip().startswith("output:"):
            jobs[rule].update(p.strip() for p in line.split(":", 1)[1].split(","))
        if rule and line.strip().startswith("input:") and rule == "all":
            jobs[rule].add("(all)")
    return jobs


# what a machine without GPUs looks like to the pipeline, whatever this one has
CPU_MACHINE = {"TRAINBENCH_FAKE_GPUS": "0", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture
def workflow(tmp_path) -> Workflow:
    return Workflow(tmp_path)


def session_folder(tmp_path_factory) -> Path:
    """The folder the whole session shares: above each xdist worker's own, or this process's without
    workers."""
    shared = tmp_path_factory.getbasetemp()
    return shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared


def made_once(tmp_path_factory, name: str, make: Callable[[Path], str]) -> str:
    """What `make(folder)` returned, made once for the whole session in `folder` (the session's folder
    `name`) by the first test worker to ask; a worker asking while another makes it waits for it. Lets
    two test files each make one part of a costly whole, one on each worker, and either read both."""
    from filelock import FileLock

    shared = session_folder(tmp_path_factory)
    done = shared / f"{name}.made"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            (shared / name).mkdir(exist_ok=True)
            done.write_text(make(shared / name))
    return done.read_text()


@pytest.fixture(scope="session")
def smoke_run_locally(tmp_path_factory) -> tuple[Workflow, float]:
    """A fresh clone where the README's quick start ran on a CPU machine, `snakemake -c all` as
    written (the local, SLURM, report and README tests build on it). Returns the clone and the run's
    time. It runs once for the whole session (made_once), and each worker works on a copy of its own
    (mtimes and Snakemake's records kept), so that what one test does to it reaches no other."""
    import time

    def quick_start(folder: Path) -> str:
        flow = Workflow(folder, clone=True)
        started = time.monotonic()
        flow.shell("snakemake -c all", env=CPU_MACHINE)
        return str(time.monotonic() - started)

    seconds = float(made_once(tmp_path_factory, "smoke-local", quick_start))
    mine = tmp_path_factory.mktemp("smoke-local")
    shutil.copytree(session_folder(tmp_path_factory) / "smoke-local", mine, symlinks=True, dirs_exist_ok=True)
    return Workflow.at(mine), seconds


@pytest.fixture
def repo() -> Path:
    return REPO
