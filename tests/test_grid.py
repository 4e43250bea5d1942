"""Grid expansion, cell ids, canonical parameters and config validation."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

import pytest
import yaml

from trainbench.study.config import load_config
from trainbench.errors import ConfigError
from trainbench.registry.frameworks import ORT_UNSUPPORTED
from trainbench.study.params import CellParams, canonical_json

from conftest import PROJECT, PROJECT_CONFIG


def config_with(study: dict, name: str = "s") -> dict:
    return {"default_studies": {"without_gpus": [name]}, "studies": {name: study}}


def study(**kw) -> dict:
    base = {"description": "d", "settings": {"model": "gpt2-tiny", "device": "cpu", "gpus": 2}}
    base.update(kw)
    return base


def problems(config: dict) -> list[str]:
    with pytest.raises(ConfigError) as error:
        load_config(config)
    return error.value.problems


def test_axes_make_the_cartesian_product_minus_excludes():
    s = load_config(config_with(study(
        axes={"strategy": ["ddp", "fsdp"], "micro_batch": [1, 2, 4]},
        exclude=[{"strategy": "fsdp", "micro_batch": 4}],
    ))).study("s")
    assert len(s.cells) == 5
    assert {(c.params.strategy, c.params.micro_batch) for c in s.cells} == {
        ("ddp", 1), ("ddp", 2), ("ddp", 4), ("fsdp", 1), ("fsdp", 2)}


def test_cell_ids_are_readable_key_value_pairs_in_parameter_order():
    s = load_config(config_with(study(axes={"micro_batch": [2], "strategy": ["ddp"]}))).study("s")
    # strategy comes before micro_batch in the parameter table, whatever the config's order
    assert [c.cell_id for c in s.cells] == ["strategy~ddp__micro_batch~2"]
    assert s.cells[0].target == "results/runs/s/strategy~ddp__micro_batch~2/metrics.json"


def test_include_entries_add_cells_named_by_their_keys():
    s = load_config(config_with(study(
        axes={"strategy": ["ddp"]},
        include=[{"strategy": "single", "gpus": 1},
                 {"framework": "deepspeed", "strategy": "zero2", "offload_optimizer": True}],
    ))).study("s")
    ids = [c.cell_id for c in s.cells]
    assert ids == ["strategy~ddp", "strategy~single__gpus~1",
                   "framework~deepspeed__strategy~zero2__offload_optimizer~true"]
    offload = s.cells[2].params
    assert (offload.framework == "deepspeed" and offload.offload_optimizer is True
            and offload.gpus == 2)


def test_an_include_entry_with_lists_makes_one_cell_per_combination_named_by_its_keys():
    s = load_config(config_with(study(
        axes={"strategy": ["ddp"]},
        include=[{"strategy": "fsdp", "micro_batch": [1, 2], "grad_accum": [1, 4]}],
    ))).study("s")
    assert [c.cell_id for c in s.cells] == [
        "strategy~ddp", "strategy~fsdp__micro_batch~1__grad_accum~1",
        "strategy~fsdp__micro_batch~1__grad_accum~4",
        "strategy~fsdp__micro_batch~2__grad_accum~1", "strategy~fsdp__micro_batch~2__grad_accum~4"]
    assert [c.params.global_batch for c in s.cells[1:]] == [2, 8, 4, 16]
    repeated = problems(config_with(study(include=[{"micro_batch": [1, 1]}])))
    assert any("two entries make the same cell" in p for p in repeated)


def test_variants_cross_bundles_of_parameters_with_the_axes():
    s = load_config(config_with(study(
        settings={"model": "gpt2-tiny", "device": "cpu", "framework": "deepspeed", "strategy": "zero3"},
        variants={"scale": [{"nodes": 1, "gpus": 2}, {"nodes": 2, "gpus": 4}]},
        axes={"micro_batch": [1, 2]},
    ))).study("s")
    assert sorted(c.cell_id for c in s.cells) == [
        "nodes~1__gpus~2__micro_batch~1", "nodes~1__gpus~2__micro_batch~2",
        "nodes~2__gpus~4__micro_batch~1", "nodes~2__gpus~4__micro_batch~2"]
    assert {c.params.gpus_per_node for c in s.cells} == {2}


def test_derived_values_and_defaults_are_in_the_parameters():
    cell = load_config(config_with(study(
        settings={"model": "gpt2-tiny", "device": "cpu", "framework": "deepspeed", "strategy": "zero1",
                  "gpus": 8, "tp": 2, "micro_batch": 3, "grad_accum": 5, "nodes": 2},
        include=[{}],
    ))).study("s").cells[0]
    p = cell.params
    assert (p.dp, p.gpus_per_node, p.global_batch) == (4, 4, 3 * 5 * 4)
    assert p.seq_len == 128  # null means the model's context length
    assert p.launcher == "torchrun"  # auto resolves by rank count
    assert p.lr == 1e-4 and isinstance(p.lr, float)


def digest(identity: dict) -> str:
    """The hash a result records, computed here from a cell's identity."""
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:12]


def test_canonical_string_ignores_key_order_and_hash_follows_values():
    a = {"strategy": "ddp", "micro_batch": 2, "nested": {"x": 1, "y": 2}}
    b = {"nested": {"y": 2, "x": 1}, "micro_batch": 2, "strategy": "ddp"}
    assert canonical_json(a) == canonical_json(b)
    one = CellParams.resolve({"strategy": "ddp", "micro_batch": 2, "gpus": 2})
    other = CellParams.resolve({"gpus": 2, "micro_batch": 2, "strategy": "ddp"})
    assert one.canonical == other.canonical and one.params_hash == other.params_hash == digest(one.identity)
    assert one.replace(micro_batch=3).params_hash != one.params_hash
    assert one.replace(micro_batch=3).global_batch == 6  # derived sizes follow the parameters


def test_a_cell_crosses_processes_as_one_serialisation():
    params = CellParams.resolve({"model": "gpt2-tiny", "gpus": 4, "tp": 2, "attention": "eager"})
    assert CellParams.from_dict(params.as_dict()) == params
    assert CellParams.from_json(params.canonical) == params  # the string the workflow hands run-cell
    with pytest.raises(ValueError, match="gives 'micro_batches', which no cell parameter"):
        CellParams.from_dict({**params.as_dict(), "micro_batches": 2})
    with pytest.raises(ValueError, match="lacks 'strategy'"):
        CellParams.from_dict({k: v for k, v in params.as_dict().items() if k != "strategy"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.micro_batch = 3


def test_an_optional_parameter_at_its_default_leaves_the_cell_as_it_was(repo):
    """Adding a parameter (attention) must not make every published result stale: at its default it
    is not in the canonical string nor the hash; set to anything else it is."""
    cells = load_config(config_with(study(axes={"attention": ["sdpa", "eager"],
                                                "strategy": ["ddp"]}))).study("s").cells
    default, eager = sorted(cells, key=lambda c: c.params.attention != "sdpa")
    assert default.params.attention == "sdpa" and '"attention"' not in default.canonical
    without = {k: v for k, v in default.params.identity.items() if k != "attention"}
    assert default.params_hash == digest(without)
    assert '"attention":"eager"' in eager.canonical and eager.params_hash != digest(
        {k: v for k, v in eager.params.identity.items() if k != "attention"})
    # the published results, made before the parameter existed, are still the cells config.yaml gives
    for study_name in ("baseline", "megatron"):
        for cell in load_config(PROJECT_CONFIG).study(study_name).cells:
            path = repo / cell.target
            if path.exists():
                assert json.loads(path.read_text())["params_hash"] == cell.params_hash, cell.cell_id


def test_reordering_config_keys_changes_no_id_and_no_parameter_string():
    original = study(axes={"strategy": ["ddp", "fsdp"], "micro_batch": [1, 2]},
                     include=[{"strategy": "single", "gpus": 1}])
    reordered = {"include": original["include"],
                 "axes": {"micro_batch": [2, 1], "strategy": ["fsdp", "ddp"]},
                 "settings": dict(reversed(list(original["settings"].items()))),
                 "description": "d"}
    cells_a = {c.cell_id: c.canonical for c in load_config(config_with(original)).study("s").cells}
    cells_b = {c.cell_id: c.canonical for c in load_config(config_with(reordered)).study("s").cells}
    assert cells_a == cells_b


def test_yaml_float_spellings_are_numbers():
    # PyYAML reads 5e-5 (no dot) as a string; a float parameter accepts it anyway.
    config = yaml.safe_load("studies:\n  s:\n    description: d\n    settings: {device: cpu, lr: 5e-5}\n"
                            "    include: [{}]\n")
    assert load_config(config).study("s").cells[0].params.lr == 5e-5


def test_timings_spelled_as_yaml_strings_are_numbers_too():
    # `1e-3` and `5e-2` are strings to YAML 1.1 (as `1e-09` in a JSON dump is); timing takes them
    config = yaml.safe_load("studies:\n  s:\n    description: d\n    settings: {device: cpu}\n"
                            "    axes: {micro_batch: [1, 2]}\n"
                            "    timing: {max_timed_s: 1e-3, target_ci: 5e-2}\n"
                            "    timing_overrides: [{when: {micro_batch: 2}, set: {max_timed_s: 2e1}}]\n")
    assert config["studies"]["s"]["timing"]["max_timed_s"] == "1e-3"  # what YAML gives
    timings = {c.params.micro_batch: c.timing for c in load_config(config).study("s").cells}
    assert (timings[1].max_timed_s, timings[1].target_ci) == (0.001, 0.05)
    assert timings[2].max_timed_s == 20.0


def test_stack_limits_make_cells_unsupported_not_errors():
    config = load_config(PROJECT_CONFIG)
    lightning = {c.params.strategy: c for c in config.study("lightning").cells}
    assert "ColossalAI" in lightning["colossalai"].unsupported
    assert lightning["ddp"].unsupported is None
    ort = [c for c in config.study("gpt2_zero").cells if c.params.ort]
    assert ort and all(c.unsupported == ORT_UNSUPPORTED for c in ort)
    assert lightning["colossalai"].resources()["gpu"] == 0  # recorded without holding GPUs
    assert set(lightning["colossalai"].resources()) == set(lightning["ddp"].resources())


def test_the_five_studies_and_smoke_expand(repo):
    config = load_config(PROJECT_CONFIG)
    counts = {name: len(s.cells) for name, s in config.studies.items()}
    assert counts["smoke"] == 6
    assert counts["lightning"] == 8  # 7 strategies on 4 GPUs and one GPU
    # (4 stages + offload at stages 1-3) x 3 precisions x ORT on/off
    assert counts["gpt2_zero"] == (4 + 3) * 3 * 2
    # the axes' grid, and the emulated cells of its include entries: 8 GPUs (4 models x 3 shardings x 2
    # GPU sizes) and the three 4-GPU claims
    assert counts["llama"] == 4 * 3 * 2 * 7 * 3 + 4 * 3 * 2 + 3
    zero3 = config.study("zero3_pipeline")
    full_size = [c for c in zero3.cells if c.params.model == "bert-180b"]
    assert {c.params.nodes for c in full_size} == {8, 16}
    assert ({(c.resources()["nodes"], c.resources()["gres"]) for c in full_size if not c.params.emulate}
            == {(8, "gpu:8"), (16, "gpu:8")})
    # the scaled-down cells are the ones run for real; the full-size grid is planned, or measured as one
    # emulated rank on one GPU
    assert ({c.params.model for c in zero3.cells if c.measured and not c.params.emulate}
            == {"bert-180b-l4"})
    assert not any(c.measured for c in full_size if not c.params.emulate)
    assert ({(c.resources()["nodes"], c.resources()["gpu"]) for c in full_size if c.params.emulate}
            == {(1, 1)})
    assert config.default_targets_studies(have_gpus=False) == ["smoke"]


# --- bad input: one message naming study, cell or key, and what is allowed --------------------

@pytest.mark.parametrize("settings, expected", [
    ({"micro_batch": -4}, "studies.s.settings.micro_batch: -4 is less than the minimum of 1"),
    ({"micro_batch": "four"}, "micro_batch must be an integer >= 1"),
    ({"precision": "fp8"}, "studies.s.settings.precision: 'fp8' is not allowed; precision must be one of "
                           "'fp32', 'fp16', 'bf16'"),
    ({"micro_bach": 4}, "unknown key 'micro_bach' (did you mean 'micro_batch'?)"),
])
def test_schema_errors_name_the_key_and_what_is_allowed(settings, expected):
    s = study()
    s["settings"] = {**s["settings"], **settings}
    s["include"] = [{}]
    found = problems(config_with(s))
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("cell, expected", [
    ({"strategy": "ddp", "offload_optimizer": True},
     "offload_optimizer: means nothing for torch strategy 'ddp'"),
    ({"strategy": "single", "gpus": 4}, "gpus: strategy 'single' runs one rank"),
    ({"strategy": "zero9", "framework": "deepspeed"},
     "'zero9' is not a deepspeed strategy; allowed: zero0, zero1"),
    ({"framework": "deepspeed", "strategy": "zero0", "offload_optimizer": True},
     "offload_optimizer: means nothing for deepspeed strategy 'zero0'"),
    ({"framework": "deepspeed", "strategy": "zero1", "tp": 3},
     "gpus: gpus=2 is not divisible by tp x pp = 3 x 1"),
    ({"model": "gpt5"}, "model: unknown model 'gpt5' (did you mean 'gpt-5.8b'?); known: gpt2-tiny"),
    ({"seq_len": 4096}, "seq_len: 4096 exceeds gpt2-tiny's context of 128 tokens"),
    ({"gpus": 3, "nodes": 2}, "gpus=3 is not a multiple of nodes=2"),
    ({"strategy": "ddp", "launcher": "deepspeed"},
     "launcher: 'deepspeed' does not start torch runs; allowed: python, torchrun"),
    ({"attention": "flash"},
     "attention: 'flash' is a CUDA kernel of SDPA; a CPU cell can use 'sdpa' or 'eager'"),
])
def test_semantic_errors_name_study_cell_and_key(cell, expected):
    found = problems(config_with(study(include=[cell])))
    assert any(expected in p for p in found), found
    assert all(p.startswith("config.yaml: study 's', cell '") for p in found if expected in p)


def test_many_bad_cells_are_reported_once_per_problem():
    found = problems(config_with(study(axes={"strategy": ["ddp"], "micro_batch": list(range(1, 9)),
                                             "offload_optimizer": [True]})))
    assert len(found) == 1 and "and 5 more" in found[0]


def test_structural_mistakes_are_reported():
    assert any("no cells" in p for p in problems(config_with(study())))
    assert any("matches no cell" in p for p in problems(config_with(study(
        axes={"strategy": ["ddp"]}, exclude=[{"strategy": "fsdp"}]))))
    assert any("same cell" in p for p in problems(config_with(study(
        axes={"strategy": ["ddp"]}, include=[{"strategy": "ddp"}]))))
    assert any("repeated value" in p for p in problems(config_with(study(axes={"strategy": ["ddp", "ddp"]}))))
    assert any("both a setting and an axis" in p for p in problems(config_with(study(
        axes={"device": ["cpu"]}))))
    bad_default = config_with(study(include=[{}]))
    bad_default["default_studies"] = {"without_gpus": ["nope"]}
    assert any("default_studies.without_gpus: unknown study 'nope'" in p for p in problems(bad_default))


def test_unknown_study_and_cell_lookups_say_what_exists(repo):
    config = load_config(PROJECT_CONFIG)
    with pytest.raises(ConfigError,
                       match="unknown study 'nope'; studies: smoke, baseline, ddp_settings, "
                             "deepspeed_settings, float8, fsdp_reshard, gpt2_zero"):
        config.study("nope")
    with pytest.raises(ConfigError, match="has no cell 'x'; `trainbench cells smoke` lists"):
        config.study("smoke").cell("x")


def test_config_mapping_is_not_modified(repo):
    raw = yaml.safe_load(PROJECT_CONFIG.read_text())
    before = copy.deepcopy(raw)
    load_config(raw, PROJECT)
    assert json.dumps(raw, sort_keys=True) == json.dumps(before, sort_keys=True)


# --- measure: which cells a study's table runs; the rest are planned rows -----------------------

def test_measure_selects_cells_and_the_rest_are_planned():
    s = study(axes={"micro_batch": [1, 2, 4], "strategy": ["ddp", "fsdp"]},
              measure={"cells": [{"micro_batch": [1, 2], "strategy": "ddp"}]})
    result = load_config(config_with(s)).study("s")
    measured = {(c.params.strategy, c.params.micro_batch) for c in result.cells if c.measured}
    assert measured == {("ddp", 1), ("ddp", 2)}
    assert len(result.targets) == 2 and len(result.planned) == 4
    assert set(result.targets) == {c.target for c in result.cells if c.measured}
    # without measure every cell is measured
    assert not load_config(config_with(study(axes={"micro_batch": [1, 2],
                                                   "strategy": ["ddp"]}))).study("s").planned
    # with no pattern, none is: every cell is a planned row until the patterns name it
    s = study(axes={"micro_batch": [1, 2], "strategy": ["ddp"]}, measure={"cells": []})
    nothing = load_config(config_with(s)).study("s")
    assert not nothing.targets and len(nothing.planned) == 2


def test_a_measure_pattern_that_selects_nothing_is_an_error():
    s = study(axes={"micro_batch": [1, 2]}, measure={"cells": [{"micro_batch": 8}]})
    s["settings"]["strategy"] = "ddp"
    assert problems(config_with(s)) == [
        "config.yaml: studies.s.measure.cells[0]: {'micro_batch': 8} matches no cell"]
    s = study(axes={"micro_batch": [1, 2]},
              measure={"cells": [{"micro_batch": 1}], "plan_for": {"gpus_per_node": 8}})
    s["settings"]["strategy"] = "ddp"
    assert any("plan_for" in p and "gpu_mem_gib" in p for p in problems(config_with(s)))


def test_a_measured_cell_this_version_cannot_run_is_an_error_and_a_planned_one_says_why(tmp_path, capsys):
    """A framework that cannot build a model family plans the cell but cannot run it: measured, the
    workflow says so before any cell runs (not when its job starts), while planning and predicting take
    it; planned, `trainbench cells` says why it stays planned."""
    from trainbench.cli import main
    from trainbench.workflow import Workflow

    s = study(axes={"framework": ["torch", "lightning"]}, settings={"model": "gpt2-tiny", "device": "cpu",
                                                                   "gpus": 2, "strategy": "ddp"})
    loaded = load_config(config_with(s))  # the config itself is sound: predict plans it
    with pytest.raises(ConfigError) as error:
        Workflow(loaded, remote=True)
    [problem] = error.value.problems
    assert "cell 'framework~lightning'" in problem and "lightning cannot build model family 'gpt'" in problem
    assert "studies.s.measure.cells" in problem
    s["measure"] = {"cells": [{"framework": "torch"}]}
    planned = load_config(config_with(s)).study("s").planned
    assert [c.params.framework for c in planned] == ["lightning"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_with(s)))
    config = str(tmp_path / "config.yaml")
    assert main(["cells", "s", "--tsv", "--config", config, "--root", str(tmp_path)]) == 0
    status = {row.split("\t")[1]: row.split("\t")[2] for row in capsys.readouterr().out.splitlines()[1:]}
    assert status["framework~lightning"].startswith("planned (lightning cannot build model family 'gpt'")
    assert status["framework~torch"].startswith("missing")


# --- search: which measured cells' max-batch search the table reports ------------------------------

def test_a_study_with_a_search_reports_it_for_the_measured_cells_it_names():
    axes = {"micro_batch": [1, 2], "strategy": ["ddp", "fsdp"]}
    measure = {"cells": [{"micro_batch": 1}]}
    every = load_config(config_with(study(axes=axes, measure=measure, search={"steps": 2}))).study("s")
    assert every.search_targets == [f"results/search/s/{c.cell_id}/max_batch.json" for c in every.cells
                                    if c.measured]
    named = load_config(config_with(study(axes=axes, measure=measure,
                                          search={"cells": [{"strategy": "fsdp"}]}))).study("s")
    assert [named.cell(i).params.strategy for i in named.searched] == ["fsdp"]
    assert named.cell(named.searched[0]).measured
    # no search declared: no search in the table
    assert load_config(config_with(study(axes=axes))).study("s").searched == ()


def test_a_search_pattern_that_names_no_measured_cell_is_an_error():
    s = study(axes={"micro_batch": [1, 2]}, measure={"cells": [{"micro_batch": 1}]},
              search={"cells": [{"micro_batch": 2}]})
    s["settings"]["strategy"] = "ddp"
    assert problems(config_with(s)) == [
        "config.yaml: studies.s.search.cells[0]: {'micro_batch': 2} matches no measured cell"]


def test_plot_panels_must_be_keys_that_tell_cells_apart():
    axes = {"micro_batch": [1, 2], "strategy": ["ddp", "fsdp"]}
    assert (load_config(config_with(study(axes=axes, plot_panels=["strategy"]))).study("s").plot_panels
            == ("strategy",))
    # lr is a parameter, but every cell has the same: a panel per value would be one panel
    assert problems(config_with(study(axes=axes, plot_panels=["lr"]))) == [
        "config.yaml: studies.s.plot_panels: 'lr' is not a key that tells the study's cells apart "
        "(those are: strategy, micro_batch)"]


# --- large grids: what each job asks of its cell costs the same whatever the grid's size -------------

def large_grid(cells_per_axis: int = 100):
    """A study of cells_per_axis² CPU cells: 10,000 by default, as in bench/plan_scaling.py."""
    axes = {"micro_batch": list(range(1, cells_per_axis + 1)), "seed": list(range(cells_per_axis))}
    return load_config(config_with(study(axes=axes, settings={"model": "gpt2-tiny", "device": "cpu",
                                                              "gpus": 2, "strategy": "ddp"}))).study("s")


def test_a_cell_jobs_lookups_scan_no_cells_and_compute_each_string_once(monkeypatch):
    import trainbench.study.params as params_module

    grid = large_grid()
    ids = [c.cell_id for c in grid.cells]
    scans = []

    class CountedCells(list):  # the study's cells, counting every pass over them
        def __iter__(self):
            scans.append(1)
            return super().__iter__()

    grid.cells = CountedCells(grid.cells)
    real_canonical_json = params_module.canonical_json
    encoded = []
    monkeypatch.setattr(params_module, "canonical_json",
                        lambda params: encoded.append(1) or real_canonical_json(params))
    resources = list(grid.cell(ids[0]).resources())
    # what common.smk asks for each cell job, several times over as Snakemake does: its cell by id,
    # its parameter string (params), each resource, and the hash the freshness checks compare
    for _ in range(3):
        for cell_id in ids:
            cell = grid.cell(cell_id)
            assert cell.cell_id == cell_id
            assert cell.canonical and cell.params_hash
            assert all(name in cell.resources() for name in resources)
    assert not scans, "a cell lookup went through the study's cells: planning is quadratic in its size"
    assert len(encoded) == len(ids), "a cell's parameter string was encoded more than once"
    # what is cached is what was computed: the same string, hash and resources as from scratch
    cell = grid.cell(ids[-1])
    assert (cell.canonical == real_canonical_json(cell.params.identity)
            and cell.params_hash == digest(cell.params.identity))
    copy_of_cell = dataclasses.replace(cell)
    assert copy_of_cell.resources() == cell.resources()
    cell.resources()["gpu"] = 99  # a caller's copy: the cell's own resources stay
    assert cell.resources()["gpu"] == 0


def test_freshness_reads_only_the_results_that_exist(tmp_path, monkeypatch):
    from trainbench.reporting import freshness
    from trainbench.contract import result as results

    grid = large_grid()
    stale, invalid = grid.cells[5], grid.cells[7]
    other = stale.params.replace(lr=0.5)
    document = {"schema": 1, "study": "s", "cell_id": stale.cell_id, "params": other.as_dict(),
                "params_hash": other.params_hash, "status": "unsupported", "reason": "made with lr 0.5",
                "metrics": results.empty_metrics(), "predicted": results.empty_predicted(),
                "provenance": {**{k: None for k in results.PROVENANCE_KEYS},
                               "versions": {k: None for k in results.VERSION_KEYS}}}
    for cell, text in ((stale, json.dumps(document)), (invalid, '{"status": "ok"}')):
        (tmp_path / cell.target).parent.mkdir(parents=True)
        (tmp_path / cell.target).write_text(text)
    read = []
    real_check_result = freshness.check_result
    monkeypatch.setattr(freshness, "check_result", lambda path: read.append(path) or real_check_result(path))

    assert freshness.prepare(grid, tmp_path) == {stale.cell_id}
    assert (tmp_path / f"{invalid.target}.invalid").exists() and not (tmp_path / invalid.target).exists()
    assert len(read) == 2, "freshness looked at cells without a result"
    # the next plan reads no result that did not change since: it knows what each one is
    assert freshness.prepare(grid, tmp_path) == {stale.cell_id} and len(read) == 2
    # one rewritten (here: made with the config's parameters) is read again, and no longer stale
    (tmp_path / stale.target).write_text(json.dumps({**document, "params": stale.params.as_dict(),
                                                     "params_hash": stale.params_hash}))
    assert freshness.prepare(grid, tmp_path) == set() and len(read) == 3
    stamp = json.loads((tmp_path / freshness.stamp_path("s")).read_text())
    assert len(stamp) == len(grid.cells) and stamp[stale.cell_id] == stale.params_hash


def test_shared_resources_are_those_every_cell_asks_for_alike():
    from trainbench.study.grid import shared_resources

    grid = large_grid(3)
    every = grid.cells[0].resources()
    assert shared_resources(c.resources() for c in grid.cells) == every  # micro batch and seed change none
    # two ranks against one: the cores, memory and threads differ, what says how a cell runs does not
    one_rank = load_config(config_with(study(settings={"model": "gpt2-tiny", "device": "cpu", "gpus": 1,
                                                       "strategy": "ddp"},
                                             axes={"micro_batch": [1]}))).study("s").cells
    shared = shared_resources(c.resources() for c in [*grid.cells, *one_rank])
    assert {"cpus_per_task", "mem_mb", "threads"}.isdisjoint(shared)
    assert shared == {name: value for name, value in every.items()
                      if name not in ("cpus_per_task", "mem_mb", "threads")}
    assert shared["gres"] is None and shared["gpu"] == 0  # None is a value cells share too
    assert shared_resources([]) == {}


def test_a_study_says_where_its_slurm_jobs_run_and_a_bad_value_is_named():
    cluster = {"slurm_partition": "gpu-long", "slurm_account": "bench", "constraint": "nvlink&ib",
               "gpu_model": "h100"}
    grid = load_config(config_with(study(
        settings={"model": "gpt2-tiny", "device": "cuda", "strategy": "ddp"},
        include=[{"gpus": 4}, {"gpus": 16, "nodes": 2}, {"gpus": 2, "device": "cpu"}],
        execution=cluster))).study("s")
    one_node, two_nodes, cpu = (r.resources() for r in grid.cells)
    assert {k: one_node[k] for k in cluster} == cluster
    assert one_node["gpu"] == 4 and one_node["gres"] is None
    # a multi-node cell asks per node, the model in its GRES; the plugin's gpu_model is per job
    assert two_nodes["gres"] == "gpu:h100:8" and two_nodes["gpu_model"] is None
    assert cpu["gpu_model"] is None and cpu["slurm_partition"] == "gpu-long"  # CPU ranks ask no GPU model
    plain = load_config(config_with(study(settings={"model": "gpt2-tiny", "device": "cpu", "gpus": 2,
                                                    "strategy": "ddp"}, axes={"micro_batch": [1]})))
    plain = plain.study("s").cells[0].resources()
    assert all(plain[k] is None for k in cluster)
    for key, bad in (("slurm_partition", "gpu long"), ("gpu_model", "h100-80g"), ("constraint", "a;b")):
        [problem] = problems(config_with(study(axes={"micro_batch": [1]}, execution={key: bad},
                                               settings={"model": "gpt2-tiny", "device": "cpu", "gpus": 2,
                                                         "strategy": "ddp"})))
        assert f"studies.s.execution.{key}" in problem, problem
