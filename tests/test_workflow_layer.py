"""What the workflow decides (trainbench.workflow), checked without Snakemake: the Snakefile's input
functions only hand these to it (tests/test_workflow.py runs them through Snakemake)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from conftest import REPO, tiny_study
from trainbench.errors import ConfigError
from trainbench.workflow import STUDY_NAME, Workflow, load_checked


def two_studies() -> dict:
    cpu = tiny_study(strategy="ddp", gpus=2)
    cpu["axes"] = {"micro_batch": [1, 2]}
    gpu = tiny_study(device="cuda", strategy="ddp")
    gpu["axes"] = {"gpus": [1, 4]}
    gpu["report"] = ["step_time_ms", "tokens_per_s"]
    return {"studies": {"cpu": cpu, "gpu": gpu},
            "default_studies": {"without_gpus": ["cpu"], "with_gpus": ["gpu"]}}


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # results/ of the tests' own, empty
    return tmp_path


def test_a_study_reporting_what_no_table_knows_is_refused_before_any_job(here):
    config = two_studies()
    config["studies"]["gpu"]["report"] = ["step_time_ms", "tokens_per_sec"]
    with pytest.raises(ConfigError, match=r"studies\.gpu\.report: unknown column 'tokens_per_sec' "
                                          r"\(did you mean 'tokens_per_s'\?\)"):
        load_checked(config)
    config = two_studies()
    config["studies"]["cpu"]["findings"] = [{"claim": "c", "compare": {"metric": "step_ms", "less": {}}}]
    with pytest.raises(ConfigError, match=r"studies\.cpu\.findings\[0\]\.compare\.metric: unknown metric"):
        load_checked(config)


def test_a_cell_without_a_result_is_missing_and_its_stamp_no_trigger(here):
    flow = Workflow(load_checked(two_studies()))
    cpu = flow.study("cpu")
    assert flow.missing_cells(cpu) == sorted(c.cell_id for c in cpu.cells)
    assert not flow.any_stale()  # nothing ran: nothing ran with other parameters
    assert not any(flow.grid_input_triggers(c) for c in cpu.cells)
    done = cpu.cells[0]
    os.makedirs(os.path.dirname(done.target))
    with open(done.target, "w") as f:
        json.dump({}, f)
    assert flow.missing_cells(cpu) == sorted(c.cell_id for c in cpu.cells[1:])


def test_cells_needing_more_gpus_than_the_machine_are_named_once_and_left_out(here, capsys):
    flow = Workflow(load_checked(two_studies()))
    gpu = flow.study("gpu")
    short = flow.cells_short_of_gpus(gpu, gpus_here=1)
    assert list(short) == ["gpus~4"]
    assert short["gpus~4"].startswith("needs 4 GPUs")
    assert flow.study_metrics(gpu, short) == [gpu.cell("gpus~1").target]
    flow.cells_short_of_gpus(gpu, gpus_here=1)
    said = capsys.readouterr().err
    assert said.count("need more GPUs than this machine has (1)") == 1
    assert flow.cells_short_of_gpus(flow.study("cpu"), gpus_here=0) == {}  # CPU ranks need no GPU


def test_a_resource_every_cell_shares_is_a_value_and_the_others_follow_the_cell(here):
    flow = Workflow(load_checked(two_studies()))
    assert flow.cell_resource("runtime") == 5  # every cell's runtime_min
    gpu_of = flow.cell_resource("gpu")  # CPU cells ask for none, GPU cells for theirs
    assert callable(gpu_of)
    assert gpu_of("gpu", "gpus~4") == 4 and gpu_of("cpu", "micro_batch~1") == 0
    remote = Workflow(load_checked(two_studies()), remote=True)  # plans one job: nothing shared
    assert callable(remote.cell_resource("runtime"))


def test_the_default_target_follows_the_machine(here):
    flow = Workflow(load_checked(two_studies()))
    assert "results/tables/cpu.md" in flow.final_output(have_gpus=False)
    assert "results/tables/gpu.md" in flow.final_output(have_gpus=True)
    assert "results/tables/gpu.md" not in flow.final_output(have_gpus=False)


def test_planned_rows_follow_their_cells_not_their_order(here):
    config = two_studies()
    config["studies"]["gpu"]["measure"] = {"cells": [{"gpus": 1}],
                                           "plan_for": {"name": "H100", "gpu_mem_gib": 80,
                                                        "host_mem_gib": 512, "gpus_per_node": 8}}
    planning = Workflow(load_checked(config)).planning(load_checked(config).study("gpu"))
    assert planning["planned"] == [f"gpus~4={load_checked(config).study('gpu').cell('gpus~4').params_hash}"]
    config["studies"]["gpu"]["axes"] = {"gpus": [4, 1]}
    assert Workflow(load_checked(config)).planning(load_checked(config).study("gpu")) == planning


def test_cells_run_here_only_under_the_local_executor_and_placement(here):
    flow = Workflow(load_checked(two_studies()))
    assert flow.runs_cells_here(None)  # Snakemake's local executor
    cluster = SimpleNamespace(common_settings=SimpleNamespace(local_exec=False))  # the SLURM plugin's
    assert not flow.runs_cells_here(cluster)
    placed = Workflow(load_checked({**two_studies(), "placement": "cluster"}))
    assert not placed.runs_cells_here(None)  # a cluster profile's dry run here


def test_a_report_where_the_default_studies_never_ran_shows_what_is_on_disk(here):
    flow = Workflow(load_checked(two_studies()))
    made = ["results/tables/gpu.md", "results/tables/gpu.csv", "results/plots/gpu/memory.png"]
    for path in made:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
    default = flow.final_output(have_gpus=False)
    assert "results/tables/cpu.md" in default  # a run makes the default studies' outputs
    # a report of a tree where they were never made (a fresh clone): every tabled study's files there
    assert flow.final_output(have_gpus=False, reporting=True) == made[:2] + ["results/plots/gpu"]
    for path in default:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
    assert flow.final_output(have_gpus=False, reporting=True) == default  # made here: those
    # a workspace whose default studies are none (the validation one): what is on disk
    none = {"without_gpus": [], "with_gpus": []}
    alone = Workflow(load_checked({**two_studies(), "default_studies": none}))
    assert alone.final_output(have_gpus=False) == []
    assert "results/tables/gpu.md" in alone.final_output(have_gpus=False, reporting=True)


def test_slurm_placement_reaches_snakemake_only_where_a_study_names_it(here):
    # a rule's resource replaces the profile's --default-resources of that name, even where None
    plain = Workflow(load_checked(two_studies())).cell_resource_names()
    assert not {"slurm_partition", "gpu_model"} & set(plain)
    config = two_studies()
    config["studies"]["gpu"]["execution"]["slurm_partition"] = "gpu"
    flow = Workflow(load_checked(config))
    names = flow.cell_resource_names()
    assert names["slurm_partition"] == "slurm_partition" and "slurm_account" not in names
    partition = flow.cell_resource("slurm_partition")
    assert partition("gpu", "gpus~4") == "gpu" and partition("cpu", "micro_batch~1") is None


def test_an_unsupported_cell_of_an_array_study_asks_what_the_array_asks(here):
    """The SLURM plugin gives an array the request of whichever job comes first: a cell that only
    writes why it cannot run must not be the one that strips the others of their GPUs."""
    study = tiny_study(device="cuda", strategy="ddp", gpus=2)
    study["execution"].update(slurm_array=True)
    study["include"] = [{}, {"framework": "lightning", "strategy": "colossalai"}]  # unsupported by the stack
    workflow = Workflow(load_checked({"studies": {"a": study}}))
    cells = workflow.study("a").cells
    assert cells[1].unsupported and cells[1].resources()["gpu"] == 0
    gpus = workflow.cell_resource("gpu")
    assert [gpus("a", c.cell_id) if callable(gpus) else gpus for c in cells] == [2, 2]


def test_a_study_submitted_as_job_arrays_has_its_own_rule_and_one_request(here):
    """train_cell trains every study but an array study, whose rule is its own (the SLURM plugin makes
    an array of one rule's jobs, with the first one's request), and whose cells all ask for the largest
    memory and time any of them asks for."""
    config = two_studies()
    config["studies"]["cpu"]["execution"].update(slurm_array=True, runtime_min=5)
    config["studies"]["cpu"]["execution_overrides"] = [{"when": {"micro_batch": 2},
                                                        "set": {"mem_mb_per_rank": 3000, "runtime_min": 9}}]
    config["studies"]["cpu-2"] = config["studies"]["gpu"]  # a name that starts like the array study's
    workflow = Workflow(load_checked(config))
    rules = dict(workflow.train_rules())
    assert set(rules) == {"train_cell", "train_cpu"}
    assert re.fullmatch(rules["train_cpu"], "cpu")
    assert not re.fullmatch(rules["train_cell"], "cpu")
    assert re.fullmatch(rules["train_cell"], "cpu-2") and re.fullmatch(rules["train_cell"], "gpu")
    memory, runtime = workflow.cell_resource("mem_mb"), workflow.cell_resource("runtime")
    assert {memory("cpu", c) for c in ("micro_batch~1", "micro_batch~2")} == {2 * 3000}  # two ranks each
    assert {runtime("cpu", c) for c in ("micro_batch~1", "micro_batch~2")} == {9}
    own_limit = workflow.cell_resource("cell_runtime")  # what the run stops at stays the cell's own
    assert (own_limit("cpu", "micro_batch~1"), own_limit("cpu", "micro_batch~2")) == (5, 9)
    assert memory("gpu", "gpus~1") == 1000  # not an array: its own
    assert Workflow(load_checked(two_studies())).train_rules() == [("train_cell", STUDY_NAME)]  # no array


# --- a user's own studies stay out of git, results and all ------------------------------------------------

def _results_of(study: str) -> list[Path]:
    """Every file the workflow writes for one cell of a study: its result, log, history, a search's probe
    and summary, the table, plan, findings and page, a plot and the grid stamp (not the report's copies
    of its page: REPORT_COPIES)."""
    from trainbench import paths
    from trainbench.contract.history import history_file

    cell = {"study": study, "cell": "strategy~single"}
    result = Path(paths.path(paths.RUN, **cell))
    made = [result, Path(paths.path(paths.RUN_LOG, **cell)), history_file(result),
            Path(paths.path(paths.PROBE, **cell, micro_batch=4)), Path(paths.path(paths.SEARCH, **cell)),
            Path(paths.path(paths.PLOTS_DIR, study=study)) / paths.PLOTS_INDEX,
            Path(paths.path(paths.GRID_STAMP, study=study)), Path(paths.path(paths.STUDY_PAGE, study=study)),
            *(Path(p) for p in paths.study_outputs(study) if p != paths.path(paths.PLOTS_DIR, study=study)
              and p not in _report_copies(study))]
    for path in made:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    return made


def _report_copies(study: str) -> list[str]:
    """The report's copies of a study's page and front-page part: their plots embedded, never kept."""
    from trainbench import paths

    return [paths.path(pattern, study=study) for pattern in (paths.REPORT_PAGE, paths.STUDY_FRONT)]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def test_the_results_of_a_study_in_a_git_ignored_file_are_git_ignored_too(here):
    """A study of studies/local/ (git-ignored): `git status` shows none of its results, as it shows none
    of its file, while the project's studies' results show; moved into the project, its results show."""
    shutil.copy(REPO / ".gitignore", here / ".gitignore")
    study = {**tiny_study(strategy="single"), "include": [{}]}
    (here / "config.yaml").write_text(yaml.safe_dump(
        {"study_files": ["studies/*.yaml", "studies/local/*.yaml"], "studies": {"t": study},
         "default_studies": {"without_gpus": ["t"], "with_gpus": ["t"]}}))
    (here / "studies/local").mkdir(parents=True)
    (here / "studies/a.yaml").write_text(yaml.safe_dump({"studies": {"a": study}}))
    (here / "studies/local/mine.yaml").write_text(yaml.safe_dump({"studies": {"mine": study}}))
    _git("init", "-q")
    _git("add", ".gitignore", "config.yaml", "studies/a.yaml")
    Workflow(load_checked("config.yaml"))
    made = {name: _results_of(name) for name in ("t", "a", "mine")}

    shown = set(_git("status", "--porcelain", "--untracked-files=all").split())
    for name in ("t", "a"):
        assert {str(p) for p in made[name]} <= shown, name  # the project's: to be added
    assert not [p for p in shown if "mine" in p], shown  # neither the study's file nor its results
    assert "results/.gitignore" not in shown  # it ignores itself
    for name in ("t", "a"):  # the report's copies of a page are made again, not kept, whoever's study
        for copy in _report_copies(name):
            Path(copy).parent.mkdir(parents=True, exist_ok=True)
            Path(copy).write_text("<html></html>\n")
    assert shown == set(_git("status", "--porcelain", "--untracked-files=all").split())

    (here / "studies/local/mine.yaml").rename(here / "studies/mine.yaml")  # now the project's
    _git("add", "studies/mine.yaml")
    Workflow(load_checked("config.yaml"))
    shown = set(_git("status", "--porcelain", "--untracked-files=all").split())
    assert {str(p) for p in made["mine"]} <= shown


# --- what common.smk does, and when -------------------------------------------------------------------

COMMON_SMK = REPO / "workflow" / "rules" / "common.smk"


def test_common_smk_stays_small_and_changes_no_environment_while_parsed():
    """Logic that grows belongs in the package; the process's environment changes in onstart alone."""
    lines = COMMON_SMK.read_text().splitlines()
    assert len(lines) <= 170, f"common.smk: {len(lines)} lines; move logic into trainbench.workflow"
    changes = [line for line in lines if re.search(r"os\.environ|mimetypes|signal\.|putenv", line)]
    assert changes == []
    assert "on_start(workflow)" in COMMON_SMK.read_text().split("onstart:")[1].split("\n\n")[0]


def test_the_jobs_search_path_puts_this_python_first_once():
    from trainbench.workflow import jobs_search_path

    python = "/venvs/tb/bin/python"
    assert jobs_search_path("/usr/bin:/bin", python) == "/venvs/tb/bin:/usr/bin:/bin"
    assert jobs_search_path("/venvs/tb/bin:/usr/bin", python) == "/venvs/tb/bin:/usr/bin"


def test_on_start_sets_the_jobs_path_and_leaves_other_executors_alone(monkeypatch):
    import signal
    import sys

    from trainbench.workflow import on_start

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    before = signal.getsignal(signal.SIGTERM)
    try:
        on_start(SimpleNamespace(executor_plugin=None, executor_settings=None))
        assert os.environ["PATH"] == f"{Path(sys.executable).parent}:/usr/bin:/bin"
        assert signal.getsignal(signal.SIGTERM) is not before  # cells stop with Snakemake
    finally:
        signal.signal(signal.SIGTERM, before)


def test_opening_the_workflow_names_a_stale_lock_and_exits_on_a_config_error(here, capsys):
    import mimetypes

    from trainbench.workflow import open_workflow

    (here / ".snakemake" / "locks").mkdir(parents=True)
    (here / ".snakemake" / "locks" / "0.input.lock").write_text("")
    flow = open_workflow(two_studies(), remote=False, argv=["snakemake", "-n"])
    assert isinstance(flow, Workflow) and "--unlock" in capsys.readouterr().err
    open_workflow(two_studies(), remote=False, argv=["snakemake", "--unlock"])
    assert capsys.readouterr().err == ""
    assert mimetypes.guess_type("cells.parquet")[0] == "application/vnd.apache.parquet"
    broken = two_studies()
    broken["studies"]["cpu"]["report"] = ["tokens_per_sec"]
    with pytest.raises(SystemExit, match="(?s)^error: .*tokens_per_sec"):
        open_workflow(broken, remote=False, argv=[])
    with pytest.raises(SystemExit, match="(?s)^error: target names .*nope"):
        flow.target_study("nope")
    with pytest.raises(SystemExit, match="^error: target names"):
        flow.target_cell("cpu", "nope")
