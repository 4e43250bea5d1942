"""How the pipeline scales with its grid: planning against a bare Snakefile, the scheduler with many
ready jobs, and what each executed cell costs beyond its training.

    python bench/plan_scaling.py [--sizes 1000 10000 40000] [--repeats 3] [--out DIR]

**Planning.** For each size N, in a scratch directory: a copy of the workflow (Snakefile, workflow/,
profiles/, envs/, as the tests copy it) whose config.yaml holds one study of N CPU cells (smoke's
settings, torch DDP on 2 ranks, and two axes, micro_batch x seed, whose product is N); a bare
Snakefile of N jobs of one wildcard rule (`touch {output}`) under a rule that asks for them all, with
the same cell ids; the bare Snakefile again with its rule shaped like train_cell (the same input,
log, params, threads, thirteen resources given as functions, conda and shell command, each function
returning a constant), which tells what Snakemake itself spends on a job of that shape; the same
shape with each of those given as a value instead of a function ("fixed": the least Snakemake spends
on a job of train_cell's directives, whatever computes them); and the workflow again with the study
beside this repository's config.yaml studies ("beside": cells that do not all ask for the same
resources, so the workflow hands Snakemake functions for them; see common.smk).
Times `snakemake <target> -n` (the plan command of docs/running.md) and the same with `-q`, each a fresh
process, on one machine, interleaved: every repeat runs every size and every tree in turn, in an
order that alternates from repeat to repeat. Each repeat gives the ratio workflow/bare of the runs it
made side by side; a size's figure is the median ratio with the lowest and highest. Growth is linear
when the time per added cell stays the same from size to size (ms per added cell). CPU time (user +
system) is recorded beside the wall time: on a shared machine it is the steadier of the two.

**Scheduler** (--ready R): the bare Snakefile of R `touch` jobs really run on 2 cores with each of
Snakemake's schedulers for --window seconds: the jobs each finished.

**Execution** (--cells M): what a cell costs that is neither its launcher nor its training:
- Snakemake alone: the bare Snakefile really run, `touch` jobs, one at a time (-c 1), per job;
- the pipeline: a study of `unsupported` cells really run (`trainbench run-cell` writes their result
  and launches nothing), one at a time, per cell: Snakemake's job set-up plus run-cell's process;
  both per-job figures are slopes between M/5 and M jobs, so the workflow's start and planning cancel;
- `trainbench run-cell` alone on such a cell, and `python -c pass` (the interpreter's start);
- run-cell around a launched cell (the smallest CPU cell, 1 rank and 2 ranks, and where there is a
  GPU the same cell on one GPU): the process's wall time less its launcher's lifetime (from its
  start to its exit, which a pidfd reports at once);
- the launcher's start-up apart: `python` and `torchrun --nproc-per-node 2` running a script that
  only imports torch and trainbench.execute.worker, as every rank does before it trains.

**A measured grid** (the common case: re-planning a study whose cells have results). The same study
with a result in every cell (one real result, an unsupported cell's that `trainbench run-cell` wrote,
copied into each cell with its id and parameters), against the bare Snakefile with every output
present: `snakemake <target> -n` the first time the workflow reads those results (a fresh clone; cold)
and again (warm: it knows what each unchanged file is), and what a SLURM job's own Snakemake does
before its cell (`--mode remote --target-jobs <one cell>`, as the SLURM executor runs it, with -n:
parsing the workflow and planning that one job).

**Before and after** (--before REF): the workflow of commit REF (its Snakefile, workflow/ and package,
taken with `git archive`, or from a folder REF that holds them, its package first on PYTHONPATH)
planned, and its cells run, beside today's in the same repeats, so a change's effect is a ratio
taken side by side.

Snakemake's fixed start (a one-job Snakefile's dry run) is timed first: it is in every figure, and on
a machine with SLURM's commands installed but no controller to answer them, the SLURM executor
plugin's probes at import make it seconds (9 s measured), which would flatten every ratio here.

Writes DIR/plan_scaling.json (every time measured) and DIR/plan_scaling.txt (the summary printed,
headed by the command, the machine and the versions).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "workflow", "profiles", "envs")  # what tests/conftest.py copies
STUDY = "scale"
TARGET = f"results/tables/{STUDY}.md"
KINDS = ("workflow", "bare", "shaped", "fixed", "beside")
BARE_KINDS = ("bare", "shaped", "fixed")  # Snakefiles of one rule, whose target is `all`
BEFORE = "before"  # the workflow at --before REF

# smoke's settings (config.yaml), one of its strategies: cheap to plan, never run here (a dry run)
SMOKE_SETTINGS = {"model": "gpt2-tiny", "device": "cpu", "gpus": 2, "seq_len": 64, "lr": 1.0e-3,
                  "warmup_steps": 3, "timed_steps": 10, "strategy": "ddp"}
SMOKE_EXECUTION = {"runtime_min": 10, "cpus_per_rank": 1, "mem_mb_per_rank": 2000}

BARE_SNAKEFILE = '''\
# N jobs of one wildcard rule, with the ids and targets of the workflow's cells
configfile: "config.yaml"

CELLS = [f"micro_batch~{{mb}}__seed~{{seed}}" for mb in range(1, config["micro_batch"] + 1)
         for seed in range(config["seed"])]


rule all:
    input:
        expand("results/runs/{study}/{{cell}}/metrics.json", cell=CELLS),


rule cell:
    output:
        "results/runs/{study}/{{cell}}/metrics.json",
    shell:
        "touch {{output}}"
'''.format(study=STUDY)

# The bare rule shaped like train_cell (workflow/rules/train.smk): its directives, with functions that
# return what a cell's would (or, with VALUES, those values themselves), and its shell command's text.
SHAPED_RULE = '''
PARAMS = {params!r}
RESOURCES = {resources!r}
VALUES = {values!r}


def value(constant):
    return constant if VALUES else lambda wildcards: constant


def resource(name):
    return value(RESOURCES[name])


rule cell:
    input:
        grid=value("grid.json"),
    output:
        metrics="results/runs/{{study}}/{{cell}}/metrics.json",
    log:
        "results/runs/{{study}}/{{cell}}/log",
    params:
        cell=value(PARAMS),
    threads: resource("threads")
    resources:
        **{{key: resource(name) for key, name in (("gpu", "gpu"), ("gres", "gres"), ("nodes", "nodes"),
           ("tasks", "tasks"), ("tasks_per_gpu", "tasks_per_gpu"), ("mpi", "mpi"),
           ("cpus_per_task", "cpus_per_task"), ("cpus_per_rank", "cpus_per_rank"), ("mem_mb", "mem_mb"),
           ("runtime", "runtime"), ("cell_retries", "retries"), ("timing", "timing"))}},
    conda:
        "env.yaml"
    shell:
        "trainbench run-cell --study {{wildcards.study}} --cell {{wildcards.cell}} --params {{params.cell:q}}"
        " --retries {{resources.cell_retries}} --cpus-per-rank {{resources.cpus_per_rank}}"
        " --runtime-min {{resources.runtime}} --timing {{resources.timing}}"
        " --output {{output.metrics}} > {{log}} 2>&1"
'''


def axes_for(cells: int) -> tuple[int, int]:
    """Two axis lengths whose product is `cells`, as near a square as the number allows."""
    side = math.isqrt(cells)
    while cells % side:
        side -= 1
    return cells // side, side


def study_spec(cells: int, settings: dict, description: str) -> dict:
    micro_batches, seeds = axes_for(cells)
    return {"description": description, "settings": settings, "execution": SMOKE_EXECUTION,
            "axes": {"micro_batch": list(range(1, micro_batches + 1)), "seed": list(range(seeds))}}


def make_workflow(root: Path, spec: dict, source_root: Path = REPO, beside: bool = False) -> Path:
    """A copy of the workflow whose config.yaml holds the study of `spec`, alone or (`beside`) added
    to this repository's config.yaml studies."""
    root.mkdir(parents=True)
    for name in WORKFLOW_FILES:
        source = source_root / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, root / name)
    config = {"studies": {STUDY: spec}}
    if beside:
        config = yaml.safe_load((REPO / "config.yaml").read_text())
        config["studies"][STUDY] = spec
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def make_bare(root: Path, cells: int, shaped: bool = False, values: bool = False) -> Path:
    root.mkdir(parents=True)
    micro_batches, seeds = axes_for(cells)
    text = BARE_SNAKEFILE
    if shaped:
        from trainbench.study.config import load_config

        cell = load_config({"studies": {STUDY: study_spec(1, SMOKE_SETTINGS, "one")}}).study(STUDY).cells[0]
        rule_cell = text.index("\nrule cell:")
        text = text[:rule_cell] + SHAPED_RULE.format(params=cell.canonical, resources=cell.resources(),
                                                     values=values, study=STUDY)
        (root / "grid.json").write_text("{}\n")
        shutil.copy(REPO / "envs" / "train.yaml", root / "env.yaml")
    (root / "Snakefile").write_text(text)
    (root / "config.yaml").write_text(yaml.safe_dump({"micro_batch": micro_batches, "seed": seeds}))
    return root


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def checkout(ref: str, work: Path) -> Path:
    """The workflow and package of commit `ref`, as files (git archive), for the `before` kind; or, where
    `ref` is a folder, the files git archive made there before (for a copy of the tree without .git,
    as a GPU host gets: `git archive REF workflow Snakefile src | tar -x -C FOLDER`)."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    root = work / f"checkout-{ref}"
    root.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref, *WORKFLOW_FILES, "src"], cwd=REPO, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def kind_environment(kind: str, before: Path | None) -> dict[str, str] | None:
    """The `before` kind imports its own commit's package first."""
    if kind != BEFORE:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(before / "src"),
                                                                      os.environ.get("PYTHONPATH")]))}


def snakemake(root: Path, *args: str, log: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall and CPU time of one Snakemake process in `root` (its output to `log`); stops if it fails."""
    command = [sys.executable, "-m", "snakemake", *args]
    cpu = children_cpu_s()
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=root, stdout=out, stderr=subprocess.STDOUT, env=env)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"`{shlex.join(command)}` in {root} failed ({done.returncode}); see {log}")
    return took, children_cpu_s() - cpu


def planned_jobs(log: Path) -> int:
    """The total of a dry run's job stats table."""
    for line in log.read_text().splitlines():
        if line.startswith("total"):
            return int(line.split()[1])
    raise SystemExit(f"{log}: no job stats in the dry run's output")


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "low": min(values), "high": max(values), "values": values}


def bench_planning(work: Path, sizes: list[int], repeats: int, before: Path | None = None) -> dict:
    modes = {"plan": ("-n",), "plan quiet": ("-n", "-q")}
    kinds = KINDS + ((BEFORE,) if before else ())
    trees = {}
    for n in sizes:
        spec = study_spec(n, SMOKE_SETTINGS, "planning benchmark")
        trees[n] = {"workflow": make_workflow(work / f"workflow-{n}", spec),
                    "bare": make_bare(work / f"bare-{n}", n),
                    "shaped": make_bare(work / f"shaped-{n}", n, True),
                    "fixed": make_bare(work / f"fixed-{n}", n, True, values=True),
                    "beside": make_workflow(work / f"beside-{n}", spec, beside=True)}
        if before:
            trees[n][BEFORE] = make_workflow(work / f"before-{n}", spec, before)
    runs = {n: {mode: {kind: {"wall": [], "cpu": []} for kind in kinds} for mode in modes} for n in sizes}
    for repeat in range(repeats):
        order = kinds if repeat % 2 == 0 else tuple(reversed(kinds))
        for n in sizes:
            for mode, flags in modes.items():
                for kind in order:
                    root = trees[n][kind]
                    log = root / f"{mode.replace(' ', '-')}.log"
                    wall, cpu = snakemake(root, "all" if kind in BARE_KINDS else TARGET, *flags, log=log,
                                          env=kind_environment(kind, before))
                    runs[n][mode][kind]["wall"].append(wall)
                    runs[n][mode][kind]["cpu"].append(cpu)
                    if mode == "plan":
                        jobs = planned_jobs(log)
                        if jobs != n + 1:  # the cells and the table, or rule all
                            raise SystemExit(f"{log}: {jobs} jobs planned, expected {n + 1}")
                    print(f"  repeat {repeat + 1}, {n} cells, {mode}, {kind}: {wall:.2f} s (cpu {cpu:.2f} s)",
                          flush=True)
    report = {}
    for n in sizes:
        report[n] = {}
        for mode in modes:
            r = runs[n][mode]
            report[n][mode] = {f"{kind}_{clock}_s": spread(r[kind][clock]) for kind in kinds
                               for clock in ("wall", "cpu")}
            for clock in ("wall", "cpu"):
                report[n][mode][f"ratio_{clock}"] = spread(
                    [w / b for w, b in zip(r["workflow"][clock], r["bare"][clock])])
                for kind in kinds:
                    if kind not in ("workflow", "bare"):
                        report[n][mode][f"{kind}_ratio_{clock}"] = spread(
                            [k / b for k, b in zip(r[kind][clock], r["bare"][clock])])
    return report


def snakemake_start(work: Path, repeats: int) -> dict:
    """A one-job Snakefile's dry run: what every Snakemake process costs before any job."""
    root = make_bare(work / "start", 1)
    return spread([snakemake(root, "all", "-n", log=root / "start.log")[0] for _ in range(repeats)])


# --- a measured grid -------------------------------------------------------------------------------

def unsupported_result(work: Path) -> dict:
    """One real result: what `trainbench run-cell` writes for an unsupported cell (it launches nothing)."""
    from trainbench.study.config import load_config

    [cell] = load_config({"studies": {STUDY: study_spec(1, UNSUPPORTED_SETTINGS, "one")}}).study(STUDY).cells
    output = work / "unsupported" / "metrics.json"
    wall([sys.executable, "-m", "trainbench", "run-cell", *run_cell_argv(cell, output)], cwd=work)
    return json.loads(output.read_text())


def fill_results(root: Path, cells, result: dict) -> None:
    """A result in every cell: `result` with each cell's study, id, parameters and their hash."""
    for cell in cells:
        target = root / cell.target
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({**result, "study": cell.study, "cell_id": cell.cell_id,
                                      "params": cell.params.as_dict(), "params_hash": cell.params_hash}))


def fill_outputs(root: Path) -> None:
    """Every output of a bare Snakefile's jobs, empty, as `touch` makes them."""
    micro_batches, seeds = (yaml.safe_load((root / "config.yaml").read_text())[k]
                            for k in ("micro_batch", "seed"))
    for mb in range(1, micro_batches + 1):
        for seed in range(seeds):
            target = root / "results" / "runs" / STUDY / f"micro_batch~{mb}__seed~{seed}" / "metrics.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()


def bench_measured(work: Path, sizes: list[int], repeats: int, before: Path | None = None) -> dict:
    """Re-planning a study whose every cell has a result, and a remote job's start in it."""
    from trainbench.study.config import load_config

    work.mkdir(parents=True, exist_ok=True)
    result = unsupported_result(work)
    kinds = ("workflow", "bare") + ((BEFORE,) if before else ())
    trees = {}
    for n in sizes:
        spec = study_spec(n, SMOKE_SETTINGS, "planning benchmark")
        cells = load_config({"studies": {STUDY: spec}}).study(STUDY).cells
        trees[n] = {"workflow": make_workflow(work / f"workflow-{n}", spec),
                    "bare": make_bare(work / f"bare-{n}", n)}
        if before:
            trees[n][BEFORE] = make_workflow(work / f"before-{n}", spec, before)
        for kind, root in trees[n].items():
            fill_outputs(root) if kind == "bare" else fill_results(root, cells, result)
        trees[n]["remote cell"] = cells[len(cells) // 2].cell_id
    # per size and kind: the plan when the results are new to the workflow (cold), the plan again (warm),
    # and a remote job's start
    figures = {n: {f"{kind} {what}": [] for kind in kinds for what in ("cold", "warm", "remote")}
               for n in sizes}
    for repeat in range(repeats):
        order = kinds if repeat % 2 == 0 else tuple(reversed(kinds))
        for n in sizes:
            for kind in order:
                root, env = trees[n][kind], kind_environment(kind, before)
                target = "all" if kind == "bare" else TARGET
                shutil.rmtree(root / ".snakemake", ignore_errors=True)  # what a fresh clone has
                for what in ("cold", "warm"):
                    log = root / f"{what}.log"
                    figures[n][f"{kind} {what}"].append(snakemake(root, target, "-n", log=log, env=env)[0])
                    # the table alone; the bare Snakefile has nothing to do
                    planned = 0 if kind == "bare" else 1
                    if planned and planned_jobs(log) != planned:
                        raise SystemExit(f"{log}: expected the table alone to be planned")
                cell = trees[n]["remote cell"]
                job = f"cell:cell={cell}" if kind == "bare" else f"train_cell:study={STUDY},cell={cell}"
                figures[n][f"{kind} remote"].append(snakemake(
                    root, "--target-jobs", job, "--allowed-rules", job.split(":")[0], "--force", "--nolock",
                    "--mode", "remote", "-n", "-c", "1", log=root / "remote.log", env=env)[0])
                print(f"  repeat {repeat + 1}, {n} cells measured, {kind}: "
                      + ", ".join(f"{what} {figures[n][f'{kind} {what}'][-1]:.2f} s"
                                  for what in ("cold", "warm", "remote")),
                      flush=True)
    report = {}
    for n in sizes:
        f = figures[n]
        report[n] = {f"{name}_s": spread(values) for name, values in f.items() if values}
        for kind in kinds:
            if kind == "bare":
                continue
            for what in ("cold", "warm", "remote"):
                report[n][f"{kind}_{what}_ratio"] = spread(
                    [w / b for w, b in zip(f[f"{kind} {what}"],
                                           f[f"bare {'remote' if what == 'remote' else 'warm'}"])])
    return report


# --- scheduler -------------------------------------------------------------------------------------

def bench_scheduler(work: Path, ready: int, window_s: float) -> dict:
    """Jobs each scheduler finishes in `window_s` seconds of a real run of `ready` ready jobs."""
    report = {}
    for scheduler in ("greedy", "ilp"):
        root = make_bare(work / f"scheduler-{scheduler}", ready)
        command = [sys.executable, "-m", "snakemake", "all", "-c", "2", "--scheduler", scheduler, "-q"]
        started = time.perf_counter()
        with open(root / "run.log", "w") as out:
            run = subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
            try:
                run.wait(timeout=window_s)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)  # Snakemake answers SIGTERM by finishing what it runs
                run.wait()
        took = min(time.perf_counter() - started, window_s)
        done = len(list((root / "results" / "runs" / STUDY).glob("*/metrics.json")))
        report[scheduler] = {"ready": ready, "window_s": window_s, "seconds": took, "done": done,
                             "jobs_per_s": done / took}
        print(f"  {scheduler}: {done} of {ready} jobs in {took:.0f} s", flush=True)
    return report


# --- execution -------------------------------------------------------------------------------------

UNSUPPORTED_SETTINGS = {"framework": "lightning", "strategy": "colossalai", "model": "gpt2-tiny",
                        "device": "cpu"}
# the smallest cell that trains: one CPU rank (launcher python) or two (torchrun), a few tiny steps
TINY_CELL = {"model": "gpt2-tiny", "device": "cpu", "seq_len": 16, "micro_batch": 2, "warmup_steps": 1,
             "timed_steps": 2}
TINY_TIMING = {"target_ci": 1.0, "min_window_s": 0}

# the launched cell on one GPU, where there is one: run-cell also asks NVML and takes a GPU
GPU_CELL = "1-gpu"
TIMED_RUN_CELL = "--timed-run-cell"  # this script, run as `trainbench run-cell` with its launcher timed
RANK_IMPORTS = "import torch\nimport trainbench.execute.worker\n"


def timed_run_cell(times_file: str, argv: list[str]) -> int:
    """`trainbench run-cell argv`, writing to `times_file` each launcher's lifetime (from its start to
    its exit, reported by a pidfd the moment it happens) and the time the runner spent in
    CellRun._launch (starting the launchers, waiting for them, noticing their exit)."""
    from trainbench.execute import cellrun
    from trainbench import cli
    from trainbench.execute.watch import when_gone

    launch = cellrun.CellRun._launch
    times: dict[str, list[float]] = {"launch_s": [], "launcher_s": []}
    launching_thread = None

    class TimedPopen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            started = time.perf_counter()
            super().__init__(*args, **kwargs)
            # the launchers only: not what other threads start meanwhile (git, for the provenance)
            if threading.get_ident() == launching_thread:
                when_gone(self.pid, lambda: times["launcher_s"].append(time.perf_counter() - started))

    def timed_launch(self, *args, **kwargs):
        nonlocal launching_thread
        launching_thread = threading.get_ident()
        started = time.perf_counter()
        popen, cellrun.subprocess.Popen = cellrun.subprocess.Popen, TimedPopen
        try:
            return launch(self, *args, **kwargs)
        finally:
            cellrun.subprocess.Popen = popen
            times["launch_s"].append(time.perf_counter() - started)

    cellrun.CellRun._launch = timed_launch
    try:
        return cli.main(["run-cell", *argv])
    finally:
        Path(times_file).write_text(json.dumps(times))


def gpu_here() -> bool:
    from trainbench.execute.gpus import local_gpu_count

    return local_gpu_count() > 0


def wall(command: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"`{shlex.join(command)}` failed ({done.returncode}):\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    return took


def run_cell_argv(cell, output: Path) -> list[str]:
    """The arguments the train_cell rule gives run-cell for `cell`."""
    r = cell.resources()
    return ["--study", cell.study, "--cell", cell.cell_id, "--params", cell.canonical,
            "--retries", str(r["retries"]), "--cpus-per-rank", str(r["cpus_per_rank"]),
            "--runtime-min", str(r["runtime"]), "--timing", r["timing"], "--output", str(output)]


def slope(few: tuple[int, float], many: tuple[int, float]) -> float:
    return (many[1] - few[1]) / (many[0] - few[0])


def bench_execution(work: Path, cells: int, repeats: int, before: Path | None = None) -> dict:
    """Per-cell figures of today's workflow and, with `before`, of the workflow at --before REF, their
    runs interleaved (the same repeat of each kind back to back). Today's figures are at the top level;
    the other kind's, with the same keys, under "before"."""
    from trainbench.study.config import load_config

    kinds = ("workflow",) + ((BEFORE,) if before else ())
    few = max(cells // 5, 1)
    report: dict = {"cells": [few, cells]}
    figures: dict[str, dict] = {kind: {} for kind in kinds}

    # Snakemake alone, and the pipeline's unsupported cells: each really run, one job at a time
    per_job: dict[str, list[float]] = {kind: [] for kind in ("bare", *kinds)}
    for repeat in range(repeats):
        runs = {}
        for kind in ("bare", *kinds):
            for n in (few, cells):
                root = work / f"run-{kind}-{n}-{repeat}"
                if kind == "bare":
                    make_bare(root, n)
                else:
                    make_workflow(root, study_spec(n, UNSUPPORTED_SETTINGS, "unsupported cells"),
                                  before if kind == BEFORE else REPO)
                runs[kind, n] = snakemake(root, "all" if kind == "bare" else TARGET, "-c", "1",
                                          log=root / "run.log", env=kind_environment(kind, before))[0]
                done = len(list((root / "results" / "runs" / STUDY).glob("*/metrics.json")))
                if done != n:
                    raise SystemExit(f"{root}: {done} of {n} cells ran")
            per_job[kind].append(slope((few, runs[kind, few]), (cells, runs[kind, cells])))
            print(f"  repeat {repeat + 1}, {kind}: {few} jobs {runs[kind, few]:.1f} s, {cells} jobs "
                  f"{runs[kind, cells]:.1f} s: {1000 * per_job[kind][-1]:.1f} ms per job", flush=True)
    report["snakemake_bare_per_job_s"] = spread(per_job["bare"])
    for kind in kinds:
        figures[kind]["workflow_unsupported_per_cell_s"] = spread(per_job[kind])

    # run-cell's own process, and the interpreter's start, outside Snakemake
    [unsupported] = load_config({"studies": {STUDY: study_spec(1, UNSUPPORTED_SETTINGS, "one")}}).study(
        STUDY).cells
    scratch = work / "run-cell"
    scratch.mkdir()
    interpreter: list[float] = []
    alone: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(max(5, 3 * repeats)):
        interpreter.append(wall([sys.executable, "-c", "pass"], cwd=scratch))
        for kind in kinds:
            output = scratch / "unsupported" / "metrics.json"
            alone[kind].append(wall([sys.executable, "-m", "trainbench", "run-cell",
                                     *run_cell_argv(unsupported, output)], cwd=scratch,
                                    env=kind_environment(kind, before)))
            output.unlink()
    for kind in kinds:
        figures[kind]["processes_s"] = {"python -c pass": spread(interpreter),
                                        "run-cell, unsupported cell": spread(alone[kind])}

    # run-cell around a launched cell, and the launcher's own start-up
    rank_script = scratch / "rank_imports.py"
    rank_script.write_text(RANK_IMPORTS)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    for kind in kinds:
        figures[kind]["launched"] = {}
    for ranks in (1, 2, *((GPU_CELL,) if gpu_here() else ())):
        device = "cuda" if ranks == GPU_CELL else "cpu"
        gpus = 1 if ranks == GPU_CELL else ranks
        spec = {"description": "one tiny cell", "settings": {**TINY_CELL, "device": device, "gpus": gpus,
                                                             "strategy": "single" if gpus == 1 else "ddp"},
                "include": [{}], "timing": TINY_TIMING, "execution": {"runtime_min": 5, "cpus_per_rank": 1}}
        [cell] = load_config({"studies": {STUDY: spec}}).study(STUDY).cells
        launched = {kind: {"run_cell_s": [], "launcher_s": [], "noticed_exit_after_s": []} for kind in kinds}
        for _ in range(repeats):
            for kind in kinds:
                output = scratch / f"ranks-{ranks}" / "metrics.json"
                times_file = scratch / f"ranks-{ranks}.times.json"
                total = wall([sys.executable, __file__, TIMED_RUN_CELL, str(times_file), "--",
                              *run_cell_argv(cell, output)], cwd=scratch, env=kind_environment(kind, before))
                times = json.loads(times_file.read_text())
                [launch_s], [launcher_s] = times["launch_s"], times["launcher_s"]
                launched[kind]["run_cell_s"].append(total)
                launched[kind]["launcher_s"].append(launcher_s)
                launched[kind]["noticed_exit_after_s"].append(launch_s - launcher_s)
                status = json.loads(output.read_text())["status"]
                if status != "ok":
                    raise SystemExit(f"the tiny {ranks}-rank cell did not train ({kind}): {status}")
                output.unlink()
        start_up = [wall([sys.executable, str(rank_script)] if gpus == 1 else [*torchrun, str(rank_script)],
                         cwd=scratch) for _ in range(repeats)]
        for kind in kinds:
            f = launched[kind]
            f["run_cell_own_s"] = [t - launcher for t, launcher in zip(f["run_cell_s"], f["launcher_s"])]
            f["launcher_start_s"] = start_up
            figures[kind]["launched"][str(ranks)] = {name: spread(values) for name, values in f.items()}
    report.update(figures["workflow"])
    if before:
        report[BEFORE] = figures[BEFORE]
    return report


# --- report ----------------------------------------------------------------------------------------

def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {memory_gib:.0f} GiB, {platform.system()} {platform.release()}"


def versions() -> str:
    import importlib.metadata as metadata

    found = [f"python {platform.python_version()}"]
    for name in ("snakemake", "torch"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def commit() -> str:
    """The commit measured: TRAINBENCH_GIT_COMMIT where it is set (a GPU host's copy of the tree, whose
    .git, if any, need not be the tree's), else HEAD."""
    if os.environ.get("TRAINBENCH_GIT_COMMIT"):
        return os.environ["TRAINBENCH_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.0f} ms"


def ratio_text(r: dict) -> str:
    return f"{r['median']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]"


OTHER_KINDS = ("fixed", "shaped", "beside", BEFORE)  # beside the workflow's and the bare Snakefile's figures


def planning_summary(planning: dict) -> list[str]:
    sizes = sorted(planning, key=int)
    legend = {"fixed": "one rule with train_cell's directives, each given as a value",
              "shaped": "that rule with each given as a function",
              "beside": "the workflow with the study beside this repository's config.yaml studies",
              BEFORE: "the workflow at the commit named above"}
    lines = ["", "planning, beside the workflow and the bare Snakefile: " + "; ".join(
        f"{kind}: {legend[kind]}" for kind in OTHER_KINDS
        if f"{kind}_ratio_wall" in planning[sizes[0]]["plan"])]
    for mode in ("plan", "plan quiet"):
        flags = "-n" if mode == "plan" else "-n -q"
        lines += ["", f"planning: `snakemake {TARGET} {flags}` against a bare Snakefile of as many jobs; "
                      "medians of the repeats, ratios as median [lowest, highest] of the repeats' ratios",
                  f"{'cells':>6}  {'workflow':>9}  {'bare':>8}  {'wall: workflow/bare':>21}  "
                  f"{'cpu: workflow/bare':>21}  {'ms per added cell (bare)':>24}"
                  + "".join(f"  {kind + '/bare (wall)':>20}" for kind in OTHER_KINDS
                            if f"{kind}_ratio_wall" in planning[sizes[0]][mode])]
        previous = None
        for n in sizes:
            r = planning[n][mode]
            w, b = r["workflow_wall_s"]["median"], r["bare_wall_s"]["median"]
            marginal = ""
            if previous is not None:
                added = int(n) - int(previous[0])
                marginal = f"{1000 * (w - previous[1]) / added:.2f} ({1000 * (b - previous[2]) / added:.2f})"
            lines.append(f"{int(n):>6}  {w:>8.2f}s  {b:>7.2f}s  {ratio_text(r['ratio_wall']):>21}  "
                         f"{ratio_text(r['ratio_cpu']):>21}  {marginal:>24}"
                         + "".join(f"  {ratio_text(r[f'{kind}_ratio_wall']):>20}" for kind in OTHER_KINDS
                                   if f"{kind}_ratio_wall" in r))
            previous = (n, w, b)
        if "10000" in map(str, sizes):
            ratio = planning[next(n for n in sizes if str(n) == "10000")][mode]["ratio_wall"]["median"]
            lines.append(f"  goal at 10,000 cells: <= 1.2x the bare Snakefile; measured {ratio:.2f}x")
    return lines


def measured_summary(measured: dict, before: str | None) -> list[str]:
    sizes = sorted(measured, key=int)
    kinds = ["workflow"] + ([BEFORE] if f"{BEFORE} warm_s" in measured[sizes[0]] else [])
    label = {"workflow": "workflow", BEFORE: f"before ({before})"}
    lines = ["", f"a measured grid: every cell has a result; `snakemake {TARGET} -n` the first time the "
                 "workflow reads them (cold) and again (warm), and a SLURM job's own Snakemake before its "
                 "cell (--mode remote -n, one target job); against the bare Snakefile with every output "
                 "present; medians, ratios as median [lowest, highest] of the repeats'",
             f"{'cells':>6}  {'':<22}  {'cold':>7}  {'warm':>7}  {'remote job':>10}  {'warm/bare':>20}  "
             f"{'remote/bare':>20}"]
    for n in sizes:
        r = measured[n]
        lines.append(f"{int(n):>6}  {'bare':<22}  {r['bare cold_s']['median']:>6.2f}s  "
                     f"{r['bare warm_s']['median']:>6.2f}s  "
                     f"{r['bare remote_s']['median']:>9.2f}s")
        for kind in kinds:
            lines.append(f"{'':>6}  {label[kind]:<22}  {r[f'{kind} cold_s']['median']:>6.2f}s  "
                         f"{r[f'{kind} warm_s']['median']:>6.2f}s  {r[f'{kind} remote_s']['median']:>9.2f}s  "
                         f"{ratio_text(r[f'{kind}_warm_ratio']):>20}  "
                         f"{ratio_text(r[f'{kind}_remote_ratio']):>20}")
    return lines


def scheduler_summary(scheduler: dict) -> list[str]:
    lines = ["", "scheduler: a real run of the bare Snakefile's `touch` jobs on 2 cores (-c 2), "
                 "all ready at once"]
    for name, r in scheduler.items():
        lines.append(f"  --scheduler {name:6}  {r['done']:>5} of {r['ready']} jobs in {r['seconds']:.0f} s "
                     f"({r['jobs_per_s']:.1f} jobs/s)")
    return lines


def execution_summary(execution: dict, before: str | None = None) -> list[str]:
    """Today's per-cell figures; where the run measured the workflow of --before REF beside it, that
    kind's figure follows each of today's, in brackets."""
    few, many = execution["cells"]
    kinds = {"now": execution, **({BEFORE: execution[BEFORE]} if BEFORE in execution else {})}

    def both(figure) -> str:
        text = ms(figure(kinds["now"]))
        return text + (f" (at {before}: {ms(figure(kinds[BEFORE]))})" if BEFORE in kinds else "")

    def alone(k: dict) -> float:
        return k["processes_s"]["run-cell, unsupported cell"]["median"]

    def workflow(k: dict) -> float:
        return k["workflow_unsupported_per_cell_s"]["median"]

    lines = ["", f"execution, per cell (medians; one job at a time, -c 1; per-job figures are the slope "
                 f"between {few} and {many} jobs):",
             f"  Snakemake alone (bare Snakefile, `touch` jobs)                       "
             f"{ms(execution['snakemake_bare_per_job_s']['median'])}",
             f"  the pipeline, unsupported cells (Snakemake + run-cell, no launcher)   {both(workflow)}",
             f"    of which Snakemake's job set-up for train_cell                    "
             f"{both(lambda k: workflow(k) - alone(k))}",
             f"    of which `trainbench run-cell` (its process, alone)               {both(alone)}",
             f"      of which the interpreter's start (`python -c pass`)           "
             f"{ms(execution['processes_s']['python -c pass']['median'])}"]
    for ranks, r in execution["launched"].items():
        launcher = "torchrun" if ranks == "2" else "python"
        what = "1 GPU rank" if ranks == GPU_CELL else f"{ranks} CPU rank(s)"

        def own(k: dict) -> float:
            return k["launched"][ranks]["run_cell_own_s"]["median"]

        lines += [f"  a launched cell, {what} ({launcher}): run-cell {ms(r['run_cell_s']['median'])}, "
                  f"its launcher {ms(r['launcher_s']['median'])}, run-cell's own {both(own)} "
                  "(from the launcher's exit to the runner going on: "
                  f"{1000 * r['noticed_exit_after_s']['median']:+.1f} "
                  "ms, two threads woken by one exit)",
                  f"    the pipeline's own share: Snakemake's job set-up + run-cell's own = "
                  f"{both(lambda k: workflow(k) - alone(k) + own(k))} (goal <= 20 ms)",
                  f"    the launcher's start-up, apart ({launcher}, ranks that import torch and "
                  f"trainbench.execute.worker, then exit): {ms(r['launcher_start_s']['median'])}"]
    return lines


def start_summary(start: dict) -> list[str]:
    lines = ["", f"Snakemake's start (a one-job Snakefile, -n): {start['median']:.2f} s [{start['low']:.2f}, "
                 f"{start['high']:.2f}], in every figure below"]
    if start["median"] > 5:
        lines.append("  WARNING: more than 5 s. On a machine with SLURM's commands but no controller "
                     "answering them, the SLURM executor plugin probes them when Snakemake starts; "
                     "start the cluster (tools/local-slurm-cluster.sh start) or measure where they "
                     "are absent.")
    return lines


def summary(report: dict) -> str:
    lines = list(report["header"])
    if "start" in report:
        lines += start_summary(report["start"])
    if "planning" in report:
        lines += planning_summary(report["planning"])
    if "measured" in report:
        lines += measured_summary(report["measured"], report.get("before"))
    if "scheduler" in report:
        lines += scheduler_summary(report["scheduler"])
    if "execution" in report:
        lines += execution_summary(report["execution"], report.get("before"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [TIMED_RUN_CELL]:
        return timed_run_cell(argv[1], argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 40000], help="cells per study")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ready", type=int, default=2000, help="ready jobs for the scheduler figures")
    parser.add_argument("--window", type=float, default=60, help="seconds each scheduler runs")
    parser.add_argument("--cells", type=int, default=300, help="cells really run for the execution figures")
    parser.add_argument("--skip", nargs="+", default=[],
                        choices=["planning", "measured", "scheduler", "execution"])
    parser.add_argument("--before", metavar="REF", help="run the workflow of commit REF beside today's "
                        "(or of a folder holding its files: see checkout)")
    parser.add_argument("--out", type=Path, help="where to write plan_scaling.{json,txt}")
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temporary one, removed)")
    parser.add_argument("--report", type=Path, metavar="JSON",
                        help="measure nothing: print the summary of a plan_scaling.json written before")
    args = parser.parse_args(argv)
    if args.report:
        print(summary(json.loads(args.report.read_text())), end="")
        print(f"(this summary: `python bench/plan_scaling.py --report {args.report}`, "
              "from the run above's figures)")
        return 0

    # Python caches compiled modules (__pycache__) unless told not to; the runs here cache them as a
    # user's environment does, or every process would compile trainbench again (50 ms per cell).
    bytecode = "on" if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is None else "on (it was off here)"
    header = [f"bench/plan_scaling.py on {machine()}; {versions()}; commit {commit()}, "
              f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC; bytecode caching {bytecode}",
              f"command: {shlex.join([Path(sys.executable).name, 'bench/plan_scaling.py', *argv])}"]
    print("\n".join(header), flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="plan_scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"header": header}
    try:
        before = None
        if args.before:
            before = checkout(args.before, work)
            report["before"] = args.before
        report["start"] = snakemake_start(work, args.repeats)
        print("\n".join(start_summary(report["start"])), flush=True)
        if "planning" not in args.skip:
            report["planning"] = bench_planning(work / "plan", args.sizes, args.repeats, before)
        if "measured" not in args.skip:
            report["measured"] = bench_measured(work / "measured", args.sizes, args.repeats, before)
        if "scheduler" not in args.skip:
            report["scheduler"] = bench_scheduler(work / "schedule", args.ready, args.window)
        if "execution" not in args.skip:
            report["execution"] = bench_execution(work / "execute", args.cells, args.repeats, before)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    text = summary(report)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan_scaling.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "plan_scaling.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
