"""Tools around the pipeline: the offline wheelhouse (built where an index is reachable, installed
where none is), and the lists of cells run on the GPU hosts with the results they published."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import REPO


def test_a_wheelhouse_installs_without_an_index_including_source_only_packages(tmp_path):
    # connection_pool (a snakemake dependency) is published as source only, hjson as a wheel
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("connection_pool==0.0.3\nhjson==3.1.0\n")
    house = tmp_path / "wheels"
    subprocess.run([sys.executable, str(REPO / "tools/build_wheelhouse.py"), str(house), "--python", "3.12",
                    "--requirements", str(requirements), "--no-project"], check=True, timeout=600)
    assert sorted(p.name for p in house.iterdir()) == ["connection_pool-0.0.3-py3-none-any.whl",
                                                       "hjson-3.1.0-py3-none-any.whl"]
    venv = tmp_path / "offline"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                    str(house), "-r", str(requirements)], check=True, timeout=300,
                   env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"})
    subprocess.run([str(venv / "bin/python"), "-c", "import connection_pool, hjson"], check=True)


def test_gpu_run_lists_name_cells_of_the_config():
    from trainbench.study.config import load_config
    from trainbench.study.grid import search_target

    config = load_config(REPO / "config.yaml")
    targets = {c.target for s in config.studies.values() for c in s.cells}
    targets |= {search_target(s.name, c.cell_id) for s in config.studies.values() for c in s.cells}
    lists = sorted((REPO / "tools/gpu-runs").glob("*.txt"))
    assert lists
    for path in lists:
        named = [line.split("#")[0].strip() for line in path.read_text().splitlines()]
        unknown = [t for t in named if t and t not in targets]
        assert not unknown, f"{path.name} names no cell of config.yaml: {unknown[:2]}"


@pytest.mark.parametrize("study", ["gpt2_zero", "lightning", "llama", "megatron", "zero3_pipeline"])
def test_published_studies_have_a_current_result_for_every_measured_cell(study):
    """A fresh clone's `snakemake results/tables/<study>.md` runs nothing on a machine without GPUs."""
    from trainbench.study.config import load_config
    from trainbench.reporting.freshness import check_result

    cells = [c for c in load_config(REPO / "config.yaml").study(study).cells if c.measured]
    missing = [c.cell_id for c in cells if not (REPO / c.target).exists()]
    stale = [c.cell_id for c in cells
             if (REPO / c.target).exists() and check_result(REPO / c.target).params_hash != c.params_hash]
    assert not missing and not stale, (missing[:3], stale[:3])


@pytest.mark.parametrize("study", ["megatron"])
def test_published_searches_are_complete_and_current(study):
    """Every search a study's table reports is on disk with the probes its config asks for, each run
    with the parameters the config gives it now: a fresh clone's table runs no probe."""
    from trainbench.predict.batch_search import bounds_for, walk
    from trainbench.study.config import load_config
    from trainbench.study.grid import probe_cell
    from trainbench.execute.results import read_json

    config = load_config(REPO / "config.yaml").study(study)
    assert config.searched
    for cell_id in config.searched:
        cell, directory = config.cell(cell_id), REPO / "results/search" / study / cell_id

        def status_of(batch):
            doc = read_json(directory / f"mb~{batch}/metrics.json")
            assert doc["params_hash"] == probe_cell(config, cell, batch).params_hash, (cell_id, batch)
            return doc["status"]

        probes = walk(status_of, *bounds_for(config.search, cell.params), config.search["tolerance"])
        found = read_json(directory / "max_batch.json")
        assert sorted(p["micro_batch"] for p in found["probes"]) == sorted(probes)


def test_a_published_cells_parameters_come_back_whole_or_as_one_emulated_rank():
    # tools/gpu-runs/cell_params.py: what fsdp-emulated.sh and shared-host.sh hand `trainbench run-cell`
    cell = "strategy~fsdp__model~gpt2-350m__gpus~2__micro_batch~16"
    published = json.loads((REPO / "results/runs/baseline" / cell / "metrics.json").read_text())["params"]

    def params(*extra):
        done = subprocess.run([sys.executable, "tools/gpu-runs/cell_params.py", "baseline", cell, *extra],
                              cwd=REPO, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    whole, rank = params(), params("--emulate-rank", "1")
    assert whole["gpus"] == published["gpus"] == 2 and whole["model"] == "gpt2-350m"
    assert not whole.get("emulate")  # the canonical form leaves defaults out
    assert rank["emulate"] is True and rank["emulate_rank"] == 1
    assert {k: v for k, v in rank.items() if k not in ("emulate", "emulate_rank")} == {
        k: v for k, v in whole.items() if k not in ("emulate", "emulate_rank")}


def test_reruns_are_planned_into_commands_that_end_within_the_limit():
    # tools/gpu-runs/plan_reruns.py: megatron's 4-GPU cells, their first run of 25 fixed steps in
    # results/runs, 22 of them run again in 15 s windows beside it (results/bench/rerun/megatron-3240cdf)
    def plan(*extra):
        done = subprocess.run([sys.executable, "tools/gpu-runs/plan_reruns.py", "megatron/*gpus~4__*",
                               "--commit", "abc1234", *extra], cwd=REPO, capture_output=True, text=True,
                              check=True)
        commands = [line for line in done.stdout.splitlines() if line.startswith("TRAINBENCH_GIT_COMMIT")]
        cells = re.findall(r"#\s+(\d+) s  (\S+)  \((.*)\)", done.stdout)
        return commands, {key: (float(seconds), basis) for seconds, key, basis in cells}

    commands, cells = plan("--limit", "300")
    assert len(cells) == 28 and all(len(line) <= 2000 for line in commands)
    named = [re.findall(r"'([^']+)'", line) for line in commands]
    assert sorted(key for line in named for key in line) == sorted(cells)  # each cell once
    for line in named:
        assert 15 + sum(cells[key][0] for key in line) <= 300 or len(line) == 1
    # a first run of 25 steps of 3.77 s, its CPU optimizer at 4 threads a rank (before b222dfd), where
    # the study's ranks get 8 now: the step scaled by the time model's ratio of the two (about 0.7), 5
    # steps a window, six windows at least, past the 15 s cap
    slow = cells["megatron/strategy~zero3__model~gpt-2.5b__gpus~4__tp~4__offload_optimizer~true"]
    ratio = float(re.search(r"its step at 4 threads x ([\d.]+), the time model's ratio at 8$", slow[1])[1])
    assert 0.5 < ratio < 0.9
    step = float(re.search(r"the longer of 6 windows of 5 x ([\d.]+) s and the 15 s cap", slow[1])[1])
    assert step == pytest.approx(3.77 * ratio, abs=0.02)
    assert 100 < slow[0] < 150
    # a cell without a CPU optimizer: the same step at any threads, so no note
    fast = cells["megatron/strategy~zero1__model~gpt-2.5b__gpus~4__tp~1__offload_optimizer~false"]
    assert "threads" not in fast[1]
    # a rerun timed as the study times now stands for itself
    _, cells = plan("--also", "results/bench/rerun/megatron-3240cdf/runs")
    rerun = json.loads((REPO / "results/bench/rerun/megatron-3240cdf/runs/megatron/strategy~zero3__model~"
                        "gpt-2.5b__gpus~4__tp~4__offload_optimizer~true/metrics.json").read_text())
    assert cells["megatron/strategy~zero3__model~gpt-2.5b__gpus~4__tp~4__offload_optimizer~true"] == (
        round(rerun["metrics"]["wall_time_s"]), "its last run, timed as now")


def test_reruns_for_energy_are_the_real_gpu_cells_that_trained_without_it():
    # --without-energy (issue 33's reruns): megatron's published tree holds 4-GPU first runs without
    # energy (their reruns are kept aside), emulated 8-GPU ranks (whose energy is one GPU's and is not
    # published) and OOM cells (nothing to measure): only the first kind is planned
    def plan(*extra):
        return subprocess.run([sys.executable, "tools/gpu-runs/plan_reruns.py", "megatron/*",
                               "--without-energy", "--commit", "abc1234", *extra], cwd=REPO,
                              capture_output=True, text=True)

    done = plan()
    assert done.returncode == 0, done.stderr
    planned = re.findall(r"#\s+\d+ s  megatron/(\S+)  \(", done.stdout)
    assert planned and len(planned) == len(set(planned))
    for cell in planned:
        doc = json.loads((REPO / "results/runs/megatron" / cell / "metrics.json").read_text())
        assert doc["status"] == "ok" and doc["metrics"].get("energy_j_per_step") is None
        assert not doc["params"].get("emulate") and "emulate~true" not in cell
    emulated = [p for p in (REPO / "results/runs/megatron").glob("*emulate~true*/metrics.json")
                if json.loads(p.read_text())["metrics"].get("energy_j_per_step") is None]
    assert emulated  # there were emulated cells to leave out
    # the reruns kept aside have the energy: nothing left to run
    aside = [arg for tree in sorted((REPO / "results/bench/rerun").glob("megatron-*/runs"))
             for arg in ("--also", str(tree.relative_to(REPO)))]
    done = plan(*aside)
    assert done.returncode == 0 and "nothing to run" in done.stdout and "energy-rerun.sh" not in done.stdout
