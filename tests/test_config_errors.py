"""Every config mistake is refused before any job, naming the key (and the cell where it is a cell's
mistake), with no traceback: a table of kinds of bad config and the words each message must hold.
Each case edits a valid config of one small study; load_checked must raise ConfigError saying so.
(tests/test_workflow.py checks that Snakemake shows these messages and starts no job.)"""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from trainbench.workflow import load_checked
from trainbench.errors import ConfigError

from conftest import tiny_study


def base() -> dict[str, Any]:
    study = tiny_study(strategy="single")
    study["axes"] = {"micro_batch": [1, 2]}
    return {"default_studies": {"without_gpus": ["t"], "with_gpus": ["t"]}, "studies": {"t": study}}


def study(**changes) -> Callable[[dict], Any]:
    def edit(config):
        config["studies"]["t"].update(changes)
    return edit


def long_named_study(**changes) -> Callable[[dict], Any]:
    """The study renamed with 20 characters, and changed."""
    def edit(config):
        name = "t" * 20
        config["studies"][name] = {**config["studies"].pop("t"), **changes}
        config["default_studies"] = {"without_gpus": [name], "with_gpus": [name]}
    return edit


def settings(**changes) -> Callable[[dict], Any]:
    def edit(config):
        config["studies"]["t"]["settings"].update(changes)
    return edit


def top(**changes) -> Callable[[dict], Any]:
    def edit(config):
        config.update(changes)
    return edit


def replace(new) -> Callable[[dict], Any]:
    def edit(config):
        config.clear()
        config["__replace__"] = new
    return edit


LESS = {"metric": "step_time_ms", "less": {"micro_batch": 1}, "than": {"micro_batch": 2}}


def finding(claim: str | None = "a claim", **relation) -> Callable[[dict], Any]:
    """A study with one finding: its claim (None: none) and relation."""
    def edit(config):
        config["studies"]["t"]["findings"] = [{**({"claim": claim} if claim else {}), **relation}]
    return edit


def array_study(name: str = "t", settings: dict | None = None, **changes) -> Callable[[dict], Any]:
    """The study submitted as SLURM job arrays (under `name`), with these changes."""
    def edit(config):
        spec = config["studies"].pop("t")
        spec["execution"]["slurm_array"] = True
        spec["settings"].update(settings or {})
        spec.update(changes)
        config["studies"][name] = spec
        config["default_studies"] = {"without_gpus": [name], "with_gpus": [name]}
    return edit


CASES: dict[str, tuple[Callable[[dict], Any], str]] = {
    # the file's shape
    "not a mapping": (replace(["a", "b"]), "config.yaml must be a mapping with a 'studies' key"),
    "studies as a list": (top(studies=[{"t": 1}]),
                          "studies: must be a mapping (key: value, ...), not a list"),
    "no studies": (lambda c: c.pop("studies"), "config.yaml: no studies: none under `studies`, and no "
                                               "file its study_files name (none) holds one"),
    "unknown top-level key": (top(studys={}), "unknown key 'studys' (did you mean 'studies'?)"),
    "bad study name": (lambda c: c["studies"].update({"my study": c["studies"]["t"]}),
                       "studies.my study: study names use letters, digits, '_' and '-' only"),
    "study not a mapping": (lambda c: c["studies"].update({"t": 5}),
                            "studies.t: must be a mapping (key: value, ...), not a number: 5"),
    "study without description": (lambda c: c["studies"]["t"].pop("description"),
                                  "studies.t: 'description' is a required property"),
    "unknown study key": (study(axis={"seed": [1]}), "unknown key 'axis' (did you mean 'axes'?)"),
    "default study unknown": (top(default_studies={"without_gpus": ["nope"], "with_gpus": []}),
                              "default_studies.without_gpus: unknown study 'nope'"),
    "default studies not a list": (top(default_studies={"without_gpus": "t", "with_gpus": []}),
                                   "default_studies.without_gpus: 't' is not of type 'array'"),
    "default studies unknown machine": (top(default_studies={"with_gpu": ["t"]}),
                                        "unknown key 'with_gpu' (did you mean 'with_gpus'?)"),
    # parameters: names, types, values
    "unknown setting": (settings(micro_bach=4), "unknown key 'micro_bach' (did you mean 'micro_batch'?)"),
    "setting of the wrong type": (settings(warmup_steps="four"), "warmup_steps must be an integer >= 0"),
    "below the minimum": (settings(timed_steps=0), "timed_steps must be an integer >= 1"),
    "a value not allowed": (settings(precision="fp8"), "'fp8' is not allowed; precision must be one of"),
    "unknown framework": (settings(framework="jax"), "'jax' is not allowed; framework must be one of"),
    "unknown head": (settings(head="regression"), "head must be one of 'lm', 'classifier'"),
    "a flag given a string": (settings(compile="yes"), "compile must be true or false"),
    "a derived value set": (settings(global_batch=8), "unknown key 'global_batch'"),
    "unknown strategy": (settings(strategy="zero2"), "strategy: 'zero2' is not a torch strategy"),
    "unknown model": (settings(model="gpt-9"), "model: unknown model 'gpt-9'"),
    "sequence beyond the context": (settings(seq_len=4096),
                                    "seq_len: 4096 exceeds gpt2-tiny's context of 128 tokens"),
    "gpus not a multiple of nodes": (settings(strategy="ddp", gpus=3, nodes=2),
                                     "gpus: gpus=3 is not a multiple of nodes=2"),
    "gpus not divisible by tp": (settings(framework="deepspeed", strategy="zero1", gpus=2, tp=4),
                                 "gpus: gpus=2 is not divisible by tp x pp = 4 x 1"),
    "offload that means nothing": (settings(strategy="ddp", gpus=2, offload_optimizer=True),
                                   "offload_optimizer: means nothing for torch strategy 'ddp'"),
    "single on two ranks": (settings(gpus=2), "gpus: strategy 'single' runs one rank"),
    "tensor parallel without a runner": (settings(strategy="ddp", gpus=2, tp=2), "tp"),
    "python launcher across nodes": (settings(strategy="ddp", gpus=2, nodes=2, launcher="python"),
                                     "launcher: 'python' cannot span nodes"),
    "an injected OOM never reached": (settings(inject_oom_at_step=99),
                                      "inject_oom_at_step: step 99 is never reached"),
    "a run of no epochs": (settings(dataset_size=100),
                           "dataset_size and epochs describe the whole run together"),
    # axes, variants, include, exclude
    "axis not a list": (study(axes={"micro_batch": 4}),
                        "studies.t.axes.micro_batch: 4 is not of type 'array'"),
    "empty axis": (study(axes={"micro_batch": []}), "studies.t.axes.micro_batch: [] should be non-empty"),
    "axis value of the wrong type": (study(axes={"micro_batch": [1, "two"]}),
                                     "studies.t.axes.micro_batch[1]: 'two' is not of type 'integer'"),
    "repeated axis value": (study(axes={"micro_batch": [1, 1]}),
                            "studies.t.axes.micro_batch: repeated value"),
    "a key both setting and axis": (study(axes={"micro_batch": [1, 2], "seed": [0, 1]}, settings={
        **tiny_study(strategy="single")["settings"], "seed": 3}), "'seed' is both a setting and an axis"),
    "variant key also an axis": (study(variants={"size": [{"micro_batch": 4}]}),
                                 "studies.t.variants.size: 'micro_batch' is also set in axes"),
    "variant not a list of mappings": (study(variants={"size": [4]}),
                                       "studies.t.variants.size[0]: must be a mapping (key: value, ...), "
                                       "not a number: 4"),
    "exclude matching nothing": (study(exclude=[{"micro_batch": 3}]),
                                 "studies.t.exclude[0]: {'micro_batch': 3} matches no cell"),
    "exclude without axes": (lambda c: c["studies"]["t"].update(axes={}, include=[{}], exclude=[{"seed": 0}]),
                             "studies.t.exclude: there are no axes to exclude combinations from"),
    "include with an unknown key": (study(include=[{"micro_batches": 3}]), "unknown key 'micro_batches'"),
    "include repeating a cell": (study(include=[{"micro_batch": 1}, {"micro_batch": 1}]),
                                 "make the same cell"),
    "no cells": (study(axes={}), "studies.t: no cells; give it axes, variants or include entries"),
    "a value that cannot name a cell": (study(axes={"dataset_path": ["a/b", "c"]}),
                                        "value 'a/b' of dataset_path cannot name a cell"),
    "a cell id too long to name a folder": (study(axes={"dataset_path": ["d" * 250, "c"]}),
                                            "more than a file's name may be (255)"),
    # 250 characters: its folder fits, its history file (the profiles study's LLaMA offload rank's was
    # 257 bytes, and a first H200 result was lost to it)
    "a cell id too long for its history file": (study(axes={"dataset_path": ["d" * 237, "c"]}),
                                                "as 'dddddd.jsonl' more than a file's name may be"),
    # 240 characters in a study named with 20: SLURM's log folder `<study>_<cell>` would not fit
    "a cell id too long for SLURM's log folder": (long_named_study(axes={"dataset_path": ["d" * 227, "c"]}),
                                                  "as 'dddddddddddd' more than a file's name may be"),
    # execution and timing
    "unknown execution key": (study(execution={"runtime": 5}),
                              "unknown key 'runtime' (did you mean 'runtime_min'?)"),
    "execution below its minimum": (study(execution={"runtime_min": 0}),
                                    "studies.t.execution.runtime_min: 0 is less than the minimum of 1"),
    "override without set": (study(execution_overrides=[{"when": {"micro_batch": 1}}]),
                             "'set' is a required property"),
    "an integer spelled as YAML's string": (study(execution={"runtime_min": "1e3"}),
                                            "studies.t.execution.runtime_min: '1e3' is a string to YAML, "
                                            "not a number (YAML 1.1 reads an exponent without a dot and "
                                            "a sign as text): write 1000"),
    "timing target of zero": (study(timing={"target_ci": 0}),
                              "studies.t.timing.target_ci: 0 is less than or equal to the minimum of 0"),
    "no timed window": (study(timing={"min_windows": 0}),
                        "studies.t.timing.min_windows: 0 is less than the minimum of 1"),
    "unknown timing key of an override": (study(timing_overrides=[{"when": {"strategy": "ddp"},
                                                                   "set": {"windows": 2}}]),
                                          "unknown key 'windows'"),
    "unknown timing key": (study(timing={"windows": 8}), "unknown key 'windows'"),
    # SLURM job arrays: one sbatch request for all of a study's cells
    "job array of cells asking for different CPUs": (
        array_study(settings={"strategy": "ddp"}, axes={"gpus": [1, 2]}),
        "studies.t.execution.slurm_array: one job array is one sbatch request, and its cells ask for 2 "
        "different ones (cpus_per_task=1: 1 cell(s) (gpus~1)"),
    "job array for some cells only": (
        study(execution_overrides=[{"when": {"micro_batch": 1}, "set": {"slurm_array": True}}]),
        "studies.t.execution.slurm_array: set for some of its cells only"),
    "job array whose rule is taken": (array_study(name="cell"),
                                      "studies.cell.execution.slurm_array: its rule would be 'train_cell'"),
    # what the tables and plots show
    "unknown report column": (study(report=["speed"]), "studies.t.report: unknown column 'speed'"),
    "report not a list": (study(report="mfu"), "studies.t.report: 'mfu' is not of type 'array'"),
    "plot panel key that names no cell": (study(plot_panels=["seed"]),
                                          "studies.t.plot_panels: 'seed' is not a key"),
    # measured and planned cells, searches
    "measure pattern selecting nothing": (study(measure={"cells": [{"micro_batch": 7}]}),
                                          "studies.t.measure.cells[0]: {'micro_batch': 7} matches no cell"),
    "measure without cells": (study(measure={"plan_for": None}), "'cells' is a required property"),
    "plan_for without its memory": (study(measure={"cells": [{}],
                                                   "plan_for": {"gpus_per_node": 8, "host_mem_gib": 1}}),
                                    "'gpu_mem_gib' is a required property"),
    "search tolerance above one": (study(search={"tolerance": 2}),
                                   "studies.t.search.tolerance: 2 is greater than the maximum of 1"),
    "search naming no measured cell": (study(search={"cells": [{"micro_batch": 9}]}),
                                       "studies.t.search.cells[0]: {'micro_batch': 9} matches no measured "
                                       "cell"),
    # findings: a claim and one relation between the study's cells
    "finding without a claim": (finding(fits={"micro_batch": 1}, claim=None),
                                "'claim' is a required property"),
    "finding without a relation": (finding(),
                                   "studies.t.findings[0]: give one relation: compare, fits or oom"),
    "finding with two relations": (finding(fits={"micro_batch": 1}, oom={"micro_batch": 2}),
                                   "give one relation: compare, fits or oom (it gives fits, oom)"),
    "finding of an unknown metric": (finding(compare={**LESS, "metric": "step_ms"}),
                                     "studies.t.findings[0].compare.metric: unknown metric 'step_ms' "
                                     "(did you mean 'step_time_ms'?)"),
    "finding comparing text": (finding(compare={**LESS, "metric": "loss"}), "unknown metric 'loss'"),
    "finding with an unknown comparison": (finding(compare={**LESS, "lesser": {"micro_batch": 1}}),
                                           "unknown key 'lesser' (did you mean 'less'?)"),
    "finding with two comparisons": (finding(compare={**LESS, "more": {"micro_batch": 2}}),
                                     "give one comparison: less, more, same, rises_with, falls_with "
                                     "(it gives less, more)"),
    "finding less without than": (finding(compare={"metric": "mfu", "less": {"micro_batch": 1}}),
                                  "studies.t.findings[0].compare: less needs than"),
    "finding same without within": (finding(compare={"metric": "mfu", "same": {"micro_batch": 1},
                                                     "as": {"micro_batch": 2}}), "same needs within"),
    "finding factor with same": (finding(compare={"metric": "mfu", "same": {"micro_batch": 1}, "within": 0.1,
                                                  "as": {"micro_batch": 2}, "factor": {"min": 2}}),
                                 "studies.t.findings[0].compare.factor: goes with less or more"),
    "finding factor upside down": (finding(compare={**LESS, "factor": {"min": 3, "max": 2}}),
                                   "compare.factor: min 3 is above max 2"),
    "finding pattern matching no cell": (finding(compare={**LESS, "less": {"micro_batch": 7}}),
                                         "studies.t.findings[0].compare.less: {'micro_batch': 7} matches "
                                         "no cell"),
    "finding pattern of a bad value": (finding(oom={"micro_batch": "big"}),
                                       "studies.t.findings[0].oom.micro_batch"),
    "finding that pairs no cells": (finding(compare={**LESS, "than": {"micro_batch": 1}}),
                                    "studies.t.findings[0].compare: pairs no cells"),
    "finding rising with a key that names no cell": (finding(compare={"metric": "mfu", "rises_with": "seed"}),
                                                     "compare.rises_with: 'seed' is not a key that tells the "
                                                     "study's cells apart"),
    "finding rising with a key that is no number": (
        study(axes={"micro_batch": [1, 2], "attention": ["sdpa", "eager"]},
              findings=[{"claim": "c", "compare": {"metric": "mfu", "rises_with": "attention"}}]),
        "studies.t.findings[0].compare.rises_with: 'attention' is not a number"),
}


def test_the_table_holds_at_least_forty_kinds_of_mistake():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_config_is_refused_naming_what_is_wrong(case):
    edit, words = CASES[case]
    config = copy.deepcopy(base())
    load_checked(copy.deepcopy(config))  # the base is valid
    edit(config)
    if "__replace__" in config:
        config = config["__replace__"]
    with pytest.raises(ConfigError) as raised:
        load_checked(config)
    assert words in str(raised.value), str(raised.value)


def _invalid_tree(tmp_path):
    cell = tmp_path / "runs" / "t" / "c"
    cell.mkdir(parents=True, exist_ok=True)
    (cell / "metrics.json").write_text('{"status": "ok"}')
    return str(tmp_path / "runs")


CLI_CASES = {
    "unknown study": (["cells", "nope"], "unknown study 'nope'; studies: t "),
    "missing config": (["cells", "--config", "/no/such.yaml"], "/no/such.yaml: no such file"),
    "predict an unknown study": (["predict", "nope", "--host-mem-gib", "1"], "unknown study 'nope'"),
    "unknown GPU": (["predict", "--gpu", "z100", "--host-mem-gib", "1"],
                    "unknown GPU 'z100'; known: h100, h200"),
    "negative memory": (["predict", "--host-mem-gib", "-5"], "--host-mem-gib: -5 is not above 0"),
    "compare a missing folder": (["compare", "/no/a", "/no/b"], "/no/a: no such directory"),
    "compare a result that is not one": (["compare", "{invalid}", "{invalid}"],
                                         "not a metrics.json of schema 1"),
    "a gate of unknown words": (["compare", "{invalid}", "{invalid}", "--fail-on", "faster:5%"],
                                "--fail-on 'faster:5%'"),
    "run-cell given no JSON": (["run-cell", "--study", "t", "--cell", "c", "--params", "{",
                                "--output", "m.json"],
                               "--params is not the cell's JSON"),
    "unknown timing setting": (["run-cell", "--study", "t", "--cell", "c", "--params", "{}",
                                "--output", "m.json",
                                "--timing", "windows=3"], "unknown timing setting 'windows'"),
    "run-cell given params of no cell": (["run-cell", "--study", "t", "--cell", "c", "--params",
                                          '{"seed": 1}',
                                          "--output", "m.json"], "--params lacks 'framework'"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_the_cli_refuses_what_does_not_exist_by_name(case, tmp_path, monkeypatch, capsys):
    import yaml

    from trainbench.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(base()))
    argv, words = CLI_CASES[case]
    argv = [a.replace("{invalid}", _invalid_tree(tmp_path)) if "{invalid}" in a else a for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2
    assert words in captured.err and "Traceback" not in captured.err
    assert captured.out == ""  # nothing half-done on stdout


def _study_file(path, name, **changes):
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    study = {**tiny_study(strategy="single"), "axes": {"seed": [0, 1]}, **changes}
    path.write_text(yaml.safe_dump({"studies": {name: study}}))


def test_study_files_add_studies_and_every_problem_names_its_file(tmp_path):
    """config.yaml's study_files: each file's studies join config.yaml's; a mistake in one names the file,
    a study defined twice names both places, and a pattern that matches nothing is no error."""
    config = {**base(), "study_files": ["studies/*.yaml", "studies/local/*.yaml"]}
    _study_file(tmp_path / "studies/a.yaml", "a")
    _study_file(tmp_path / "studies/b.yaml", "b", settings={"micro_batch": 2})
    from trainbench.study.config import load_config

    loaded = load_config(config, base=tmp_path)
    assert list(loaded.studies) == ["t", "a", "b"]
    assert loaded.origins == {"t": "config.yaml", "a": "studies/a.yaml", "b": "studies/b.yaml"}
    assert loaded.study("b").cells[0].params.micro_batch == 2

    _study_file(tmp_path / "studies/local/mine.yaml", "a")
    with pytest.raises(ConfigError, match="studies/local/mine.yaml: study 'a' is already defined in "
                                          "studies/a.yaml"):
        load_config(config, base=tmp_path)
    _study_file(tmp_path / "studies/local/mine.yaml", "c", settings={"micro_bach": 2})
    with pytest.raises(ConfigError) as raised:
        load_config(config, base=tmp_path)
    assert ("studies/local/mine.yaml: studies.c.settings: unknown key 'micro_bach' (did you mean "
            "'micro_batch'?)") in str(raised.value)
    (tmp_path / "studies/local/mine.yaml").write_text("c: {settings: {}}\n")
    with pytest.raises(ConfigError, match=r"studies/local/mine.yaml: a study file holds a `studies` mapping"):
        load_config(config, base=tmp_path)
    (tmp_path / "studies/local/mine.yaml").write_text("studies: {}\nmodel: {}\n")
    with pytest.raises(ConfigError, match="studies/local/mine.yaml: unknown key 'model'"):
        load_config(config, base=tmp_path)


def test_a_config_file_finds_its_study_files_beside_it_wherever_the_command_runs(tmp_path, monkeypatch):
    import yaml

    from trainbench.study.config import load_config

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**base(), "study_files": ["studies/*.yaml"]}))
    _study_file(tmp_path / "studies/a.yaml", "a")
    monkeypatch.chdir("/")
    assert "a" in load_config(tmp_path / "config.yaml").studies
