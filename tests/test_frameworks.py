"""The framework registry: a framework of one's own, registered in one place, reaches the schema, the
cell checks, `trainbench cells` and `predict`, and runs through `trainbench run-cell`, with no file
of the package touched."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FAST_TIMING

from trainbench.registry.frameworks import REGISTRY

TOY = '''
"""A toy framework: plain torch's single-process runner under another name, and two strategies."""
from trainbench.registry.frameworks import Framework, MemoryFacts, Strategy, register
from trainbench.training.runners.torch_native import TorchRunner


class ToyRunner(TorchRunner):
    pass


register(Framework(
    "toy", "a framework of the tests' own", "toy_framework:ToyRunner", ("gpt",), (
        Strategy("solo", "one process", single_rank=True),
        Strategy("someday", "not yet", unsupported="the toy has no such strategy yet"),
    ), MemoryFacts(host_extra_mib={"cpu": 10.0, "cuda": 10.0})))
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    (tmp_path / "toy_framework.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("TRAINBENCH_PLUGINS", "toy_framework")
    import toy_framework  # noqa: F401  (registers "toy" in this process; the plugin variable, in others)

    config = {"studies": {"t": {"description": "toy", "settings": {
        "framework": "toy", "model": "gpt2-tiny", "device": "cpu", "seq_len": 16, "warmup_steps": 1,
        "timed_steps": 2}, "timing": FAST_TIMING,
        "include": [{"strategy": "solo"}, {"strategy": "someday"}]}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    REGISTRY.pop("toy", None)
    sys.modules.pop("toy_framework", None)


def test_a_plugin_named_inside_a_settled_block_loads_after_it(toy, monkeypatch):
    """Inside settled_plugins() the variable is read once, at its start; past the block, as always."""
    from trainbench.registry import frameworks

    REGISTRY.pop("toy")
    sys.modules.pop("toy_framework")
    monkeypatch.setattr(frameworks, "_plugins_loaded", set())
    monkeypatch.delenv("TRAINBENCH_PLUGINS")
    with frameworks.settled_plugins():
        monkeypatch.setenv("TRAINBENCH_PLUGINS", "toy_framework")
        assert "toy" not in frameworks.registry()
    assert "toy" in frameworks.registry()


def trainbench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainbench", *args], capture_output=True, text=True,
                          timeout=600)


def test_a_registered_framework_reaches_the_schema_the_checks_and_the_cli(toy):
    from trainbench.study.config import load_config
    from trainbench.errors import ConfigError
    from trainbench.study.schema import build_schema

    framework = build_schema()["properties"]["studies"]["additionalProperties"]["properties"]["settings"]
    assert "toy" in framework["properties"]["framework"]["enum"]
    study = load_config("config.yaml").study("t")
    assert {c.cell_id: c.unsupported for c in study.cells} == {
        "strategy~solo": None, "strategy~someday": "the toy has no such strategy yet"}
    with pytest.raises(ConfigError, match="'ddp' is not a toy strategy; allowed: solo, someday"):
        load_config({"studies": {"t": {"description": "d",
                                       "settings": {"framework": "toy", "strategy": "ddp"},
                                       "include": [{}]}}})
    listing = trainbench("strategies").stdout
    assert "toy         solo" in listing and "unsupported: the toy has no such strategy yet" in listing
    assert "runs with torch, deepspeed, toy" in trainbench("models").stdout  # gpt2 models: its family
    cells = trainbench("cells", "t", "--tsv").stdout
    assert "strategy~solo\tmissing" in cells
    predicted = trainbench("predict", "t", "--host-mem-gib", "64").stdout.splitlines()
    row = dict(zip(predicted[0].split(","), predicted[1].split(",")))
    assert row["strategy"] == "solo" and row["fits"] == "True" and float(row["host_mem_gib_per_node"]) > 0


def test_a_registered_framework_runs_a_cell_and_its_unsupported_strategy_is_a_result(toy):
    from trainbench.study.config import load_config

    study = load_config("config.yaml").study("t")
    for cell in study.cells:
        done = trainbench("run-cell", "--study", "t", "--cell", cell.cell_id, "--params", cell.canonical,
                          "--timing", cell.timing.as_argument(), "--retries", "0", "--cpus-per-rank", "1",
                          "--output", f"runs/{cell.cell_id}/metrics.json")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ran = json.loads((toy / "runs/strategy~solo/metrics.json").read_text())
    assert ran["status"] == "ok" and ran["metrics"]["windows"] == 6 and ran["params"]["framework"] == "toy"
    refused = json.loads((toy / "runs/strategy~someday/metrics.json").read_text())
    assert refused["status"] == "unsupported" and refused["reason"] == "the toy has no such strategy yet"


@pytest.mark.parametrize("params, ops", [
    ({"framework": "deepspeed", "strategy": "zero2", "offload_optimizer": True}, ("cpu_adam",)),
    ({"framework": "hf_trainer", "strategy": "zero3", "offload_optimizer": True}, ("cpu_adam",)),
    # the strategy offloads
    ({"framework": "lightning", "strategy": "deepspeed_stage_2_offload"}, ("cpu_adam",)),
    ({"framework": "deepspeed", "strategy": "zero2"}, ()),  # torch's AdamW on the GPU
    ({"framework": "deepspeed", "strategy": "zero2", "offload_optimizer": True, "device": "cpu"}, ()),
    # FSDP steps torch's Adam on the host
    ({"framework": "torch", "strategy": "fsdp", "offload_param": True}, ()),
])
def test_the_deepspeed_ops_a_cell_builds_are_cpu_adam_for_an_optimizer_offloaded_from_a_gpu(params, ops):
    from trainbench.registry.frameworks import deepspeed_ops
    from trainbench.study.params import CellParams
    resolve = CellParams.resolve

    assert deepspeed_ops(resolve({"model": "gpt2-tiny", "device": "cuda", "gpus": 2, **params})) == ops


# --- no module outside the registry names a framework ----------------------------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "trainbench"
# where a framework's name may appear: its registration, and the runners (each imports its framework)
NAMES_FRAMEWORKS = ("registry/frameworks.py", "training/runners/")
# String constants that spell a framework's name but mean something else, or must be written out:
# (module, string): how many times, and why. Any other occurrence, or a count that changed, fails.
NOT_A_FRAMEWORK_FACT = {
    # the `framework` parameter's default: the parameter table is the schema's source, read without
    # loading the registry, and the default is part of every cell's identity (a cell that leaves it
    # unset is a torch cell, with that hash); it names the framework, it says nothing about it
    ("study/params.py", "torch"): (1, "the framework parameter's default"),
    ("study/params.py", "deepspeed"): (1, "the launcher parameter's choice: the DeepSpeed launcher"),
    ("execute/launch.py", "deepspeed"): (1, "the DeepSpeed launcher, which any framework may start with"),
    ("execute/provenance.py", "torch"): (2, "Python packages whose versions a run records"),
    ("execute/provenance.py", "deepspeed"): (2, "Python packages whose versions a run records"),
    ("execute/provenance.py", "lightning"): (2, "Python packages whose versions a run records"),
    ("contract/result.py", "torch"): (1, "a package version a result records"),
    ("contract/result.py", "deepspeed"): (1, "a package version a result records"),
    ("contract/result.py", "lightning"): (1, "a package version a result records"),
    ("reporting/tables.py", "torch"): (1, "torch's version, in the table's hardware line"),
}


def framework_names_outside_the_registry() -> dict[tuple[str, str], int]:
    names = {name for name in REGISTRY}
    found: dict[tuple[str, str], int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith(NAMES_FRAMEWORKS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found[module, node.value] = found.get((module, node.value), 0) + 1
    return found


def test_no_module_outside_the_registry_names_a_framework():
    """A framework's facts (the time and memory models' included) are attributes of its Framework:
    a model that branched on `params["framework"] == "torch"`, or a table of constants keyed by
    framework name, would miss a framework registered elsewhere (TRAINBENCH_PLUGINS)."""
    assert {"torch", "deepspeed", "lightning", "hf_trainer"} <= set(REGISTRY)
    found = framework_names_outside_the_registry()
    allowed = {key: count for key, (count, _) in NOT_A_FRAMEWORK_FACT.items()}
    named = {key: count for key, count in found.items() if allowed.get(key) != count}
    assert not named, f"framework names as string constants outside {NAMES_FRAMEWORKS}: {named}"
    stale = {key: count for key, count in allowed.items() if found.get(key) != count}
    assert not stale, f"allowed occurrences no longer there (update NOT_A_FRAMEWORK_FACT): {stale}"


def test_each_best_practice_setting_is_one_its_runner_honours_and_the_docs_give():
    """A setting tuning: best fills in that the runner does not read would make the cell refused; one the
    documentation's table does not give would be a default users cannot see."""
    from trainbench.study.params import PARAMS_BY_NAME

    table = Path(__file__).resolve().parents[1].joinpath("docs/frameworks.md").read_text()
    table = table[table.index("## How each strategy is configured"):table.index("Every setting a cell")]
    for framework in REGISTRY.values():
        for practice in framework.best_practice:
            assert practice.key in PARAMS_BY_NAME, practice.key
            assert practice.key == "gc_every" or practice.key in framework.honours, (framework.name,
                                                                                    practice.key)
            assert all(framework.strategy(name) for name in practice.strategies), practice.strategies
            value = practice.value if isinstance(practice.value, str) else json.dumps(practice.value)
            assert f"`{practice.key}: {value}`" in table, practice.key  # as a study's YAML gives it


def test_tuning_best_fills_in_what_a_cell_leaves_out_and_framework_leaves_the_cell_as_it_was():
    from trainbench.study.params import CellParams

    base = {"model": "gpt2-350m", "gpus": 2, "grad_accum": 4, "precision": "bf16"}
    ddp = CellParams.resolve({**base, "strategy": "ddp"})
    assert (ddp.ddp_bucket_cap_mb, ddp.ddp_bucket_view, ddp.gc_every) == (100, True, 50)
    fsdp = CellParams.resolve({**base, "strategy": "fsdp"})
    assert fsdp.fsdp_reshard == "after_step" and fsdp.ddp_bucket_cap_mb is None
    # without accumulation FSDP2 keeps its own policy; one rank has no buckets to size
    assert CellParams.resolve({**base, "strategy": "fsdp", "grad_accum": 1}).fsdp_reshard is None
    single = CellParams.resolve({**base, "strategy": "single", "gpus": 1})
    assert single.ddp_bucket_cap_mb is None and single.gc_every == 50
    # a setting the cell gives wins, null included
    mine = CellParams.resolve({**base, "strategy": "ddp", "ddp_bucket_cap_mb": 25, "gc_every": None})
    assert (mine.ddp_bucket_cap_mb, mine.ddp_bucket_view, mine.gc_every) == (25, True, None)
    # the Trainer's ZeRO-3 at DeepSpeed's bucket sizes, not its "auto"
    trainer = CellParams.resolve({"framework": "hf_trainer", "strategy": "zero3", "model": "llama-tiny",
                                  "gpus": 2})
    assert (trainer.reduce_bucket_size, trainer.prefetch_bucket_size) == (500_000_000, 50_000_000)
    # tuning: framework is the cell as it was before tuning existed: same identity and hash
    framework = CellParams.resolve({**base, "strategy": "ddp", "tuning": "framework"})
    assert framework.ddp_bucket_cap_mb is None and framework.gc_every is None
    assert "tuning" not in framework.canonical and "tuning" not in ddp.canonical
    assert framework.params_hash != ddp.params_hash
    # a cell is what its settings resolve to: tuning itself does not tell two cells apart
    spelled = CellParams.resolve({**base, "strategy": "ddp", "tuning": "framework", "ddp_bucket_cap_mb": 100,
                                  "ddp_bucket_view": True, "gc_every": 50})
    assert spelled.params_hash == ddp.params_hash
    # the worker gets the canonical string: what it rebuilds ran as chosen, and no result names the chooser
    for resolved in (ddp, framework):
        rebuilt = CellParams.from_json(resolved.canonical)
        assert rebuilt.as_dict() == resolved.as_dict() and "tuning" not in resolved.as_dict()


def test_trainbench_strategies_lists_each_best_practice_setting_with_its_reason():
    out = subprocess.run([sys.executable, "-m", "trainbench", "strategies"], capture_output=True, text=True,
                         check=True).stdout
    line = next(line for line in out.splitlines() if "fsdp_reshard" in line)
    assert line.startswith("torch") and '"after_step" (fsdp; 2+ ranks; grad_accum > 1)' in line
    gc_lines = [line for line in out.splitlines() if "tuning best: gc_every: 50 (every strategy)" in line]
    assert len(gc_lines) == len(REGISTRY)


# --- only a runner imports its framework ---------------------------------------------------------

# The frameworks' own packages. torch is every stage's substrate, and transformers the models' library:
# of it, the Trainer is the framework (its modules and names below), and only its runner imports it.
FRAMEWORK_PACKAGES = ("deepspeed", "lightning", "pytorch_lightning", "accelerate")
TRAINER_MODULES = ("transformers.trainer", "transformers.training_args")
TRAINER_NAMES = {"Trainer", "TrainingArguments", "TrainerCallback", "Seq2SeqTrainer"}
# A framework's module named outside the runners for another reason than importing it, and why.
NOT_AN_IMPORT = {
    ("execute/launch.py", "deepspeed.launcher.runner"): "the DeepSpeed launcher, run as `python -m`",
}


def framework_imports_outside_the_runners() -> dict[tuple[str, str], int]:
    """Imports of a framework outside training/runners/, by statement or by a module name in a string
    (importlib), by (module, what)."""
    found: dict[tuple[str, str], int] = {}

    def framework(name: str) -> bool:
        return name.split(".")[0] in FRAMEWORK_PACKAGES or name.startswith(TRAINER_MODULES)

    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith("training/runners/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            named = []
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names if framework(a.name)]
            elif isinstance(node, ast.ImportFrom) and node.module:
                named = [node.module] if framework(node.module) else [
                    f"{node.module}.{a.name}" for a in node.names
                    if node.module == "transformers" and a.name in TRAINER_NAMES]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value \
                    and framework(node.value) and " " not in node.value:
                named = [node.value]
            for name in named:
                if (module, name) not in NOT_AN_IMPORT:
                    found[module, name] = found.get((module, name), 0) + 1
    return found


def test_only_a_runner_imports_its_framework():
    """DeepSpeed's ops and its checks against rank 0 belong to the runners that use DeepSpeed
    (Runner.prepare_process, deepspeed_engine.agree_with_rank0), not to the worker or emulation."""
    assert framework_imports_outside_the_runners() == {}
    found = [name for module, name in NOT_AN_IMPORT if name not in (PACKAGE / module).read_text()]
    assert not found, f"allowed names no longer there (update NOT_AN_IMPORT): {found}"


def strategy_names_compared_outside_the_registry() -> list[str]:
    """Comparisons of a cell's strategy with a name (`p.strategy != "fsdp"`) outside the registry and
    the runners: a fact about strategies the registry should answer (frameworks.STRATEGY_SETTINGS)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith(NAMES_FRAMEWORKS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            strategy = any((isinstance(s, ast.Attribute) and s.attr == "strategy")
                           or (isinstance(s, ast.Name) and s.id == "strategy")
                           or (isinstance(s, ast.Subscript) and isinstance(s.slice, ast.Constant)
                               and s.slice.value == "strategy") for s in sides)
            names = any((isinstance(s, ast.Constant) and isinstance(s.value, str))
                        or (isinstance(s, (ast.Tuple, ast.List, ast.Set)) and s.elts
                            and all(isinstance(e, ast.Constant) for e in s.elts)) for s in sides)
            if strategy and names:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_registry_compares_strategy_names():
    assert strategy_names_compared_outside_the_registry() == []


@pytest.mark.parametrize("params, refused", [
    ({"strategy": "ddp", "fsdp_reshard": "after_step"}, "fsdp_reshard"),
    ({"strategy": "fsdp", "ddp_bucket_cap_mb": 25}, "ddp_bucket_cap_mb"),
    ({"strategy": "fsdp", "fsdp_reshard": "after_step"}, None),
    ({"strategy": "ddp", "ddp_bucket_cap_mb": 25}, None),
    ({"framework": "deepspeed", "strategy": "zero1", "prefetch_bucket_size": 1000}, "prefetch_bucket_size"),
    ({"framework": "deepspeed", "strategy": "zero3", "prefetch_bucket_size": 1000}, None),
])
def test_a_setting_of_another_strategy_is_refused_by_the_registrys_word(params, refused):
    from trainbench.study.grid import check_cell
    from trainbench.study.params import CellParams

    errors, _ = check_cell(CellParams.resolve({"model": "gpt2-tiny", "gpus": 2, "tuning": "framework",
                                                **params}))
    assert [key for key, _ in errors] == ([refused] if refused else [])
