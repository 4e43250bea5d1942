"""Reference figures a study declares (reporting/references.py): checked under its table and by
`trainbench references`, a gate."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from trainbench.cli import main
from trainbench.errors import ConfigError
from trainbench.reporting.documents import read_cells
from trainbench.reporting.references import NOT_MEASURED, OTHER_GPU, OUTSIDE, WITHIN, check, markdown
from trainbench.reporting.tables import study_markdown
from trainbench.workflow import load_checked

from conftest import REPO, loaded_in, published_results

BASELINE = sorted((REPO / "results/runs/baseline").glob("*/metrics.json"))


def test_each_referenced_cell_is_within_outside_or_not_measured():
    docs = read_cells(BASELINE)
    small = next(d for d in docs
                 if d["params"]["model"] == "gpt2-124m" and d["params"]["strategy"] == "single")
    measured = small["metrics"]["samples_per_s"]
    one_gpu = {"model": "gpt2-124m", "strategy": "single"}
    references = [{"cells": one_gpu, "metric": "samples_per_s", "value": measured * 1.03},
                  {"cells": one_gpu, "metric": "samples_per_s", "value": measured * 1.10,
                   "lower": -0.05, "upper": 0.5}]
    first, second = check(references, docs)
    assert first.verdict == WITHIN and first.deviation == pytest.approx(1 / 1.03 - 1)
    assert second.verdict == OUTSIDE and (second.lower, second.upper) == (-0.05, 0.5)
    oom = {**small, "status": "oom"}
    assert check(references[:1], [oom])[0].verdict == NOT_MEASURED
    text = "\n".join(markdown([first, second]))
    assert "## References" in text and "1 within, 1 outside" in text
    page = study_markdown("baseline", "d", docs, id_keys=["model"], references=references)
    assert "## References" in page and "outside" in page


def test_a_reference_naming_what_does_not_exist_is_refused_by_key():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["studies"]["baseline"]["references"] = [
        {"cells": {"model": "gpt2-124m"}, "metric": "samples_per_sec", "value": 500},
        {"cells": {"model": "gpt2-9b"}, "metric": "mfu", "value": 0.4, "lower": 0.1, "upper": -0.1}]
    with pytest.raises(ConfigError) as error:
        load_checked(config)
    text = str(error.value)
    assert "studies.baseline.references[0].metric: 'samples_per_sec' is not a measured table column " \
           "(did you mean 'samples_per_s'?)" in text
    assert "studies.baseline.references[1].cells" in text and "lower (0.1) is above upper (-0.1)" in text


def test_trainbench_references_is_a_gate(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "results/runs/baseline", tmp_path / "results/runs/baseline")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    docs = read_cells(BASELINE)
    value = next(d for d in docs if d["params"]["model"] == "gpt2-350m"
                 and d["params"]["strategy"] == "single")["metrics"]["step_time_s"] * 1e3
    config["studies"]["baseline"]["references"] = [
        {"cells": {"model": "gpt2-350m", "strategy": "single"}, "metric": "step_time_ms", "value": value}]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["references", "baseline"]) == 0
    assert " within |" in capsys.readouterr().out
    config["studies"]["baseline"]["references"][0]["value"] = value / 1.2  # the cell got 20% slower
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["references", "baseline"]) == 1
    assert " outside |" in capsys.readouterr().out


def test_a_reference_for_one_gpu_does_not_judge_a_cell_run_on_another(tmp_path, monkeypatch, capsys):
    """The baseline's GPT-2 350M cell, published from an H200, rerun on an H100 20% slower: against a
    reference that holds for H200s it is neither within nor outside, but has no reference for its GPU;
    a reference that names no GPU judges it as before."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(REPO / "results/runs/baseline", tmp_path / "results/runs/baseline")
    cell = next((tmp_path / "results/runs/baseline").glob("strategy~single__model~gpt2-350m*/metrics.json"))
    doc = json.loads(cell.read_text())
    assert doc["provenance"]["gpu_name"] == "NVIDIA H200"
    value = doc["metrics"]["step_time_s"] * 1e3
    doc["provenance"]["gpu_name"] = "NVIDIA H100 80GB HBM3"
    doc["metrics"]["step_time_s"] *= 1.2
    cell.write_text(json.dumps(doc))
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    on_h200 = {"cells": {"model": "gpt2-350m", "strategy": "single"}, "metric": "step_time_ms",
               "value": value, "gpu": "h200"}
    config["studies"]["baseline"]["references"] = [on_h200]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    [judged] = check([on_h200], read_cells([cell]))
    assert judged.verdict == OTHER_GPU and judged.deviation is None and judged.measured is not None
    assert judged.verdict_text == "no reference for H100 (references hold for H200)"
    assert main(["references", "baseline"]) == 0  # not outside: no gate trips
    out = capsys.readouterr().out
    assert "| no reference for H100 (references hold for H200) |" in out and " outside |" not in out
    assert "1 no reference for its GPU" in "\n".join(markdown([judged]))
    any_gpu = {key: v for key, v in on_h200.items() if key != "gpu"}
    config["studies"]["baseline"]["references"] = [any_gpu]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["references", "baseline"]) == 1
    assert " outside |" in capsys.readouterr().out


def test_a_reference_naming_an_unknown_gpu_is_refused_by_key():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["studies"]["baseline"]["references"][0]["gpu"] = "H200-SXM"
    with pytest.raises(ConfigError) as error:
        load_checked(config)
    text = str(error.value)
    assert "studies.baseline.references[0].gpu: 'H200-SXM' is not allowed" in text
    assert "'h100', 'h200'" in text


def test_every_published_study_declares_references_its_published_cells_meet():
    """A rerun of any published study is checked against what was published: each declares reference
    figures for the GPU they were measured on, and the published cells themselves are within them (and
    every reference finds its cell)."""
    published = sorted({(root, p.parent.parent.name) for root in (REPO, REPO / "validation")
                        for p in published_results(root)})
    assert len(published) >= 18
    configs = {root: load_checked(loaded_in(root) / "config.yaml") for root, _ in published}
    for root, name in published:
        study = configs[root].study(name)
        assert study.references, f"studies.{name} declares no references"
        assert all(r.get("gpu") for r in study.references), f"studies.{name}: a reference names no GPU"
        docs = read_cells(sorted((root / "results/runs" / name).glob("*/metrics.json")))
        checks = check(study.references, docs)
        assert {c.index for c in checks} == set(range(1, len(study.references) + 1)), name
        assert all(c.verdict == WITHIN for c in checks), [(name, c.cell_id, c.deviation) for c in checks]
