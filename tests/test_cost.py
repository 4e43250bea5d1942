"""Device time of a study's results and the timed steps' share of it (trainbench cost)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from trainbench.study.config import load_config
from trainbench.reporting.progress import study_cost
from trainbench.contract.result import PHASES

from conftest import PROJECT_CONFIG, REPO


def published(study: str) -> list[dict]:
    return [json.loads(p.read_text())
            for p in sorted((REPO / "results" / "runs" / study).glob("*/metrics.json"))]


def test_baseline_cost_is_its_cells_wall_times_and_phases():
    cost = study_cost(load_config(PROJECT_CONFIG).study("baseline"), REPO)
    docs = [d for d in published("baseline") if d["metrics"]["wall_time_s"]]
    assert cost.cells.runs == len(docs) == cost.cells.with_phases  # made since phases are recorded
    # a cell holds its GPUs for its wall time (one GPU, and DDP and FSDP on two and four)
    assert {d["params"]["gpus"] for d in docs} == {1, 2, 4}
    assert cost.cells.device_s == pytest.approx(sum(d["metrics"]["wall_time_s"] * d["params"]["gpus"]
                                                    for d in docs))
    timed = sum(d["metrics"]["phases_s"]["timed"] * d["params"]["gpus"] for d in docs)
    assert cost.cells.timed_share == pytest.approx(timed / cost.cells.device_s)
    # every phase (the cells ran again after DeepSpeed's op builds and profiled steps became phases)
    assert set(cost.cells.phase_device_s) == {name for name, _, _ in PHASES}
    assert sum(cost.cells.phase_device_s.values()) == pytest.approx(cost.cells.device_s, rel=0.01)


def test_older_results_count_their_timed_steps_and_failed_runs_cost_time_untimed(tmp_path):
    """Cells from before phases were recorded: their timed time is their windows' steps; megatron's
    OOM probes held 4 GPUs for their wall time and timed nothing."""
    config = load_config(PROJECT_CONFIG)
    runs = tmp_path / "results" / "runs" / "gpt2_zero"
    shutil.copytree(REPO / "results" / "runs" / "gpt2_zero", runs, ignore=shutil.ignore_patterns("profile"))
    ok = []
    for path in sorted(runs.glob("*/metrics.json")):  # gpt2_zero's cells as runs made before phases
        doc = json.loads(path.read_text())
        doc["metrics"].pop("phases_s", None)
        path.write_text(json.dumps(doc))
        ok += [doc] if doc["status"] == "ok" else []
    zero = study_cost(config.study("gpt2_zero"), tmp_path)
    assert zero.cells.with_phases == 0 and len(zero.cells.cell_shares) == len(ok)
    timed = [sum(d["metrics"]["step_times_s"]) * d["metrics"]["steps_per_window"] for d in ok]
    walls = [d["metrics"]["wall_time_s"] for d in ok]
    assert sorted(zero.cells.cell_shares) == pytest.approx(sorted(t / w for t, w in zip(timed, walls)))
    assert zero.cells.timed_share == pytest.approx(sum(timed) / sum(walls))  # every cell on 4 GPUs
    megatron = study_cost(config.study("megatron"), REPO)
    probes = [json.loads(p.read_text())
              for p in (REPO / "results" / "search" / "megatron").glob("*/*/metrics.json")]
    ooms = [d for d in probes if d["status"] == "oom" and d["metrics"]["wall_time_s"]]
    assert ooms and megatron.probes.runs == sum(1 for d in probes if d["metrics"]["wall_time_s"])
    untimed = sum(d["metrics"]["wall_time_s"] * d["params"]["gpus"] for d in ooms)
    assert megatron.probes.device_s - megatron.probes.timed_device_s >= untimed


def test_cost_command_reports_every_study_and_refuses_unknown_ones(tmp_path):
    root = tmp_path / "clone"
    shutil.copytree(REPO / "results" / "runs" / "baseline", root / "results" / "runs" / "baseline")
    # the cells as runs made before DeepSpeed's op builds were a phase: none recorded
    for path in (root / "results" / "runs" / "baseline").glob("*/metrics.json"):
        doc = json.loads(path.read_text())
        doc["metrics"]["wall_time_s"] -= doc["metrics"]["phases_s"].pop("builds")
        path.write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, "-m", "trainbench", "cost", "baseline", "smoke",
                          "--root", str(root), "--config", str(PROJECT_CONFIG)],
                         capture_output=True, text=True, check=True)
    lines = run.stdout.splitlines()
    assert lines[0].split()[:3] == ["study", "runs", "device-hours"]
    baseline = next(line for line in lines if line.startswith("baseline"))
    assert baseline.split()[1] == str(len(published("baseline"))) and "GPU" in baseline
    assert next(line for line in lines if line.startswith("smoke")).split()[1] == "0"  # nothing ran there
    assert any(line.strip().startswith("baseline: launch") for line in lines)
    phases = next(line for line in lines if line.strip().startswith("baseline: launch"))
    assert "setup" in phases and "builds" not in phases  # a phase its runs did not record is not one of 0%
    bad = subprocess.run([sys.executable, "-m", "trainbench", "cost", "nosuch", "--config",
                          str(PROJECT_CONFIG)], capture_output=True, text=True)
    assert bad.returncode == 2 and "nosuch" in bad.stderr and not bad.stdout


def test_deepspeed_op_builds_are_told_apart_as_paid_once_per_environment():
    # the first offloaded cell of a fresh environment compiles DeepSpeed's CPU Adam: its own phase, and
    # the timed share without it is what the study costs run again there
    from trainbench.contract.result import Result
    from trainbench.reporting.progress import Cost, StudyCost, report

    [first, second] = [json.loads(json.dumps(d)) for d in published("baseline") if d["params"]["gpus"] == 1]
    for doc in (first, second):  # no builds recorded, then 60 s of them in the first
        doc["metrics"]["wall_time_s"] -= doc["metrics"]["phases_s"].pop("builds", 0.0)
    first["metrics"]["phases_s"]["builds"] = 60.0
    first["metrics"]["wall_time_s"] += 60.0
    cost = Cost()
    for doc in (first, second):
        cost.add(Result.from_document(doc))
    timed = sum(d["metrics"]["phases_s"]["timed"] for d in (first, second))
    assert cost.timed_share == pytest.approx(timed / cost.device_s)
    assert cost.timed_share_ops_built == pytest.approx(timed / (cost.device_s - 60.0))
    text = report([StudyCost("s", "GPU", cost, Cost(), [])])
    assert (f"{60 / 3600:.3f} device-hours; the timed share without them "
            f"{cost.timed_share_ops_built:.2f}") in text
    assert "op builds (compiled once per environment" in text
    assert "op builds" not in report([StudyCost("s", "GPU", study_cost(load_config(
        PROJECT_CONFIG).study("baseline"), REPO).cells, Cost(), [])])  # none recorded, none reported


def test_the_slurm_plugins_efficiency_report_is_summarised_by_study(tmp_path, capsys):
    """The report as Snakemake's SLURM plugin writes it (its own parser, over sacct lines of two jobs:
    the job, its batch step and the step the cell ran in), matched to the cells whose results the jobs
    wrote."""
    from snakemake_executor_plugin_slurm.efficiency_report import parse_sacct_data

    from trainbench.cli import main
    from trainbench.reporting.progress import EFFICIENCY_DIR

    config = load_config(REPO / "validation/config.yaml")
    validation = ("--config", str(REPO / "validation/config.yaml"))  # the workspace's studies
    cells = config.study("holdout_mix").cells[:2]
    for job, cell in zip(("7001", "7002"), cells):
        doc = json.loads((REPO / "validation" / cell.target).read_text())
        doc["provenance"]["slurm_job_id"] = job
        (tmp_path / cell.target).parent.mkdir(parents=True)
        (tmp_path / cell.target).write_text(json.dumps(doc))
    sacct = [  # JobID|JobName|Comment|Elapsed|TotalCPU|NNodes|NCPUS|MaxRSS|ReqMem
        "7001|run|rule_train_cell|00:01:40||1|4||16000M", "7001.batch|batch||00:01:40|00:00.5|1|4|90M|",
        "7001.0|python3|rule_train_cell|00:01:40|05:20.000|1|4|8000M|",  # 320 of 400 CPU-s, half the memory
        "7002|run|rule_train_cell|00:01:00||1|4||16000M",
        "7002.0|python3|rule_train_cell|00:01:00|01:00.000|1|4|4000M|",  # 60 of 240 CPU-s
        "7003|run|rule_study_table|00:00:05||1|1||1000M",  # another rule's job: no cell's
        "7003.0|python3|rule_study_table|00:00:05|00:04.000|1|1|100M|"]
    report = tmp_path / EFFICIENCY_DIR / "efficiency_report_x.csv"
    report.parent.mkdir(parents=True)
    parse_sacct_data(sacct, 0.8, "x", logger=type("Quiet", (), {"warning": print})()).to_csv(report)

    assert main(["cost", "holdout_mix", *validation, "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"SLURM efficiency ({report}, 3 jobs)" in out
    # CPU efficiency 80% and 25%, median 52%; memory 50% and 25% of the 16 GB asked for
    assert ("holdout_mix: 2 cells; CPU efficiency median 52% (lowest 25%, 1 under 50%); memory used "
            "median 38% of the request (highest 50%)") in out
    assert main(["cost", "holdout_mix", *validation, "--root", str(tmp_path), "--slurm-efficiency",
                 str(tmp_path / "missing.csv")]) == 1
    other = tmp_path / "other.csv"
    other.write_text("JobID,Elapsed\n7001,100\n")
    assert main(["cost", "holdout_mix", *validation, "--root", str(tmp_path), "--slurm-efficiency",
                 str(other)]) == 1
    assert "not a SLURM efficiency report (no Elapsed_sec" in capsys.readouterr().err
