"""The workflow end to end, through real Snakemake runs in a scratch copy of the repository."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from trainbench.predict.batch_search import bounds_for
from trainbench.study.config import load_config
from trainbench.workflow import prediction_inputs, prediction_models_digest

from conftest import CPU_MACHINE, PROJECT_CONFIG, REPO, Workflow, parse_dry_run, tiny_study

TABLE_FINDINGS = "results/tables/t.findings.csv"
TABLE_PLAN = "results/tables/t.plan.csv"
TABLE_ALL = "results/tables/t.all.md"


def test_a_tests_workspace_leaves_out_what_a_user_keeps_in_studies_local(tmp_path):
    """A user's study file in studies/local/ (git-ignored) whose model's config.json sits beside
    config.yaml: the workspace a test builds takes the project's study files (tracked, or new and not
    ignored) and not the user's, so its config loads whatever the user keeps there."""
    repo = tmp_path / "repo"
    (repo / "studies/local").mkdir(parents=True)
    (repo / "models").mkdir()
    (repo / ".gitignore").write_text("studies/local/\n")
    study = {**tiny_study(strategy="single"), "include": [{}]}
    (repo / "studies/a.yaml").write_text(yaml.safe_dump({"studies": {"a": study}}))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", ".gitignore", "studies/a.yaml"], cwd=repo, check=True)
    (repo / "studies/b.yaml").write_text(yaml.safe_dump({"studies": {"b": study}}))  # new, not yet added
    (repo / "models/x.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 256}))
    (repo / "studies/local/mine.yaml").write_text(yaml.safe_dump(
        {"models": {"x": {"hf_config": "models/x.json"}}, "studies": {"mine": study}}))
    flow = Workflow(tmp_path / "flow", repo=repo)
    flow.write_config({"study_files": ["studies/*.yaml", "studies/local/*.yaml"], "studies": {}})
    assert sorted(load_config(flow.path("config.yaml")).studies) == ["a", "b"]
    assert not flow.path("studies/local").exists()


def run_counts(jobs: dict[str, set[str]]) -> dict[str, int]:
    return {rule: len(outputs) for rule, outputs in jobs.items()}


def cells_planned(jobs) -> set[str]:
    return {path.split("/")[3] for path in jobs.get("train_cell", set())}


# --- every study of STUDIES.md dry-runs with its resources ----------------------------------

STUDIES = ["lightning", "llama", "zero3_pipeline", "gpt2_zero", "megatron"]
EIGHT_GPUS = {"TRAINBENCH_FAKE_GPUS": "8"}  # as on a host of 8 GPUs, where every one-node cell can run


def dry_run_jobs(text: str) -> list[dict]:
    """Each job of a dry run's text: its rule, outputs and resources line (None where it shows none)."""
    jobs: list[dict] = []
    for line in text.splitlines():
        line = line.strip()
        match = re.match(r"^(?:local)?(?:rule|checkpoint) (\w+):$", line)
        if match:
            jobs.append({"rule": match.group(1), "output": set(), "resources": None})
        elif jobs and line.startswith("output:"):
            jobs[-1]["output"].update(p.strip() for p in line.split(":", 1)[1].split(","))
        elif jobs and line.startswith("resources:"):
            jobs[-1]["resources"] = line
    return jobs


def study_of(job: dict) -> set[str]:
    return {study for study in STUDIES for path in job["output"]
            if path.startswith((f"results/runs/{study}/", f"results/search/{study}/",
                                f"results/tables/{study}."))}


@pytest.fixture(scope="module")
def every_cell_planned(tmp_path_factory) -> list[dict]:
    """The jobs of one dry run of every study's table and every cell it plans, of all STUDIES at once (a
    cell named as a target cannot be another study's; what each table alone plans, each test dry-runs)."""
    flow = Workflow(tmp_path_factory.mktemp("studies"))
    flow.write_config((REPO / "config.yaml").read_text())
    config = load_config(PROJECT_CONFIG)
    targets = [target for study in STUDIES
               for target in (f"results/tables/{study}.md", *(c.target for c in config.study(study).planned))]
    jobs = dry_run_jobs(flow.snakemake("-n", *targets, env=EIGHT_GPUS).stdout)
    assert jobs and all(len(study_of(job)) == 1 for job in jobs)  # each job is one study's
    return jobs


@pytest.fixture(scope="module")
def every_table_planned(tmp_path_factory) -> list[dict]:
    """The jobs of one dry run of every study's table, of all STUDIES at once. Each job is one study's,
    so a study's jobs here are what its table alone plans: Snakemake plans each target's jobs from its
    inputs, whatever else is named beside it."""
    flow = Workflow(tmp_path_factory.mktemp("tables"))
    flow.write_config((REPO / "config.yaml").read_text())
    jobs = dry_run_jobs(flow.snakemake("-n", *(f"results/tables/{study}.md" for study in STUDIES),
                                       env=EIGHT_GPUS).stdout)
    assert jobs and all(len(study_of(job)) == 1 for job in jobs)  # each job is one study's
    return jobs


@pytest.mark.parametrize("study", STUDIES)
def test_each_study_dry_runs_listing_its_cells_and_resources(every_table_planned, every_cell_planned, study):
    expected = load_config(PROJECT_CONFIG).study(study)
    # the table runs the measured cells; the planned ones run when named (here: all of them)
    table: dict[str, set[str]] = {}
    for job in every_table_planned:
        if study_of(job) == {study}:
            table.setdefault(job["rule"], set()).update(job["output"])
    assert table["train_cell"] == set(expected.targets)
    # and the searches it reports, each from its first probe (the memory model's seed)
    first_probes = {f"results/search/{study}/{cell_id}/"
                    f"mb~{bounds_for(expected.search, expected.cell(cell_id).params)[0]}"
                    "/metrics.json" for cell_id in expected.searched}
    assert table.get("search_probe", set()) == first_probes
    assert bool(first_probes) == (study == "megatron")
    planned = [job for job in every_cell_planned if study_of(job) == {study}]
    jobs: dict[str, set[str]] = {}
    for job in planned:
        jobs.setdefault(job["rule"], set()).update(job["output"])
    assert len(jobs["train_cell"]) == len(expected.cells)
    assert jobs["study_table"] == {f"results/tables/{study}.md", f"results/tables/{study}.all.md",
                                   f"results/tables/{study}.csv", f"results/tables/{study}.plan.csv",
                                   f"results/tables/{study}.findings.csv"}
    resources = [job["resources"] for job in planned if job["resources"]]
    for cell in expected.cells:
        r = cell.resources()
        request = f"gpu={r['gpu']}," if r["gpu"] is not None else f"gres={r['gres']}, nodes={r['nodes']},"
        assert any(request in line for line in resources), request
    assert all("runtime=" in line and "mem_mb=" in line for line in resources if "gpu=" in line)
    if study == "zero3_pipeline":
        assert any("gres=gpu:8, nodes=8, tasks=8," in line for line in resources)
        assert any("gres=gpu:8, nodes=16, tasks=16," in line for line in resources)


def cell_job_requests(dry_run: str) -> dict[str, str]:
    """Each cell job of a dry run's text: its output, and its threads and resources lines."""
    jobs, job = {}, None
    for line in dry_run.splitlines():
        line = line.strip()
        if line.endswith(":") and line.split()[0] in ("rule", "localrule"):
            job = {} if line == "rule train_cell:" else None
        elif job is not None and line.split(":")[0] in ("output", "threads", "resources"):
            key, value = line.split(": ", 1)
            job[key] = value
            if "output" in job and "threads" in job and "resources" in job:
                jobs[job.pop("output")] = f"threads={job['threads']}, {job['resources']}"
                job = None
    return jobs


def test_resources_shared_by_every_cell_ask_the_scheduler_for_the_same(workflow):
    """A resource every cell of config.yaml asks for alike is handed to Snakemake as a value, the others
    as a function of the job's cell (common.smk): a study's jobs ask for the same either way."""
    t = tiny_study(strategy="ddp", gpus=2)
    t["axes"] = {"micro_batch": [1, 2]}
    u = tiny_study(strategy="single")
    u["axes"] = {"micro_batch": [1]}
    u["execution"] = {"runtime_min": 7, "cpus_per_rank": 2, "mem_mb_per_rank": 1500, "retries": 1}
    workflow.write_config({"studies": {"t": t}})
    alone = cell_job_requests(workflow.snakemake("-n", "results/tables/t.md").stdout)
    workflow.write_config({"studies": {"t": t, "u": u}})  # u shares none of the resources that differ
    beside = cell_job_requests(workflow.snakemake("-n", "results/tables/t.md", "results/tables/u.md").stdout)
    study_t = load_config({"studies": {"t": t}}).study("t")
    assert set(alone) == set(study_t.targets)
    for cell in study_t.cells:
        r = cell.resources()
        assert alone[cell.target] == beside[cell.target], cell.cell_id
        assert alone[cell.target].startswith(f"threads={r['threads']}, ")
        for name in ("gpu", "nodes", "cpus_per_task", "cpus_per_rank", "runtime", "mem_mb"):
            assert f" {name}={r[name]}," in alone[cell.target], name
    [u_job] = [requests for target, requests in beside.items() if "/u/" in target]
    assert u_job.startswith("threads=2, ") and " runtime=7," in u_job and " mem_mb=1500," in u_job
    # a resource set on the command line (or by a profile) overrides a shared value as it does a function's
    workflow.write_config({"studies": {"t": t}})
    overridden = cell_job_requests(workflow.snakemake("-n", "results/tables/t.md", "--set-resources",
                                                      "train_cell:runtime=77").stdout)
    assert set(overridden) == set(alone) and all(" runtime=77," in r for r in overridden.values())


# --- only missing or changed cells rerun ------------------------------------------------------

def rerun_config() -> dict:
    t = tiny_study(strategy="single")
    t["axes"] = {"micro_batch": [1, 2]}
    u = tiny_study(strategy="single")
    u["include"] = [{"seed": 1}]
    return {"default_studies": {"without_gpus": ["t", "u"], "with_gpus": ["t", "u"]},
            "studies": {"t": t, "u": u}}


@pytest.fixture(scope="module")
def rerun_tree(tmp_path_factory) -> tuple[Workflow, dict[str, set[str]]]:
    """rerun_config's study run once, as `snakemake` runs it on a fresh tree (the tests below start from a
    copy of it), and the jobs that run executed."""
    flow = Workflow(tmp_path_factory.mktemp("rerun"))
    flow.write_config(rerun_config())
    return flow, flow.ran()


@pytest.fixture
def rerun_workflow(rerun_tree, tmp_path) -> tuple[Workflow, dict[str, set[str]]]:
    """A copy of rerun_tree's workflow, its results and Snakemake's metadata, with their times."""
    flow, first = rerun_tree
    return Workflow.at(shutil.copytree(flow.root, tmp_path / "flow", symlinks=True)), first


def test_only_missing_or_changed_cells_rerun(rerun_workflow):
    workflow, first = rerun_workflow
    config = rerun_config()
    assert cells_planned(first) == {"micro_batch~1", "micro_batch~2", "seed~1"}
    untouched_u = workflow.path("results/runs/u/seed~1/metrics.json").stat().st_mtime_ns

    # an unchanged tree: nothing to do
    result = workflow.snakemake("-n")
    assert "Nothing to be done" in result.stdout + result.stderr

    # reordering keys and axis values in config.yaml: nothing to do
    reordered = copy.deepcopy(config)
    t = reordered["studies"]["t"]
    t["settings"] = dict(reversed(list(t["settings"].items())))
    t["axes"]["micro_batch"] = [2, 1]
    reordered["studies"] = {"u": reordered["studies"]["u"], "t": t}
    workflow.write_config(yaml.safe_dump(reordered, sort_keys=True))
    assert "Nothing to be done" in (lambda r: r.stdout + r.stderr)(workflow.snakemake("-n"))

    # execution and timing settings (limits, retries, how long to time) are not parameters: nothing to do
    changed = copy.deepcopy(config)
    changed["studies"]["t"]["execution"]["runtime_min"] = 7
    changed["studies"]["t"]["execution"]["retries"] = 2
    changed["studies"]["t"]["timing"] = {"target_ci": 0.5, "max_timed_s": 3}
    workflow.write_config(changed)
    assert "Nothing to be done" in (lambda r: r.stdout + r.stderr)(workflow.snakemake("-n"))

    # adding an axis value runs only the new cell, plus t's aggregates
    changed = copy.deepcopy(config)
    changed["studies"]["t"]["axes"]["micro_batch"] = [1, 2, 4]
    workflow.write_config(changed)
    jobs = workflow.ran()
    assert cells_planned(jobs) == {"micro_batch~4"}
    assert jobs["study_table"] == {"results/tables/t.md", TABLE_ALL, "results/tables/t.csv", TABLE_PLAN,
                                   TABLE_FINDINGS}
    assert jobs["study_plots"] == {"results/plots/t"}

    # editing one axis value (2 -> 3) runs exactly the cell with the new value
    changed["studies"]["t"]["axes"]["micro_batch"] = [1, 3, 4]
    workflow.write_config(changed)
    assert cells_planned(workflow.planned()) == {"micro_batch~3"}

    # editing a setting changes every cell of that study, and no other study's
    changed["studies"]["t"]["axes"]["micro_batch"] = [1, 2, 4]
    changed["studies"]["t"]["settings"]["lr"] = 3e-4
    workflow.write_config(changed)
    jobs = workflow.ran()
    assert cells_planned(jobs) == {"micro_batch~1", "micro_batch~2", "micro_batch~4"}
    assert "results/tables/u.md" not in jobs.get("study_table", set())
    rerun = json.loads(workflow.path("results/runs/t/micro_batch~1/metrics.json").read_text())
    assert rerun["params"]["lr"] == 3e-4
    assert workflow.path("results/runs/u/seed~1/metrics.json").stat().st_mtime_ns == untouched_u

    # changing what the table shows reruns the table, not the cells
    changed["studies"]["t"]["report"] = ["step_time_ms", "loss"]
    workflow.write_config(changed)
    jobs = workflow.planned()
    assert "train_cell" not in jobs and jobs["study_table"] == {"results/tables/t.md", "results/tables/t.csv",
                                                                TABLE_ALL, TABLE_PLAN, TABLE_FINDINGS}
    assert "study_plots" not in jobs
    # and so does a change of the findings it judges
    changed["studies"]["t"]["findings"] = [{"claim": "steps take longer with larger batches",
                                            "compare": {"metric": "step_time_ms",
                                                        "rises_with": "micro_batch"}}]
    workflow.write_config(changed)
    jobs = workflow.planned()
    assert "train_cell" not in jobs and "study_plots" not in jobs and TABLE_FINDINGS in jobs["study_table"]
    # and what the plots show, the plots alone
    changed["studies"]["t"]["plot_panels"] = ["micro_batch"]
    workflow.write_config(changed)
    jobs = workflow.ran()
    # the table for the report change above; the study's page follows both
    assert set(jobs) - {"all"} == {"study_plots", "study_table", "study_page"}
    changed["studies"]["t"]["plot_panels"] = []
    workflow.write_config(changed)
    assert set(workflow.planned()) - {"all"} == {"study_plots", "study_page"}

    # a reviewer re-runs one cell (README): only that cell; or that cell and the table it feeds (t.md is
    # up to date: the last run made it, and the dry run above plans no table)
    cell = "results/runs/t/micro_batch~2/metrics.json"
    jobs = workflow.planned("--force", cell)
    assert cells_planned(jobs) == {"micro_batch~2"} and "study_table" not in jobs
    jobs = workflow.planned("results/tables/t.md", "--forcerun", cell)
    assert cells_planned(jobs) == {"micro_batch~2"}
    assert jobs["study_table"] == {"results/tables/t.md", "results/tables/t.csv", TABLE_ALL, TABLE_PLAN,
                                   TABLE_FINDINGS}
    # its plots with it: through a plot, or through the study's page (table, plots and page)
    jobs = workflow.planned("results/plots/t", "--forcerun", cell)
    assert cells_planned(jobs) == {"micro_batch~2"} and set(jobs) == {"train_cell", "study_plots"}
    jobs = workflow.planned("results/tables/t.html", "--forcerun", cell)
    assert cells_planned(jobs) == {"micro_batch~2"}
    assert set(jobs) == {"train_cell", "study_table", "study_plots", "study_page"}
    assert jobs["study_plots"] == {"results/plots/t"}


def test_reruns_follow_the_config_in_a_fresh_clone_without_snakemake_metadata(rerun_workflow):
    """A clone has results but no .snakemake: new and changed cells must still run, others not."""
    workflow, _ = rerun_workflow
    config = rerun_config()
    shutil.rmtree(workflow.path(".snakemake"))
    assert "Nothing to be done" in (lambda r: r.stdout + r.stderr)(workflow.snakemake("-n"))

    changed = copy.deepcopy(config)
    changed["studies"]["t"]["axes"]["micro_batch"] = [1, 2, 4]
    workflow.write_config(changed)
    jobs = workflow.planned()
    assert cells_planned(jobs) == {"micro_batch~4"} and "results/tables/t.md" in jobs["study_table"]
    assert "results/tables/u.md" not in jobs["study_table"]

    changed["studies"]["u"]["settings"]["lr"] = 3e-4  # u's only cell now has other parameters
    workflow.write_config(changed)
    jobs = workflow.ran()
    assert cells_planned(jobs) == {"micro_batch~4", "seed~1"}
    shutil.rmtree(workflow.path(".snakemake"))
    assert "Nothing to be done" in (lambda r: r.stdout + r.stderr)(workflow.snakemake("-n"))

    # a result missing in a clone whose table exists (a cell that never ran where the table was made, or
    # a run that died): this machine can run it, so it runs, and its table again with it
    workflow.path("results/runs/u/seed~1/metrics.json").unlink()
    jobs = workflow.planned()
    assert cells_planned(jobs) == {"seed~1"} and jobs["study_table"] == {
        "results/tables/u.md", "results/tables/u.all.md", "results/tables/u.csv", "results/tables/u.plan.csv",
        "results/tables/u.findings.csv"}


def test_a_refit_of_the_models_reruns_what_shows_their_predictions_and_no_cell(workflow):
    """Tables, plots and the dataset show the current models' predictions, read when they run: a change
    of the time model's constants (trainbench check-models time --write) reruns them, through their
    prediction_models param (Workflow.prediction_models), though no input of theirs changed."""
    # a trainbench of the copy's own, first on the path of Snakemake and its jobs: its models can change
    # without touching the repository's
    shutil.copytree(REPO / "src" / "trainbench", workflow.path("src/trainbench"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    on_cpus = {**CPU_MACHINE, "PYTHONPATH": str(workflow.path("src"))}
    # a GPU study on a machine without one: its table is all predictions, and no cell runs (the measured
    # one needs a GPU, the other is planned for an H200)
    t = tiny_study(device="cuda", strategy="ddp")
    t["axes"] = {"gpus": [1, 2]}
    t["measure"] = {"cells": [{"gpus": 1}],
                    "plan_for": {"name": "H200", "gpu_mem_gib": 140, "host_mem_gib": 512, "gpus_per_node": 8}}
    workflow.write_config({"studies": {"t": t}})
    targets = ("results/tables/t.md", "results/plots/t", "results/dataset/cells.parquet")
    workflow.snakemake(*targets, env=on_cpus)

    def planned() -> dict[str, set[str]]:
        result = workflow.snakemake("-n", *targets, env=on_cpus)
        return parse_dry_run(result.stdout + result.stderr)

    assert planned() == {}  # up to date: nothing to do
    constants = workflow.path("src/trainbench/predict/time_model_constants.json")
    refit = json.loads(constants.read_text())
    for fitted in refit.values():
        fitted["eta_matmul"] *= 0.9
    constants.write_text(json.dumps(refit, indent=1))
    shown = {"study_table": {"results/tables/t.md", TABLE_ALL, "results/tables/t.csv", TABLE_PLAN,
                             TABLE_FINDINGS},
             "study_plots": {"results/plots/t"}, "dataset": {"results/dataset/cells.parquet"}}
    assert planned() == shown
    # and where Snakemake has no record of their params, as in a fresh clone: the models' stamp
    shutil.rmtree(workflow.path(".snakemake/metadata"))
    assert planned() == shown


@pytest.mark.parametrize("workspace", [".", "validation"])
def test_a_clone_starts_with_the_models_stamp_of_its_models(workspace):
    """The committed stamp holds the digest of the committed models: else a clone's first run makes every
    table, plot and the dataset again (`snakemake -c2 report_all` writes it after a change of them)."""
    stamp = REPO / workspace / "results/.grid/prediction-models.txt"
    assert stamp.read_text().strip() == prediction_models_digest(REPO / workspace)


def test_the_models_digest_covers_what_predictions_are_read_through_and_not_the_advice():
    """The cell view changes every model's answer; `advise` only reads the models (no table shows it)."""
    names = dict(prediction_inputs())
    read = {"study/cell_view.py", "predict/memory_model.py", "predict/time_model_constants.json"}
    assert read <= set(names)
    assert "predict/advise.py" not in names


def test_the_bandwidth_tables_the_time_model_reads_are_among_what_its_predictions_are_made_from(tmp_path):
    """A table a user measures into the project (trainbench commbench) changes the time model's
    predictions, so it reruns what shows them, as a refit does."""
    published = dict(prediction_inputs(tmp_path))
    assert published["results/comm/h200-x2.json"] == REPO / "results/comm/h200-x2.json"
    assert "predict/time_model_constants.json" in published
    (tmp_path / "results/comm").mkdir(parents=True)
    # one more, one across nodes, and one in the place of a published one
    for name in ("h200-x16.json", "h200-n2x8.json", "h200-x4.json"):
        shutil.copy(REPO / "results/comm/h200-x4.json", tmp_path / "results/comm" / name)
    (tmp_path / "results/comm/notes.json").write_text("{}")  # no table's name: not read
    mine = dict(prediction_inputs(tmp_path))
    assert set(mine) - set(published) == {"results/comm/h200-x16.json", "results/comm/h200-n2x8.json"}
    assert mine["results/comm/h200-x4.json"] == tmp_path / "results/comm/h200-x4.json"


# --- outcomes are data: OOM in the table, not a crashed workflow ---------------------------------

def test_an_oom_cell_is_a_row_of_the_table(workflow):
    t = tiny_study(strategy="ddp", gpus=2)
    t["axes"] = {"inject_oom_at_step": [2]}
    t["include"] = [{"strategy": "single", "gpus": 1}]
    workflow.write_config({"default_studies": {"without_gpus": ["t"], "with_gpus": ["t"]},
                           "studies": {"t": t}})
    workflow.snakemake()
    table = workflow.path("results/tables/t.all.md").read_text()  # every column, by the keys it varies
    assert "| ddp | 2 | 2 | OOM at step 2 (timed) |" in table
    # ok, or ok and noisy: six windows of milliseconds on a machine busy with other tests can spread
    assert re.search(r"\| single \| 1 \|  \| ok(, noisy \(±[\d.]+%\))? \|", table), table
    summary = workflow.path("results/tables/t.md").read_text()  # the answer says so first, then the row
    assert "ran out of memory: OOM at step 2 (timed)" in summary.split("## Measured cells")[0]
    assert "| 2 | OOM at step 2 (timed) |" in summary
    csv_text = workflow.path("results/tables/t.csv").read_text().replace('"', "")
    # whichever rank failed first is named; the launcher may stop the other before its own OOM
    assert re.search(r"inject_oom_at_step~2,oom,OOM at step 2 \(timed\) on rank [01]", csv_text)
    assert workflow.path("results/plots/t/memory.png").stat().st_size > 10_000


# --- bad input: a clear message, a non-zero exit, no traceback, results untouched ----------------

BAD_CONFIGS = {
    "unknown key": ("settings", {"micro_bach": 2},
                    "config.yaml: studies.t.settings: unknown key 'micro_bach' (did you mean "
                    "'micro_batch'?)"),
    "negative size": ("settings", {"micro_batch": -1},
                      "studies.t.settings.micro_batch: -1 is less than the minimum of 1"),
    "unknown strategy": ("settings", {"strategy": "zero2"},
                         "strategy: 'zero2' is not a torch strategy; allowed: single, ddp, fsdp"),
    "offload without meaning": ("settings", {"strategy": "ddp", "gpus": 2, "offload_optimizer": True},
                                "offload_optimizer: means nothing for torch strategy 'ddp'"),
    "tp not dividing": ("settings", {"framework": "deepspeed", "strategy": "zero1", "gpus": 2, "tp": 4},
                        "gpus: gpus=2 is not divisible by tp x pp = 4 x 1"),
    "unknown model": ("settings", {"model": "gpt-9"}, "model: unknown model 'gpt-9'"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_stops_before_any_job_with_one_clear_message(workflow, case):
    section, values, message = BAD_CONFIGS[case]
    t = tiny_study(strategy="single")
    t["include"] = [{}]
    t[section].update(values)
    workflow.write_config({"default_studies": {"without_gpus": ["t"], "with_gpus": ["t"]},
                           "studies": {"t": t}})
    keep = workflow.path("results/runs/t/keep/metrics.json")
    keep.parent.mkdir(parents=True)
    keep.write_text("earlier result\n")
    result = workflow.snakemake(check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert message in output, output
    assert "Traceback" not in output and "File \"" not in output
    assert keep.read_text() == "earlier result\n"
    assert sorted(p.name for p in workflow.path("results").rglob("*") if p.is_file()) == ["metrics.json"]


@pytest.mark.parametrize("config, message", [
    ({"studies": [{"t": 1}]}, "studies: must be a mapping (key: value, ...), not a list"),
    ({"studies": {"t": {**tiny_study(strategy="single"), "include": [{}],
                        "report": ["step_time_ms", "speed"]}}},
     "studies.t.report: unknown column 'speed'"),
])
def test_mistakes_found_before_any_job_even_a_dry_run(workflow, config, message):
    workflow.write_config(config)
    result = workflow.snakemake("-n", check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and message in output, output
    assert "Traceback" not in output and "File \"" not in output


@pytest.mark.parametrize("target, message", [
    ("results/tables/nope.md", "unknown study 'nope'; studies: t "),
    ("results/runs/t/micro_batch~9/metrics.json", "study 't' has no cell 'micro_batch~9'"),
])
def test_a_target_naming_nothing_known_is_refused(workflow, target, message):
    t = tiny_study(strategy="single")
    t["axes"] = {"micro_batch": [1]}
    workflow.write_config({"studies": {"t": t}})
    result = workflow.snakemake("-n", target, check=False)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_a_local_run_names_cells_that_need_more_gpus_than_the_machine_has_and_runs_the_rest(workflow):
    t = tiny_study(strategy="ddp", device="cuda")
    t["axes"] = {"gpus": [1, 2, 4]}
    t["exclude"] = [{"gpus": 1}]
    t["include"] = [{"strategy": "single", "gpus": 1}]
    workflow.write_config({"studies": {"t": t}})
    one_gpu = {"TRAINBENCH_FAKE_GPUS": "1"}
    result = workflow.snakemake("-n", "results/tables/t.md", env=one_gpu)
    assert cells_planned(parse_dry_run(result.stdout)) == {"strategy~single__gpus~1"}
    assert ("t: 2 cell(s) need more GPUs than this machine has (1) and will not run here: "
            "gpus~2, gpus~4") in result.stderr
    out = subprocess.run([sys.executable, "-m", "trainbench", "cells", "t", "--tsv"], cwd=workflow.root,
                         capture_output=True, text=True, check=True, env={**os.environ, **one_gpu}).stdout
    status = {row.split("\t")[1]: row.split("\t")[2] for row in out.splitlines()[1:]}
    assert status["gpus~4"] == "missing: needs 4 GPUs (this machine has 1)"
    assert status["strategy~single__gpus~1"] == "missing"
    # through a cluster executor every cell is submitted, whatever this machine has
    jobs = parse_dry_run(workflow.snakemake("-n", "--profile", "profiles/slurm", "results/tables/t.md",
                                            env=one_gpu).stdout)
    assert cells_planned(jobs) == {"strategy~single__gpus~1", "gpus~2", "gpus~4"}


# --- listing cells for reviewers -----------------------------------------------------------------

def test_cells_lists_targets_and_current_status(workflow):
    t = tiny_study(strategy="single")
    t["axes"] = {"micro_batch": [1, 2]}
    workflow.write_config({"studies": {"t": t}})
    workflow.snakemake("results/runs/t/micro_batch~1/metrics.json")

    def listing():
        out = subprocess.run([sys.executable, "-m", "trainbench", "cells", "t", "--tsv"], cwd=workflow.root,
                             capture_output=True, text=True, check=True).stdout
        return {row.split("\t")[1]: row.split("\t") for row in out.strip().splitlines()[1:]}

    rows = listing()
    assert rows["micro_batch~1"][2] == "ok" and rows["micro_batch~2"][2] == "missing"
    assert rows["micro_batch~1"][5] == "results/runs/t/micro_batch~1/metrics.json"
    t["settings"]["lr"] = 5e-4
    workflow.write_config({"studies": {"t": t}})
    assert listing()["micro_batch~1"][2] == "ok (stale: parameters changed)"


def test_cells_says_ranks_on_cpu_and_gpus_apart(capsys, tmp_path):
    from trainbench.cli import main

    assert main(["cells", "smoke", "baseline", "zero3_pipeline", "--tsv",
                 "--config", str(PROJECT_CONFIG), "--root", str(tmp_path)]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert rows[0][3:5] == ["ranks", "nodes"]
    listed = {(row[0], row[1]): row[3:5] for row in rows[1:]}
    # a CPU study's DDP cell is two ranks on CPU (its table says gpus 2), not zero GPUs
    assert listed[("smoke", "strategy~ddp")] == ["2 (cpu)", "1"]
    assert listed[("baseline", "strategy~ddp__model~gpt2-124m__gpus~2__micro_batch~32")] == ["2 (gpu)", "1"]
    assert listed[("zero3_pipeline", "nodes~16__gpus~128__tp~1__micro_batch~1__grad_accum~1")] == [
        "128 (gpu)", "16"]


def test_a_result_that_is_not_one_is_listed_unreadable_rerun_and_never_reaches_a_table(rerun_workflow):
    # valid JSON, not a result (tests/test_results.py: the schema's other refusals)
    garbage = {"status": "ok"}
    # study t's two cells and its table, made by a real run (rerun_tree's, copied): its first cell's
    # result is replaced, the other stays current
    workflow, _ = rerun_workflow
    target = workflow.path("results/runs/t/micro_batch~1/metrics.json")
    target.write_text(garbage if isinstance(garbage, str) else json.dumps(garbage))
    out = subprocess.run([sys.executable, "-m", "trainbench", "cells", "t", "--tsv"], cwd=workflow.root,
                         capture_output=True, text=True, check=True).stdout
    status = next(row.split("\t")[2] for row in out.splitlines() if row.split("\t")[1] == "micro_batch~1")
    assert status.startswith("unreadable (")
    dry = workflow.snakemake("-n", "results/tables/t.md")
    assert cells_planned(parse_dry_run(dry.stdout)) == {"micro_batch~1"}
    assert "is not a valid result" in dry.stderr and target.with_name("metrics.json.invalid").exists()
    workflow.snakemake("results/tables/t.md")
    assert json.loads(target.read_text())["status"] == "ok"  # ran again, and the table was made from it
    assert "| 1 | ok" in workflow.path("results/tables/t.all.md").read_text()


def test_a_job_run_remotely_runs_its_cell_and_reads_no_other_result(workflow):
    # What a SLURM job runs (its own Snakemake, --mode remote, one target job): the Snakemake that
    # submitted it judged every result; this one only runs its cell, in its allocation's time.
    t = tiny_study(strategy="single")
    t["axes"] = {"micro_batch": [1, 2]}
    workflow.write_config({"studies": {"t": t}})
    workflow.snakemake("-n", "results/tables/t.md")  # the submitting Snakemake's plan (it writes the stamp)
    other = workflow.path("results/runs/t/micro_batch~2/metrics.json")
    other.parent.mkdir(parents=True)
    other.write_text('{"status": "ok"}')  # not a result: a plan would set it aside
    workflow.snakemake("--target-jobs", "train_cell:study=t,cell=micro_batch~1",
                       "--allowed-rules", "train_cell",
                       "--force", "--nolock", "--mode", "remote", "--jobs", "1")
    assert (json.loads(workflow.path("results/runs/t/micro_batch~1/metrics.json").read_text())["status"]
            == "ok")
    assert other.read_text() == '{"status": "ok"}' and not other.with_name("metrics.json.invalid").exists()
    dry = workflow.snakemake("-n", "results/tables/t.md")  # the next plan does
    assert "is not a valid result" in dry.stderr and other.with_name("metrics.json.invalid").exists()


def test_lint_reports_nothing(workflow):
    workflow.write_config((REPO / "config.yaml").read_text())
    result = workflow.snakemake("--lint")
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


@pytest.mark.slow
def test_the_default_study_runs_on_a_cpu_machine_and_a_second_run_does_nothing(smoke_run_locally):
    workflow, seconds = smoke_run_locally
    print(f"smoke study, local: {seconds:.1f} s")
    smoke = load_config(PROJECT_CONFIG).study("smoke")
    for cell in smoke.cells:
        doc = json.loads(workflow.path(cell.target).read_text())
        assert doc["status"] == "ok", (cell.cell_id, doc["reason"])
        # each rank had its cpus_per_rank threads, not the job's threads Snakemake exported (2 here)
        threads = doc["provenance"]["environment"]["OMP_NUM_THREADS"]
        assert threads == str(cell.execution["cpus_per_rank"]), (cell.cell_id, threads)
        # every cell at its framework's best practice (tuning: best): Python's collector every 50 steps
        assert doc["metrics"]["timing"]["gc"]["every"] == 50, cell.cell_id
        if cell.params.strategy == "ddp":  # and DDP's 100 MiB buckets, the gradients in them
            ddp = json.loads(workflow.path(cell.target).with_name("torch_config.json").read_text())
            assert ddp["DistributedDataParallel"]["bucket_cap_mb"] == 100
            assert ddp["DistributedDataParallel"]["gradient_as_bucket_view"] is True
    for name in ("tables/smoke.md", "tables/smoke.all.md", "tables/smoke.csv", "plots/smoke/memory.png",
                 "plots/smoke/throughput.png"):
        assert workflow.path(f"results/{name}").stat().st_size > 0
    table = workflow.path("results/tables/smoke.md").read_text()
    # CPU timing may be noisy
    assert len(re.findall(r"\| ok(, noisy \([^)]*\))? \|", table)) == len(smoke.cells)
    result = workflow.snakemake("-n", env={"TRAINBENCH_FAKE_GPUS": "0"})
    assert "Nothing to be done" in result.stdout + result.stderr


def test_the_slurm_profile_dry_runs_multi_node_requests_without_a_cluster(workflow):
    workflow.write_config((REPO / "config.yaml").read_text())
    planned = load_config(PROJECT_CONFIG).study("zero3_pipeline").planned  # the full-size grid
    result = workflow.snakemake("--profile", "profiles/slurm", "-n", *(c.target for c in planned))
    lines = [line for line in result.stdout.splitlines() if line.strip().startswith("resources:")]
    # AutoTP's 75 per scale and the ZeRO-0 row, and the same 75 per scale with sharded tensor parallelism
    assert sum("gres=gpu:8, nodes=8, tasks=8," in line for line in lines) == 76 + 75
    assert sum("gres=gpu:8, nodes=16, tasks=16," in line for line in lines) == 75 + 75
    assert all("mpi=srun" in line for line in lines if "nodes=8," in line or "nodes=16," in line)
