"""A cell's result as a type: published files read as they were written (older shapes migrated, each
step named), nothing recomputed in silence, and no stage reading a result document by its keys."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import trainbench
from trainbench.contract.result import (INTERVAL_KEYS, PER_STEP_METHOD, SCHEMA_VERSION, InvalidResult,
                                        read_json, read_result)
from trainbench.study.params import CellParams

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(trainbench.__file__).parent
PUBLISHED = sorted([*REPO.glob("results/runs/*/*/metrics.json"),
                    *REPO.glob("validation/results/runs/*/*/metrics.json")])
# A result from before timing windows (one time per step, no intervals) and before the optional
# parameters added since: the oldest shape published.
BEFORE_WINDOWS = (REPO / "results/runs/megatron/strategy~zero3__model~gpt-2.5b__gpus~4__tp~1__"
                  "offload_optimizer~true/metrics.json")


def test_every_published_result_is_of_the_schema_this_code_reads():
    assert len(PUBLISHED) > 400
    assert {read_json(p)["schema"] for p in PUBLISHED} == {SCHEMA_VERSION}


def test_every_published_result_reads_as_its_file_holds_it():
    """Reading changes nothing a file holds: the migration only adds (parameters' defaults, null
    intervals), and the document a Result gives back is the file's with those additions."""
    migrated = {}
    for path in PUBLISHED:
        raw, result = read_json(path), read_result(path)
        added = {k: None for k in INTERVAL_KEYS if k not in raw["metrics"]}
        assert result.as_document() == {**raw, "params": {**result.params, **raw["params"]},
                                        "metrics": {**raw["metrics"], **added}}, path
        for name in result.migrated:
            migrated[name] = migrated.get(name, 0) + 1
    # most published files were written before a parameter added since; four before timing windows
    assert migrated["intervals"] == 4 and migrated["optional parameters"] > 200


def test_a_result_from_before_timing_windows_is_migrated_and_keeps_its_figures():
    raw = read_json(BEFORE_WINDOWS)
    assert "step_time_s_ci" not in raw["metrics"] and "noisy" not in raw["metrics"]  # the old shape
    result = read_result(BEFORE_WINDOWS)
    assert result.migrated == ("optional parameters", "intervals")
    # every figure the file holds is read as it holds it; those it lacks are null
    assert {k: result.metrics[k] for k in raw["metrics"]} == raw["metrics"]
    assert all(result.metrics[k] is None for k in INTERVAL_KEYS)
    # parameters added after it was written take their defaults; those it has stay
    assert set(result.params) > set(raw["params"])
    assert {k: result.params[k] for k in raw["params"]} == raw["params"]
    assert result.cell == CellParams.from_dict(raw["params"])
    # the intervals its per-step times give are a field of their own, saying how they were timed
    derived = result.per_step_figures
    assert derived["timing"] == {"method": PER_STEP_METHOD} and derived["steps_per_window"] == 1
    low, high = derived["step_time_s_ci"]
    assert low < raw["metrics"]["step_time_s"] < high
    assert derived["windows"] == len(raw["metrics"]["step_times_s"])


def test_a_current_result_takes_no_migration_and_reads_back_as_written():
    current = [p for p in PUBLISHED if "step_time_s_ci" in read_json(p)["metrics"]
               and read_json(p).get("emulation") and read_json(p).get("sanity") is not None]
    for path in current[:5]:
        result = read_result(path)
        raw = read_json(path)
        assert result.per_step_figures is None
        assert result.as_document() == {**raw, "params": result.params}
        assert result.metrics.step_time_s == raw["metrics"]["step_time_s"]
        assert result.emulation.world_size == raw["emulation"]["world_size"]
    assert current


def test_an_emulated_result_holds_the_memory_its_file_holds():
    """Its GPU 'used' as the model completed it when it ran; the model's completion of now is
    memory_model.completed_gpu_mem_used_mib, a figure of its own."""
    from trainbench.predict.memory_model import completed_gpu_mem_used_mib
    from trainbench.workflow import load_checked

    differs = 0
    for workspace in (REPO, REPO / "validation"):
        load_checked(workspace / "config.yaml")  # its own models, which the completion counts
        for path in sorted(workspace.glob("results/runs/*/*/metrics.json")):
            raw = read_json(path)
            if not (raw.get("emulation") or {}).get("measured", {}).get("gpu_mem_used_mib"):
                continue
            result = read_result(path)
            assert result.metrics.gpu_mem_used_mib == raw["metrics"]["gpu_mem_used_mib"]
            now = completed_gpu_mem_used_mib(result)
            differs += now is not None and now[0] != raw["metrics"]["gpu_mem_used_mib"]
    assert differs  # published results written under an older model: reading them changes nothing


def test_a_file_of_another_schema_version_or_shape_is_refused(tmp_path):
    doc = read_json(PUBLISHED[0])
    for broken, why in (({**doc, "schema": 0}, "schema 0 is not 1"), ({**doc, "status": "fine"}, "status"),
                        ({k: v for k, v in doc.items() if k != "metrics"}, "missing key 'metrics'")):
        path = tmp_path / "metrics.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(InvalidResult, match=why):
            read_result(path)


def test_a_result_section_answers_its_declared_keys_and_is_read_only():
    result = read_result(PUBLISHED[0])
    assert result.metrics.mfu_fp8 is None or isinstance(result.metrics.mfu_fp8, float)  # declared, optional
    with pytest.raises(AttributeError, match="declares no key"):
        result.metrics.step_time  # a misspelt metric is an error, not a None
    with pytest.raises(AttributeError, match="read-only"):
        result.metrics.step_time_s = 1.0
    with pytest.raises(KeyError, match="declares no metric"):
        result.metric("tokens_per_second")
    assert result.metric("tokens_per_s") == result.metrics.tokens_per_s


# --- no string-key read of a result document outside the contract --------------------------------

# the keys of a result document's top level that only the contract reads by name
RESULT_KEYS = {"metrics", "params", "status", "reason", "provenance", "predicted", "emulation",
               "params_hash", "device_limit", "sanity", "attempts"}
CONTRACT = PACKAGE / "contract"
# Modules that still read result documents (or documents named alike: a history line, a max_batch.json
# probe, a table row) by these keys, and how many reads each has: the list only shrinks, as modules
# move to `Result`. The count is exact, so a module moved lowers it and a new read fails.
NOT_YET_TYPED = {
    "checks/emulation.py": 2, "checks/memory.py": 11, "checks/memory_out_of_sample.py": 4,
    "checks/predictions.py": 2, "cli.py": 6, "execute/cellrun.py": 5, "execute/history.py": 1,
    "execute/profiling.py": 1, "fit.py": 14, "predict/batch_search.py": 11, "predict/memory_model.py": 4,
    "predict/time_model.py": 2, "reporting/answer.py": 45, "reporting/columns.py": 11,
    "reporting/compare.py": 15, "reporting/dataset.py": 6, "reporting/findings.py": 13,
    "reporting/plots.py": 69, "reporting/predictions.py": 11, "reporting/references.py": 4,
    "reporting/report.py": 8, "reporting/tables.py": 30, "workflow.py": 1,
}


def string_key_reads(tree: ast.AST) -> list[ast.AST]:
    """`x["metrics"]` and `x.get("metrics")` (any of RESULT_KEYS) read, not written: what a reader of a
    result document by its keys does."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Constant) and node.slice.value in RESULT_KEYS:
            found.append(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "pop") and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in RESULT_KEYS:
            found.append(node)
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def test_the_finder_sees_reads_and_leaves_writes():
    code = 'a = doc["metrics"]["mfu"]\nb = doc.get("status")\ndoc["reason"] = "x"\nc = row["name"]\n'
    assert [ast.unparse(n) for n in string_key_reads(ast.parse(code))] == ["doc['metrics']",
                                                                            "doc.get('status')"]


def test_no_module_outside_the_contract_reads_a_result_by_its_keys():
    reads = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if CONTRACT in path.parents:
            continue
        found = string_key_reads(ast.parse(path.read_text()))
        name = path.relative_to(PACKAGE).as_posix()
        if found or name in NOT_YET_TYPED:
            reads[name] = len(found)
    # training/runners/torch_native.py reads an optimizer's param groups ("params"): not a result
    reads.pop("training/runners/torch_native.py", None)
    reads.pop("execute/worker.py", None)  # cell.json's parameters, as cellrun wrote them
    assert reads == {name: n for name, n in NOT_YET_TYPED.items() if n or name in reads}


def test_an_emulated_result_of_a_model_of_ones_own_reads_without_the_config_that_defines_it(tmp_path, capsys):
    """An emulated rank's GPU memory is completed by the NCCL shortfall of its strategy, which needs
    nothing of the model: `trainbench compare` or a script reads such a result with no config loaded."""
    from trainbench.cli import main
    from trainbench.registry.models import USER_MODELS, register_user_models
    from trainbench.reporting.documents import read_reported

    runs = Path(trainbench.__file__).parents[2] / "validation/results/runs/unseen_architectures"
    path = next(runs.glob("*model~qwen2-1.5b*emulate~true/metrics.json"))
    measured = json.loads(path.read_text())["emulation"]["measured"]["gpu_mem_used_mib"]
    registered = dict(USER_MODELS)
    register_user_models({})  # as in a process that loaded no config
    try:
        doc = read_reported(path)
        for run in ("a", "b"):  # the study's results as two runs of it, compared
            (tmp_path / run).mkdir()
            (tmp_path / run / runs.name).symlink_to(runs)
        assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0, capsys.readouterr().err
    finally:
        register_user_models(registered)
    added = doc["emulation"]["modelled"]["nccl_buffers_mib"]
    assert added > 0 and doc["metrics"]["gpu_mem_used_mib"] == [round(u + added, 1) for u in measured]
