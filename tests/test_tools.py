"""Tools around the pipeline: the offline wheelhouse (built where an index is reachable, installed
where none is), the GPU host's run of a targets file; and the published results, current for the
configs that define them (results/ for the benchmarks, validation/results/ for the validation workspace)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import (CPU_MACHINE, PROJECT_CONFIG, REPO, Workflow, loaded_in, project_files,
                      shell_environment, tiny_study)


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


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "tools").glob("*.sh")))
def test_every_tool_script_parses(script):
    subprocess.run(["bash", "-n", str(REPO / "tools" / script)], check=True)


def test_gpu_host_run_runs_a_targets_file_on_cpu_from_an_empty_wheelhouse(tmp_path):
    """tools/gpu-host-run.sh end to end on a machine without GPUs, in a copy of the checkout: an empty
    wheelhouse adds nothing (the environment has the stack, trainbench imports from the checkout),
    the targets file's cell runs through Snakemake, and the tarball holds its result."""
    from trainbench.study.config import load_config

    flow = Workflow(tmp_path / "host")
    for name in [*project_files("tools"), *project_files("src"), "pyproject.toml"]:
        (flow.root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, flow.root / name)
    flow.write_config({"studies": {"t": {**tiny_study(strategy="single"), "include": [{}]}}})
    target = load_config(flow.path("config.yaml")).study("t").cells[0].target
    (tmp_path / "targets.txt").write_text(f"# the one cell\n{target}\n")
    (tmp_path / "wheels").mkdir()
    tarball = tmp_path / "out.tgz"
    env = {**shell_environment(), **CPU_MACHINE, "PYTHONPATH": str(flow.path("src"))}
    done = subprocess.run(["bash", str(flow.path("tools/gpu-host-run.sh")), str(tmp_path / "wheels"), "300",
                           str(tarball), str(tmp_path / "targets.txt")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "nothing to add" in out and "imports from this checkout already" in out, out[-4000:]
    assert "no GPUs found" in out and "1 targets" in out, out[-4000:]
    with tarfile.open(tarball) as packed:
        assert target in packed.getnames(), packed.getnames()
    assert "packed 1 metrics.json files" in out
    assert not os.path.exists(flow.path("src/trainbench.egg-info"))  # nothing was installed


@pytest.mark.parametrize("workspace", [".", "validation"])
def test_published_studies_have_a_current_result_for_every_measured_cell(workspace):
    """A fresh clone's `snakemake results/tables/<study>.md` (in the validation workspace, `snakemake -d
    validation ...`) runs nothing on a machine without GPUs: every measured cell of every GPU study has
    its result, made with the parameters the config gives it now."""
    from trainbench.study.config import load_config
    from trainbench.reporting.freshness import check_result

    root = REPO / workspace
    config = load_config(loaded_in(root) / "config.yaml")
    # smoke: every machine makes its own; baseline: each machine runs the cells of the GPUs it has
    studies = [s for s in config.studies.values() if s.name not in ("smoke", "baseline")]
    assert len(studies) >= 6
    cells = [(s.name, c) for s in studies for c in s.cells if c.measured]
    missing = [f"{s}/{c.cell_id}" for s, c in cells if not (root / c.target).exists()]
    stale = [f"{s}/{c.cell_id}" for s, c in cells
             if (root / c.target).exists() and check_result(root / c.target).params_hash != c.params_hash]
    assert not missing and not stale, (missing[:3], stale[:3])


@pytest.mark.parametrize("study", ["megatron"])
def test_published_searches_are_complete_and_current(study):
    """Every search a study's table reports is on disk with the probes its config asks for, each run
    with the parameters the config gives it now: a fresh clone's table runs no probe."""
    from trainbench.predict.batch_search import bounds_for, walk
    from trainbench.study.config import load_config
    from trainbench.study.grid import probe_cell
    from trainbench.contract.result import read_json
    from trainbench.workflow import Workflow

    config = load_config(PROJECT_CONFIG).study(study)
    assert config.searched
    for cell_id in config.searched:
        cell, directory = config.cell(cell_id), REPO / "results/search" / study / cell_id

        def status_of(batch):
            doc = read_json(directory / f"mb~{batch}/metrics.json")
            assert doc["params_hash"] == probe_cell(config, cell, batch).params_hash, (cell_id, batch)
            return doc["status"]

        # as the workflow walks it: the probes on disk first, then what the model's bounds ask
        probes = walk(status_of, *bounds_for(config.search, cell.params), config.search["tolerance"],
                      known=Workflow.probes_on_disk(config, cell, REPO))
        found = read_json(directory / "max_batch.json")
        assert sorted(p["micro_batch"] for p in found["probes"]) == sorted(probes)


