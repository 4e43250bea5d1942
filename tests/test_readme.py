"""Every command the README and the documentation show works as written, in a fresh clone on a CPU
machine.

The commands are read from README.md, ARCHITECTURE.md and docs/*.md themselves (fenced bash blocks,
and inline code that starts with a command), so a new command cannot go untested: each must be listed
in HOW below, which says how this test runs it. Commands that train on GPUs are dry-run (`-n`); the
few that need a GPU host, root or a package index are run by CI or other tests, named in the entry.
"""

from __future__ import annotations

import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import pytest

from conftest import CPU_MACHINE, REPO, Workflow

README = REPO / "README.md"
DOCUMENTS = [README, REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]


def documented_commands() -> list[str]:
    return list(dict.fromkeys(c for document in DOCUMENTS for c in readme_commands(document.read_text())))
COMMAND_START = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:sudo )?(snakemake|trainbench|python3?|make|bash|tools/)\b")


def readme_commands(text: str) -> list[str]:
    """Commands in README order: lines of ```bash blocks (comments dropped) and inline code spans
    that start with a command."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if COMMAND_START.match(span) and " " in span:
            commands.append(span.strip())
    return list(dict.fromkeys(commands))


@dataclass(frozen=True)
class How:
    # "run": verbatim; "dry-run": verbatim plus -n; "elsewhere" or "name" (not a command line): see `why`
    mode: str
    why: str = ""
    line: str | None = None  # the command with its placeholders (<study>) filled in
    before: Callable[[Workflow], None] | None = None  # what the command expects to exist
    trains: bool = False  # a run that trains a cell (on CPU) is expected


def _a_rerun_tree(flow: Workflow) -> None:
    """`rerun/results/runs`: another clone's results, here the smoke study run again."""
    shutil.copytree(flow.path("results/runs/smoke"), flow.path("rerun/results/runs/smoke"),
                    dirs_exist_ok=True)


def _my_studies(flow: Workflow) -> None:
    """`my-studies.yaml`: a study of the reader's, kept out of config.yaml."""
    flow.path("my-studies.yaml").write_text(
        "studies:\n  mine:\n    description: one tiny cell of the reader's\n"
        "    settings: {model: gpt2-tiny, device: cpu, gpus: 1, seq_len: 16}\n"
        "    include: [{strategy: single}]\n")


def _try_cpu_study(flow: Workflow) -> None:
    """`studies/local/try-cpu.yaml`: the study of the example's model docs/your-model.md shows, as shown."""
    text = (REPO / "docs/your-model.md").read_text()
    block = text.split("`studies/local/try-cpu.yaml`:", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    flow.path("studies/local").mkdir(parents=True, exist_ok=True)
    flow.path("studies/local/try-cpu.yaml").write_text(block)


HOW: dict[str, How] = {
    "make setup": How("elsewhere", "CI's `make test` runs it"),
    "snakemake <target> --forcerun": How("name", "the README's example of what forces nothing"),
    "trainbench cells": How("run"),
    "trainbench schema --write workflow/schemas/config.schema.yaml": How("run"),
    "trainbench cells <study>": How("run", line="trainbench cells smoke"),
    "trainbench predict": How("name", "the command's name; its full forms are run"),
    "trainbench compare": How("name", "the command's name; its full forms are run"),
    "trainbench run-cell": How("name", "what the train_cell rule runs"),
    "snakemake -n results/tables/<study>.md": How("run", line="snakemake -n results/tables/llama.md"),
    "snakemake results/tables/<study>.md": How("run", line="snakemake results/tables/megatron.md"),
    "snakemake -n": How("run"),
    "make run": How("elsewhere",
                    "= `make setup` (which CI's `make test` runs) + `snakemake -c all` (run below)"),
    "make test": How("elsewhere", "CI's own command (.ci/run)"),
    "PYTEST_WORKERS=0 make test": How("elsewhere", "the same suite in one worker; CI runs it in two"),
    "make lint": How("elsewhere", "CI's .ci/run runs it; tests/test_workflow.py runs Snakemake's linter"),
    "snakemake -c all": How("run",
                            "the quick start; the session's smoke fixture ran it first in a fresh clone"),
    "snakemake -c all results/tables/gpt2_zero.md": How("run"),
    "snakemake -n results/tables/llama.md": How("run"),
    "trainbench cells smoke": How("run"),
    "trainbench progress smoke --watch": How("run", "the smoke study ran: it shows the grid done and ends"),
    "trainbench progress <study>": How("run", line="trainbench progress smoke"),
    "snakemake -c all --force results/runs/smoke/strategy~ddp/metrics.json": How("run", trains=True),
    "snakemake -c all results/tables/smoke.html --forcerun results/runs/smoke/strategy~ddp/metrics.json":
        How("run", trains=True),
    "trainbench predict llama --gpu h200 --gpus-per-node 8 --host-mem-gib 2048": How("run"),
    "trainbench advise --model llama-7b --gpu h100 --gpus-per-node 8 --nodes 4 --host-mem-gib 1024": How(
        "run", "writes studies/local/advise-llama-7b.yaml, which the commands after it load"),
    "trainbench advise": How("name", "the command's name; its full form is run"),
    "trainbench advise --model qwen-1b --gpu h100 --gpus-per-node 8 --host-mem-gib 1024": How(
        "elsewhere", "qwen-1b is the reader's model; tests/test_advise.py advises a model of the config's "
                     "and one from a config.json"),
    "snakemake -c all results/tables/advise-<model>.md": How(
        "elsewhere", "measures 32-GPU set-ups (emulated on a GPU); tests/test_advise.py loads the study "
                     "advise writes and judges its findings on measured figures"),
    "trainbench predict megatron --gpu a100-80g --gpus-per-node 8 --host-mem-gib 1024": How("run"),
    "trainbench compare results/runs rerun/results/runs": How("run", before=_a_rerun_tree),
    "snakemake --report report.html": How("run", "the report of the smoke study the quick start made"),
    "snakemake -c all report_all": How("run", "the published studies' pages: nothing may train"),
    "snakemake -c all report_all --allowed-rules study_page report_all": How(
        "run", "the pages alone, as on a fresh clone: nothing may train"),
    "snakemake --report report.html report_all": How("run"),
    "trainbench strategies": How("run"),
    "trainbench models": How("run"),
    "trainbench columns": How("run"),
    "trainbench columns --markdown": How("run",
                                         "prints docs/columns.md; tests/test_docs.py holds the page to it"),
    "trainbench headline --write README.md": How(
        "run", "writes the README's results again from the published ones: the same text "
               "(tests/test_answer.py holds the README to it)"),
    "python3 tools/build_wheelhouse.py .whl --python 3.12 --skip envs/gpu-host-image.txt":
        How("elsewhere",
            "downloads 28 MiB; tests/test_tools.py builds a wheelhouse and installs from it offline"),
    "bash tools/install_offline.sh .whl":
        How("elsewhere", "tests/test_tools.py installs a wheelhouse offline"),
    "snakemake --profile profiles/slurm -j 64 --default-resources slurm_partition=gpu "
    "slurm_account=myproject":
        How("dry-run",
            "submits to a cluster's 'gpu' partition; tests/test_slurm.py runs the profile for real"),
    "snakemake results/tables/gpt2_zero.md --profile profiles/slurm --default-resources slurm_partition=gpu":
        How("dry-run", "as above"),
    "snakemake results/tables/sweep.md --profile profiles/slurm --slurm-array-jobs train_sweep":
        How("elsewhere", "names a study of the reader's (sweep); tests/test_slurm.py submits a study as "
                         "job arrays on the CI's cluster"),
    "snakemake --profile profiles/slurm -n results/runs/float8/"
    "strategy~fsdp__model~gpt-5.8b__gpus~8__micro_batch~4__float8~tensorwise__compile~true/metrics.json":
        How("dry-run", "a dry run of the SLURM profile already: no cluster needed"),
    "python3 tools/build_wheelhouse.py wheels --python 3.12":
        How("elsewhere", "as the .whl wheelhouse above"),
    "python -m pip install --no-index --find-links wheels -r envs/requirements.txt":
        How("elsewhere", "tests/test_tools.py installs a wheelhouse without an index"),
    "python -m pip install --no-index --no-deps -e .": How("elsewhere", "as above"),
    "trainbench compare results/runs rerun/results/runs --fail-on slower:5%,memory:5%":
        How("run", before=_a_rerun_tree),
    "python3 bench/overhead.py --ablation":
        How("elsewhere", "times GPU cells; tests/test_bench.py runs it on a CPU stand-in"),
    "python3 bench/overhead.py --ablation --out results/bench/overhead/gpt2-124m --cells "
    "'strategy~single__model~gpt2-124m__gpus~1__micro_batch~32'": How("elsewhere", "as above"),
    "trainbench cost": How("run"),
    "snakemake results/tables/<study>.md -n -q": How("run", line="snakemake results/tables/llama.md -n -q"),
    "trainbench fit llama <cell> --gpu-mem-gib 80": How(
        "elsewhere",
        "a llama cell needs a GPU; tests/test_emulation.py runs `trainbench fit` on a CPU study"),
    "trainbench fit megatron <cell> --gpu-mem-gib 40 --search": How("elsewhere", "as above, with --search"),
    "trainbench fit STUDY CELL [--rank R] [--gpu-mem-gib G] [--search]":
        How("name", "the command's synopsis"),
    "trainbench fit": How("name", "the command's name; tests/test_emulation.py runs it"),
    "make docs": How("elsewhere", "CI's .ci/run builds the site with every warning an error"),
    "trainbench profile baseline <cell>": How(
        "elsewhere", "a baseline cell needs a GPU; tests/test_profiling.py runs `trainbench profile` on "
                     "a CPU cell"),
    "trainbench profile baseline strategy~single__model~gpt2-124m__gpus~1__micro_batch~32 --steps 3":
        How("elsewhere", "as above"),
    "trainbench profile baseline strategy~single__model~gpt2-124m__gpus~1__micro_batch~32 --memory":
        How("elsewhere", "as above, with the allocator's history (a GPU's)"),
    "trainbench profile": How("name", "the command's name; tests/test_profiling.py runs it"),
    "trainbench: optimizer step": How("name", "a profiler range's name, not a command"),
    "trainbench breakdown RESULT...": How("name", "the command's synopsis; tests/test_profiling.py runs it"),
    "snakemake -c1 results/dataset/cells.parquet": How("run"),
    "trainbench compare results/runs --history": How(
        "elsewhere", "a clone's cells have no earlier run: tests/test_history.py runs a cell twice and "
                     "compares"),
    "trainbench compare results/runs --history --fail-on slower:5%": How("elsewhere", "as above"),
    "trainbench compare results/runs --history --study ddp_settings": How(
        "run", "ddp_settings' published cells against their published earlier runs"),
    "trainbench history lightning": How("run"),
    "trainbench references baseline": How("run", "baseline's published cells are within their references"),
    "trainbench query": How("name", "the command's name; its full forms are run"),
    "trainbench commbench": How("name", "the command's name; its forms are below"),
    "trainbench commbench --device cpu --ranks 2": How("run", "two gloo ranks: a table of the CPU's own"),
    "trainbench commbench --ranks 4": How("elsewhere", "4 GPUs; tests/test_commbench.py times CPU ranks"),
    "snakemake -c all results/comm/h200-x2.json": How(
        "elsewhere", "2 H200s; tests/test_commbench.py runs the rule for CPU ranks (cpu-x2)"),
    "snakemake --profile profiles/slurm results/comm/h200-n2x8.json": How(
        "dry-run", "2 nodes of 8 H200s; tests/test_slurm.py reads its request from the cluster"),
    "trainbench commbench --nodes": How("name", "an option's name; tests/test_slurm.py runs it under salloc"),
    "trainbench query \"metric == 'mfu' and p_strategy == 'zero3'\"": How("run"),
    "trainbench query \"metric == 'mfu' and p_strategy == 'zero3' and source == 'measured'\"": How("run"),
    "trainbench query \"metric == 'gpu_mem_used_max_mib' and p_strategy == 'fsdp'\" --columns "
    "study,p_model,p_gpus,value --csv": How("run"),
    "python bench/top_kernels.py validation/results/runs/holdout_accum/*/profile/rank0.json.gz --host 8":
        How("run", "the two profiled Lightning cells' traces are committed"),
    "trainbench check-models memory": How(
        "elsewhere", "tests/test_model_checks.py runs it as written, on the repository's published results"),
    "trainbench check-models time": How("run", "fits the published cells, leave-one-out and by study"),
    "trainbench check-models time --write": How(
        "elsewhere", "rewrites the package's constants; tests/test_time_model.py fits on synthetic cells"),
    "trainbench check-models predictions": How("name", "the command's name; its full forms are run"),
    "trainbench check-models predictions validation/results/predictions/holdout_unchanged-h200.csv":
        How("run", "the published round held against its committed predictions"),
    "trainbench check-models predictions validation/results/predictions/holdout_accum-h200.csv":
        How("run", "as above, part by part: its cells were profiled"),
    "trainbench check-models architectures --write": How(
        "elsewhere", "sweeps every causal LM of transformers (minutes); tests/test_architectures*.py run "
                     "the same sweep and hold docs/architectures.md to it"),
    "trainbench check-models emulation": How(
        "elsewhere", "reads the emulation_check study's published cells: tests/test_model_checks.py runs "
                     "this command line in the repository (the same published cells) and checks its output"),
    "sudo tools/local-slurm-cluster.sh install && sudo tools/local-slurm-cluster.sh start":
        How("elsewhere", "root; CI's .ci/run starts the cluster this way (as root, without sudo)"),
    'trainbench commbench --from-nccl-tests all_reduce_perf.log all_gather_perf.log --source "..."': How(
        "elsewhere", "needs outputs of nccl-tests; tests/test_commbench.py makes a table from outputs in "
                     "its format with this command"),
    "python bench/communication.py": How(
        "elsewhere", "tests/test_communication.py runs it and holds its output to the published one"),
    "python bench/plan_scaling.py --out results/bench/plan_scaling":
        How("elsewhere", "plans grids of up to 40,000 cells, three times each; tests/test_bench.py runs it "
                         "on a small grid; its output: results/bench/plan_scaling"),
    "trainbench cells qwen-strategies": How(
        "elsewhere", "a study of the reader's, on their model and tokens; tests/test_user_models.py "
                     "predicts and trains a study of a model defined in the config"),
    "snakemake -c all results/tables/qwen-strategies.md": How("elsewhere", "as above, on an 8-GPU host"),
    "trainbench fit qwen-strategies <cell> --gpu-mem-gib 80": How("elsewhere", "as above, on a GPU"),
    "trainbench cells try-cpu": How("run", before=_try_cpu_study),
    "snakemake -c all results/tables/try-cpu.md": How("run", trains=True, before=_try_cpu_study),
    "snakemake results/tables/mine.md --configfile my-studies.yaml": How(
        "dry-run", "the study comes from the merged file alone", before=_my_studies),
    "snakemake -d validation -n results/tables/holdout_unchanged.md": How("run"),
    "snakemake --unlock": How("run", "nothing is locked in a clone: it unlocks nothing and exits"),
}


def test_every_documented_command_is_known_to_this_test():
    commands = documented_commands()
    unknown = [c for c in commands if c not in HOW]
    assert not unknown, f"documented commands this test does not know how to run (add them to HOW): {unknown}"
    gone = [c for c in HOW if c not in commands]
    assert not gone, f"commands in HOW that no document shows any more: {gone}"


def _run_in_order(clone: Workflow, commands: list[str]) -> None:
    """Each command as HOW says, one after the other, in `clone`."""
    for command in commands:
        how = HOW[command]
        if how.before:
            how.before(clone)
        line = how.line or command
        line = f"{line} -n" if how.mode == "dry-run" else line
        started = time.monotonic()
        result = clone.shell(line, env=CPU_MACHINE, timeout=600)
        print(f"{time.monotonic() - started:6.1f} s  {line}")  # where the test's time goes (pytest -s)
        said = result.stdout + result.stderr
        if line.split()[0] in ("snakemake", "python3") and "snakemake" in line and how.mode == "run":
            # published GPU results build their tables here; nothing may retrain on a CPU machine
            assert how.trains or "rule train_cell:" not in said, (
                f"`{command}` retrained a cell:\n{said[-3000:]}")


@pytest.mark.slow
def test_every_documented_command_works_as_written_in_a_fresh_clone(smoke_run_locally, tmp_path):
    # Two copies of the fresh clone where the quick start already ran, and two lanes of commands run
    # at the same time, each in its documents' order in its own copy. Each lane is mostly one process
    # at a time, so the two keep the CI's two cores busy, if they take about as long. In a fresh clone
    # every published study's table, plots and page are out of date (its checkout leaves each plot older
    # than its results and each table older than its script), so the Snakemake commands from the first
    # one that makes a published table (`results/tables/megatron.md`) on, the published studies' pages
    # among them (`report_all`), go in one lane: megatron's table is made once, as a reader going down
    # the documents makes it, and `report_all` makes the other studies' (about 100 s on a CI-sized box).
    # The Snakemake commands before it (the quick start's study: 55 s) and everything else
    # (trainbench's, the bench scripts: 80 s) go in the other. A line documented twice runs once.
    run, seen = [], set()
    for command in documented_commands():
        how = HOW[command]
        if how.mode not in ("elsewhere", "name") and (how.line or command, how.mode) not in seen:
            seen.add((how.line or command, how.mode))
            run.append(command)
    snakemake = [c for c in run if "snakemake" in (HOW[c].line or c)]
    published = next((i for i, c in enumerate(snakemake)
                      if "results/tables/megatron.md" in (HOW[c].line or c)), len(snakemake))
    others = [c for c in run if c not in snakemake]
    # the CPU study of docs/your-model.md (60 s of training) goes with the published studies: the two
    # lanes then take about as long
    cpu_study = [c for c in run if "try-cpu" in c]
    lanes = {"smoke-and-others": [c for c in snakemake[:published] + others if c not in cpu_study],
             "published-studies": [c for c in snakemake[published:] if c not in cpu_study] + cpu_study}
    with ThreadPoolExecutor(max_workers=len(lanes)) as pool:
        running = [pool.submit(_run_in_order, Workflow.at(shutil.copytree(
            smoke_run_locally[0].root, tmp_path / f"clone-{lane}", symlinks=True)), commands)
            for lane, commands in lanes.items()]
    for lane in running:
        lane.result()  # a lane's failure, raised here
