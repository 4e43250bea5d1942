"""Emulated ranks: one rank of a world of any size on one device (trainbench.training.emulation).

The rank-for-rank tests run a real world of 2 or 4 CPU ranks (gloo) and the same cell as emulated
ranks, and hold each emulated rank to the real rank of its number: the tensors it keeps between steps
(parameters, gradients, optimizer states, buffers) to the byte and its parameter shard. An emulated
rank that skipped its optimizer steps (fp16 loss scaling on NaN from a buffer no collective wrote) or
received uninitialised weights would hold less, and fail here.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainbench.training import emulation
from trainbench.execute.cellrun import cpu_computes_fp16, run_cell
from trainbench.errors import ConfigError
from trainbench.study.grid import Cell, expand_study
from trainbench.study.params import CellParams
from trainbench.predict.memory_model import heaviest_rank, predict
from trainbench.registry.models import get_model
from trainbench.contract.result import read_json, schema_problems
from trainbench.reporting.documents import read_reported

from conftest import PROJECT_CONFIG, REPO, TINY, make_cell, tiny_study

resolve = CellParams.resolve  # a study's settings for one cell, as its typed parameters

# gloo keeps a collective's scalar (8 bytes) referenced on some ranks of a real world at the end
SCALAR_SLACK_BYTES = 64


def run(cell: Cell, folder: Path) -> dict:
    output = folder / "metrics.json"
    assert run_cell(cell, output, runtime_min=5, retries=0) == 0
    doc = read_json(output)
    assert schema_problems(doc) == [] and doc["status"] == "ok", doc["reason"]
    return doc


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# --- the cell: named, checked, resourced as one rank --------------------------------------------------

def test_an_emulated_cell_is_named_as_such_whatever_its_study_varies():
    real = expand_study("s", {**tiny_study(strategy="fsdp", gpus=4), "axes": {"micro_batch": [1, 2]}})
    emulated = expand_study("s", {**tiny_study(strategy="fsdp", gpus=4, emulate=True),
                                  "axes": {"micro_batch": [1, 2]}})
    held = expand_study("s", {**tiny_study(strategy="fsdp", gpus=4, emulate=True, emulate_rank=3,
                                           device="cuda", gpu_mem_limit_gib=40),
                              "axes": {"micro_batch": [1, 2]}})
    assert [c.cell_id for c in real.cells] == ["micro_batch~1", "micro_batch~2"]
    assert [c.cell_id for c in emulated.cells] == ["micro_batch~1__emulate~true",
                                                   "micro_batch~2__emulate~true"]
    assert held.cells[0].cell_id == "micro_batch~1__emulate~true__emulate_rank~3__gpu_mem_limit_gib~40"
    # none takes another's place
    assert len({c.target for c in [*real.cells, *emulated.cells, *held.cells]}) == 6


@pytest.mark.parametrize("settings, key, message", [
    ({"emulate_rank": 1, "gpus": 2, "strategy": "ddp"}, "emulate_rank", "set emulate: true"),
    ({"emulate": True, "emulate_rank": 4, "gpus": 4, "strategy": "ddp"}, "emulate_rank",
     "rank 4 is not a rank of a world of 4"),
    ({"emulate": True, "strategy": "single"}, "emulate", "a one-rank cell already runs alone"),
    ({"gpu_mem_limit_gib": 40, "gpus": 2, "strategy": "ddp"}, "gpu_mem_limit_gib", "a CPU cell has none"),
])
def test_emulation_settings_that_mean_nothing_are_errors_naming_cell_and_key(settings, key, message):
    with pytest.raises(ConfigError) as error:
        expand_study("s", {**tiny_study(**settings), "include": [{}]})
    text = str(error.value)
    assert "study 's', cell '" in text and f"': {key}: " in text and message in text


def test_an_emulated_cell_asks_for_one_gpu_on_one_node_whatever_its_world():
    study = expand_study("s", {**tiny_study(framework="deepspeed", strategy="zero3", model="bert-180b",
                                            device="cuda", nodes=8, gpus=64, emulate=True),
                               "execution": {"cpus_per_rank": 16, "mem_mb_per_rank": 60000}, "include": [{}]})
    resources = study.cells[0].resources()
    assert (resources["gpu"], resources["nodes"], resources["gres"], resources["mpi"]) == (1, 1, None, None)
    assert (resources["cpus_per_task"], resources["threads"], resources["mem_mb"]) == (16, 1, 60000)
    from trainbench.study.grid import short_of_gpus

    assert short_of_gpus(study.cells[0].params, gpus_here=1) is None
    assert short_of_gpus(study.cells[0].params, gpus_here=0) == "needs 1 GPU"


def test_timing_overrides_apply_to_the_cells_they_match_alone():
    spec = {**tiny_study(strategy="fsdp", gpus=4), "include": [{"emulate": False}, {"emulate": True}],
            "timing_overrides": [{"when": {"emulate": True}, "set": {"min_windows": 2, "max_timed_s": 1}}]}
    real, emulated = expand_study("s", spec).cells
    assert (real.timing.min_windows, emulated.timing.min_windows, emulated.timing.max_timed_s) == (6, 2, 1)
    assert emulated.timing.target_ci == real.timing.target_ci  # the study's, where the override says nothing


def test_cells_lists_an_emulated_cell_as_one_rank_of_its_world(capsys):
    from trainbench.cli import main

    assert main(["cells", "zero3_pipeline", "--tsv", "--config", str(PROJECT_CONFIG)]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()[1:]]
    emulated = [row for row in rows if "emulate~true" in row[1]]
    assert emulated and {row[3] for row in emulated} <= {"1 of 64 (gpu)", "1 of 128 (gpu)"}


# --- which rank, which GPU -------------------------------------------------------------------------------

@pytest.mark.parametrize("cell", ["strategy~zero0__model~bert-180b-l4__nodes~1__gpus~4__pp~4__micro_batch~1__"
                                  "grad_accum~8__offload_optimizer~false__offload_param~false",
                                  "strategy~zero1__model~bert-180b-l4__nodes~1__gpus~4__pp~2__micro_batch~1__"
                                  "grad_accum~8__offload_optimizer~false__offload_param~false"])
def test_the_heaviest_rank_of_a_pipeline_is_on_the_stage_that_held_the_most(cell):
    doc = read_reported(REPO / "results/runs/zero3_pipeline" / cell / "metrics.json")
    allocated, params = doc["metrics"]["torch_peak_allocated_mib"], CellParams.from_dict(doc["params"])
    per_stage = params.dp
    stages = [max(allocated[s * per_stage:(s + 1) * per_stage]) for s in range(params.pp)]
    heaviest_stage = heaviest_rank(params) // per_stage
    assert heaviest_stage in (0, params.pp - 1)  # an end: the middle stages hold the least
    # the ends hold within 0.4% of each other here: the stage picked holds the most, to the model's 1%
    assert stages[heaviest_stage] >= 0.99 * max(stages)
    if params.pp > 2:
        assert min(stages) < 0.9 * max(stages)  # the middle stages hold less: not every pick would do
    assert heaviest_rank(params.replace(pp=1)) == 0


def test_a_gpu_limit_leaves_the_allocator_what_the_smaller_gpu_would():
    from trainbench.predict.memory_model import CUDA_CONTEXT_MIB, nccl_buffers_mib

    params = resolve({**TINY, "device": "cuda", "gpus": 64, "nodes": 8, "strategy": "fsdp", "emulate": True})
    limit = emulation.device_limit(40, device_total_mib=143771, params=params)
    assert limit.allocator_mib == pytest.approx(40 * 1024 - CUDA_CONTEXT_MIB - nccl_buffers_mib(params))
    assert limit.fraction == pytest.approx(limit.allocator_mib / 143771)
    alone = resolve({**TINY, "device": "cuda", "gpus": 1})
    assert (emulation.device_limit(40, 143771, alone).allocator_mib
            == pytest.approx(40 * 1024 - CUDA_CONTEXT_MIB))
    with pytest.raises(ValueError, match="can only emulate a smaller GPU"):
        emulation.device_limit(200, 143771, params)
    with pytest.raises(ValueError, match="leaves nothing for tensors"):
        emulation.device_limit(1, 143771, params)


def test_nccl_buffers_follow_the_communicators_of_the_cells_layout():
    """Real ranks on 4 x H200 held NCCL memory by layout, not one constant: the model's figure
    for each must be the one measured for that layout, and none where no communicator opens."""
    from trainbench.predict.memory_model import NCCL_MIB_BY_LAYOUT, nccl_buffers_mib, nccl_layout

    def layout(**extra):
        return nccl_layout(resolve({**TINY, "device": "cuda", "gpus": 4, **extra}))

    assert layout(strategy="fsdp") == layout(framework="hf_trainer", strategy="fsdp") == "data"
    assert layout(framework="deepspeed", strategy="zero3") == "zero3"
    assert layout(framework="hf_trainer", strategy="zero3") == "zero3"
    assert layout(framework="deepspeed", strategy="zero2", offload_optimizer=True) == "zero"
    assert layout(strategy="fsdp", tp=2) == "tensor"
    assert layout(framework="deepspeed", strategy="zero1", pp=2) == "pipeline"
    assert len(set(NCCL_MIB_BY_LAYOUT.values())) == len(NCCL_MIB_BY_LAYOUT)
    assert nccl_buffers_mib(resolve({**TINY, "device": "cuda", "gpus": 1})) == 0.0
    # a DeepSpeed engine alone on its GPU still opens a group of one
    one = resolve({**TINY, "device": "cuda", "gpus": 1, "framework": "deepspeed", "strategy": "zero2"})
    assert 0.0 < nccl_buffers_mib(one) < NCCL_MIB_BY_LAYOUT["zero"]
    assert nccl_buffers_mib(resolve({**TINY, "gpus": 4, "strategy": "fsdp"})) == 0.0  # CPU ranks


# --- the fake process group's outputs ------------------------------------------------------------------

FILL_SCRIPT = """
import sys
import torch, torch.distributed as dist
from trainbench.training import emulation
rank = emulation.EmulatedRank(5, 8, 8)
emulation.init_process_group(rank)  # writes what this torch's backend leaves unwritten: here, nothing
assert emulation._fill_outputs(rank, always=True) == ["all_gather_into_tensor", "reduce_scatter_tensor"]
group = dist.new_group([4, 5, 6, 7])  # rank 5 is the group's rank 1
out = torch.full((2,), -1.0)
dist.reduce_scatter_tensor(output=out, input=torch.arange(8.0), group=group)  # FSDP2 passes keywords
world = torch.full((2,), -1.0)
dist.reduce_scatter_tensor(world, torch.arange(16.0))
gathered = torch.full((8,), -1.0)
dist.all_gather_into_tensor(gathered, torch.tensor([1.0, 2.0]), group=group)
objects = ["mine"]
dist.broadcast_object_list(objects, src=0)
print(out.tolist(), world.tolist(), gathered.tolist(), objects)
"""


def test_outputs_the_fake_backend_may_leave_unwritten_are_written_for_the_ranks_place_in_its_group(tmp_path):
    import subprocess

    result = subprocess.run([sys.executable, "-c", FILL_SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-2] == ("[2.0, 3.0] [10.0, 11.0] "
                                             "[1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0] ['mine']")


# --- what an emulated result says -------------------------------------------------------------------------

def test_an_emulated_result_completes_what_one_rank_cannot_see_and_says_so():
    params = resolve({**TINY, "device": "cuda", "gpus": 8, "strategy": "fsdp", "emulate": True})
    metrics = {"gpu_mem_used_mib": [1000.0], "host_mem_peak_mib": 300.0}
    section = emulation.account(metrics, {"rank": 0, "world_size": 8, "ranks_per_node": 8}, params)
    from trainbench.predict.memory_model import EMULATED_CONTEXT_SHORTFALL_MIB, NCCL_MIB_BY_LAYOUT

    nccl = NCCL_MIB_BY_LAYOUT["data"] + EMULATED_CONTEXT_SHORTFALL_MIB
    assert metrics == {"gpu_mem_used_mib": [1000.0 + nccl], "host_mem_peak_mib": 2400.0}
    assert section["measured"] == {"gpu_mem_used_mib": [1000.0], "host_rss_peak_mib": 300.0}
    assert section["modelled"] == {"nccl_buffers_mib": nccl}
    assert set(section["derived"]) == {"gpu_mem_used_mib", "host_mem_peak_mib"}
    assert "communication time" in section["not_measured"]


def test_a_stored_emulated_result_keeps_its_figure_and_the_models_completion_of_now_is_named():
    """A result written when the model added 550 MiB for every layout keeps that figure in its metrics;
    today's figure for its own layout is the memory model's completion, named as such, and the documents
    tables, findings and benches read carry it: they set every emulated rank against the same model."""
    from trainbench.contract.result import METRICS, PREDICTED, PROVENANCE, Emulation, Result, Section
    from trainbench.reporting.documents import reported
    from trainbench.predict.memory_model import completed_gpu_mem_used_mib, emulated_rank_shortfall_mib

    params = resolve({**TINY, "device": "cuda", "gpus": 4, "framework": "deepspeed", "strategy": "zero1",
                      "pp": 2, "emulate": True})
    result = Result(study="t", cell_id="c", status="ok", reason=None, params=params.as_dict(),
                    params_hash="0" * 12, metrics=Section("metrics", METRICS, {"gpu_mem_used_mib": [1550.0]}),
                    predicted=Section("predicted", PREDICTED, {}),
                    provenance=Section("provenance", PROVENANCE, {}),
                    emulation=Emulation(rank=0, world_size=4, ranks_per_node=4, not_measured="time",
                                        measured={"gpu_mem_used_mib": [1000.0]},
                                        modelled={"nccl_buffers_mib": 550.0}))
    added = emulated_rank_shortfall_mib(params)
    assert added > 550.0  # a pipeline's ranks open more communicators than the old constant allowed
    assert completed_gpu_mem_used_mib(result) == ([1000.0 + added], added)
    assert result.metrics.gpu_mem_used_mib == [1550.0]  # the result holds what the file holds
    doc = reported(result)
    assert doc["metrics"]["gpu_mem_used_mib"] == [1000.0 + added]
    assert doc["emulation"]["modelled"]["nccl_buffers_mib"] == added
    real = replace(result, params=params.replace(emulate=False).as_dict(), emulation=None)
    assert completed_gpu_mem_used_mib(real) is None
    assert reported(real)["metrics"]["gpu_mem_used_mib"] == [1550.0]


def _emulated_doc(status="ok", **metrics) -> dict:
    base = {"step_time_s": 2.0, "step_time_s_ci": [1.9, 2.1], "samples_per_s": 4.0,
            "samples_per_s_ci": [3.8, 4.2], "gpu_mem_used_mib": [2048.0]}
    params = resolve({**TINY, "gpus": 4, "strategy": "fsdp", "emulate": True})
    return {"study": "t", "cell_id": "c", "params": params, "status": status, "reason": None,
            "metrics": {**base, **metrics}, "emulation": {"rank": 0, "world_size": 4}}


def test_a_result_that_says_it_is_emulated_must_say_which_rank_of_which_world():
    path = next(REPO.glob("results/runs/megatron/*emulate~true*/metrics.json"))
    doc = read_json(path)
    assert schema_problems(doc) == []
    del doc["emulation"]["world_size"]
    assert any("emulation" in problem and "world_size" in problem for problem in schema_problems(doc))


def test_a_table_shows_an_emulated_row_apart_and_its_timed_figures_as_compute():
    from trainbench.reporting.columns import result_text
    from trainbench.reporting.tables import cell_text, table_rows

    doc = _emulated_doc()
    assert result_text(doc) == "emulated rank 0 of 4: ok"
    row = table_rows([doc], id_keys=[], report=["step_time_ms", "gpu_mem_max_gib"])[0]
    assert cell_text(row, "step_time_ms") == "2,000.0 ± 100.0 (compute)"
    assert cell_text(row, "gpu_mem_max_gib") == "2.00"  # memory is measured, whole
    real = table_rows([{**doc, "emulation": None}], id_keys=[], report=["step_time_ms"])[0]
    assert cell_text(real, "step_time_ms") == "2,000.0 ± 100.0"


def test_findings_use_an_emulated_cell_for_memory_and_fit_never_for_time():
    from trainbench.reporting.findings import _figure, _outcome_cell, Finding, metrics

    known = metrics()
    doc = _emulated_doc()
    assert _figure(known["gpu_mem_max_gib"], doc)[0] == "measured"
    assert _figure(known["samples_per_s"], doc)[0] == "not measured"  # one rank's compute: no whole step
    fits = _outcome_cell(Finding("c", "fits", first={}), doc, "the cell")
    assert fits.outcome == "holds" and fits.status == "trains (emulated rank 0 of 4)"


def test_compare_never_sets_an_emulated_rank_against_a_real_run(tmp_path):
    from trainbench.reporting.compare import compare

    def write(root: Path, emulated: bool) -> None:
        doc = json.loads((REPO / "results/runs/megatron").glob("*/metrics.json").__next__().read_text())
        if emulated:
            doc["emulation"] = {"rank": 0, "world_size": 8, "ranks_per_node": 8,
                                "not_measured": emulation.NOT_MEASURED}
        doc["params_hash"] = CellParams.from_dict(doc["params"]).params_hash
        (root / "s" / "c").mkdir(parents=True)
        (root / "s" / "c" / "metrics.json").write_text(json.dumps(doc))

    write(tmp_path / "a", emulated=False)
    write(tmp_path / "b", emulated=True)
    comparison = compare(tmp_path / "a", tmp_path / "b")
    assert len(comparison.cells) == 1 and not comparison.cells[0].repeated and not comparison.cells[0].changes


def test_the_memory_model_judges_an_emulated_run_on_the_node_it_stands_for():
    from trainbench.predict.memory_model import hardware_of_run

    path = next((REPO / "results/runs/llama").glob(
        "strategy~fsdp__model~llama-13b__gpus~8*gpu_mem_limit_gib~80"))
    doc = read_reported(path / "metrics.json")
    hardware = hardware_of_run(doc)
    assert hardware.gpu_mem_mib == 80 * 1024 and hardware.gpus_per_node == 8
    assert hardware.host_mem_mib == pytest.approx(8 * doc["provenance"]["host_mem_total_mib"])
    assert predict(CellParams.from_dict(doc["params"]), hardware).fits is True and doc["status"] == "ok"


# --- rank for rank against real worlds ---------------------------------------------------------------------

# DeepSpeed's engine takes fp16 on a CPU that computes it (cellrun.no_fp16_here), bf16 elsewhere
DEEPSPEED_HALF = "fp16" if cpu_computes_fp16() else "bf16"

RANK_FOR_RANK = [
    # (cell, the ranks to emulate)
    # (a replicated model, DDP's or ZeRO-0's, is every rank's whole: the cases shard, split or stage it)
    ({"strategy": "fsdp", "gpus": 4, "tp": 2, "precision": "fp16"}, [0, 3]),  # both halves of both dims
    ({"framework": "deepspeed", "strategy": "zero2", "gpus": 2, "offload_optimizer": True,
      "precision": DEEPSPEED_HALF}, [0, 1]),
    ({"framework": "deepspeed", "strategy": "zero3", "gpus": 4, "tp": 2}, [0, 3]),
    ({"framework": "deepspeed", "strategy": "zero1", "gpus": 4, "pp": 2, "grad_accum": 2}, [0, 3]),
    ({"framework": "hf_trainer", "model": "llama-tiny", "strategy": "zero3", "gpus": 2,
      "offload_optimizer": True, "offload_param": True}, [1]),
    ({"framework": "lightning", "model": "distilbert-tiny", "head": "classifier", "strategy": "ddp",
      "gpus": 2}, [1]),
]


def _ids(case) -> str:
    cell, _ = case
    return "-".join(f"{k}={v}" for k, v in cell.items() if k not in ("head",))


@pytest.mark.parametrize("case", RANK_FOR_RANK, ids=[_ids(c) for c in RANK_FOR_RANK])
def test_an_emulated_rank_holds_what_the_real_rank_of_its_number_holds(case, tmp_path):
    params, ranks = case
    real = run(make_cell(**params), tmp_path / "real")["metrics"]
    assert len(real["tensors_held_bytes_per_rank"]) == params["gpus"]
    for rank in ranks:
        doc = run(make_cell(**params, emulate=True, emulate_rank=rank), tmp_path / f"rank{rank}")
        emulated = doc["metrics"]
        assert doc["emulation"]["rank"] == rank and doc["emulation"]["world_size"] == params["gpus"]
        assert emulated["params_held_per_rank"] == [real["params_held_per_rank"][rank]], rank
        held, expected = (emulated["tensors_held_bytes_per_rank"][0]["cpu"],
                          real["tensors_held_bytes_per_rank"][rank]["cpu"])
        assert abs(held - expected) <= SCALAR_SLACK_BYTES, (rank, held, expected)
        assert math.isfinite(emulated["loss_first"]) and math.isfinite(emulated["loss_last"])
        assert "worker" in doc["provenance"]["command"] and "torchrun" not in doc["provenance"]["command"]
    # the comparison a multi-GPU host runs (`trainbench check-models emulation`) pairs each emulated rank
    # with its real twin's rank and finds what the checks above found; CPU ranks have no device memory to
    # set beside
    bench = subprocess.run([sys.executable, "-m", "trainbench", "check-models", "emulation", str(tmp_path)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr
    assert f"parameter shards the same on {len(ranks)} of {len(ranks)}" in bench.stdout
    held_line = next(line for line in bench.stdout.splitlines() if line.startswith("tensors kept"))
    worst_held = float(held_line.split("worst |error| ")[1].split("%")[0])
    assert worst_held < 0.01
    assert f"host memory: {len(ranks)} ranks" in bench.stdout and "device memory" not in bench.stdout


# --- worlds larger than any test machine ------------------------------------------------------------------

def _fsdp_rows(rows: int, world: int, rank: int) -> int:
    """Rows of a dim-0 FSDP2 shard: torch.chunk's split of `rows` into `world` pieces."""
    size = -(-rows // world)
    return max(0, min(size, rows - rank * size))


def _expected_fsdp_shard(world: int, rank: int) -> int:
    import torch

    from trainbench.training.gpt import GPT

    with torch.device("meta"):
        model = GPT(get_model("gpt2-tiny"))
    total = 0
    for parameter in model.parameters():
        rows = parameter.shape[0]
        total += _fsdp_rows(rows, world, rank) * (parameter.numel() // rows)
    return total


def _expected_zero3_shard(world: int) -> int:
    """DeepSpeed ZeRO-3 pads every parameter to a multiple of the world and keeps 1/world of it."""
    import torch

    from trainbench.training.gpt import GPT

    with torch.device("meta"):
        model = GPT(get_model("gpt2-tiny"))
    return sum(-(-p.numel() // world) for p in model.parameters())


def test_a_real_world_shards_as_the_rule_the_large_emulated_worlds_are_held_to(tmp_path):
    """The sharding rules below, checked against a real 4-rank world, rank by rank."""
    fsdp = run(make_cell(strategy="fsdp", gpus=4), tmp_path / "fsdp")["metrics"]
    assert fsdp["params_held_per_rank"] == [_expected_fsdp_shard(4, r) for r in range(4)]
    zero3 = run(make_cell(framework="deepspeed", strategy="zero3", gpus=4), tmp_path / "zero3")["metrics"]
    assert zero3["params_held_per_rank"] == [_expected_zero3_shard(4)] * 4


@pytest.mark.parametrize("rank", [0, 63])
def test_one_rank_of_64_under_fsdp_trains_on_its_shard(rank, tmp_path):
    doc = run(make_cell(strategy="fsdp", gpus=64, emulate=True, emulate_rank=rank), tmp_path)
    assert doc["metrics"]["params_held_per_rank"] == [_expected_fsdp_shard(64, rank)]
    assert doc["metrics"]["params_total"] == get_model("gpt2-tiny").param_count()
    assert doc["emulation"]["world_size"] == 64 and doc["metrics"]["host_mem_peak_mib"] == pytest.approx(
        64 * doc["emulation"]["measured"]["host_rss_peak_mib"], abs=0.2)


@pytest.mark.parametrize("rank", [0, 15])
def test_one_rank_of_16_under_zero3_trains_on_its_shard(rank, tmp_path):
    doc = run(make_cell(framework="deepspeed", strategy="zero3", gpus=16, emulate=True, emulate_rank=rank),
              tmp_path)
    assert doc["metrics"]["params_held_per_rank"] == [_expected_zero3_shard(16)]
    assert doc["metrics"]["params_total"] == get_model("gpt2-tiny").param_count()


# --- through the workflow and the command line -------------------------------------------------------------

def test_a_study_measures_a_cell_and_its_emulated_rank_apart_and_tabulates_both(workflow):
    study = tiny_study(strategy="fsdp", gpus=2)
    study["include"] = [{"emulate": False}, {"emulate": True}]
    workflow.write_config({"default_studies": {"without_gpus": ["t"], "with_gpus": ["t"]},
                           "studies": {"t": study}})
    workflow.snakemake("results/tables/t.md")
    real = read_json(workflow.path("results/runs/t/emulate~false/metrics.json"))
    emulated = read_json(workflow.path("results/runs/t/emulate~true/metrics.json"))
    assert "emulation" not in real and emulated["emulation"]["rank"] == 0
    assert len(real["metrics"]["host_rss_peak_mib_per_rank"]) == 2
    assert len(emulated["metrics"]["host_rss_peak_mib_per_rank"]) == 1
    table = workflow.path("results/tables/t.all.md").read_text()  # every column, by the keys it varies
    # (a cell timed on a busy machine may also read "noisy" after its result: its timing, not its outcome)
    noisy = r"(, noisy \(±[\d.]+%\))?"
    assert re.search(rf"\| no \| ok{noisy} \|", table), table
    assert re.search(rf"\| yes \| emulated rank 0 of 2: ok{noisy} \|", table), table
    summary = workflow.path("results/tables/t.md").read_text()
    assert "(compute)" in table and "(compute)" in summary and "Emulated rows (1 here)" in summary
    assert re.search(r"\| 2, emulated \| ok", summary), summary


def test_fit_runs_one_rank_of_a_configured_cell_and_says_whether_it_fits(workflow):
    study = tiny_study(gpus=4)
    study["include"] = [{"strategy": "fsdp"}]
    workflow.write_config({"default_studies": {"without_gpus": ["t"], "with_gpus": ["t"]},
                           "studies": {"t": study}})
    result = workflow.shell("trainbench fit t strategy~fsdp --rank 3")
    assert "as rank 3 of 4 (4 per node): fits (emulated rank 3 of 4: ok)" in result.stdout
    assert "per node of 4 ranks (derived)" in result.stdout and "memory model:" in result.stdout
    written = workflow.path("results/fit/t/strategy~fsdp__emulate~true__emulate_rank~3/metrics.json")
    assert read_json(written)["emulation"]["rank"] == 3
    again = workflow.shell("trainbench fit t strategy~fsdp --rank 3")
    assert "already measured" in again.stdout
    searched = workflow.shell("trainbench fit t strategy~fsdp --search --max-micro-batch 4")
    assert "largest micro batch that trains: 4 (global batch 16); none failed up to 4" in searched.stdout
    refused = workflow.shell("trainbench fit t nosuchcell", check=False)
    assert refused.returncode == 2 and "has no cell 'nosuchcell'" in refused.stderr


def test_the_published_emulated_cells_say_what_they_are():
    docs = [read_reported(p) for p in REPO.glob("results/runs/*/*emulate~true*/metrics.json")]
    ran = [d for d in docs if d["status"] in ("ok", "oom")]
    assert len(docs) >= 40 and {"llama", "megatron", "zero3_pipeline"} <= {d["study"] for d in docs}
    for doc in ran:
        section = doc["emulation"]
        assert section["world_size"] == doc["params"]["gpus"] and section["ranks_per_node"] == doc["params"][
            "gpus_per_node"]
        assert len(doc["metrics"]["gpu_mem_used_mib"]) == 1  # one GPU, whatever the world
        if doc["params"]["gpu_mem_limit_gib"]:
            assert doc["device_limit"]["limit_mib"] == doc["params"]["gpu_mem_limit_gib"] * 1024
            # the measured peak stays within the GPU it was held to
            assert max(section["measured"]["gpu_mem_used_mib"]) <= doc["device_limit"]["limit_mib"] + 512


def test_fit_reports_an_emulated_gpu_ranks_whole_step_with_its_worlds_wait():
    """`trainbench fit`'s report of a GPU rank: its measured step, and that plus the time model's wait of
    its world (here a published emulated last stage of a 2-stage pipeline: its bubble)."""
    from trainbench import fit
    from trainbench.predict import time_model
    from trainbench.registry.hardware import gpu_type_of
    from trainbench.study.params import CellParams

    runs = REPO / "validation/results/runs/emulated_whole_step"
    doc = json.loads(next(runs.glob("*pp~2*emulate~true*/metrics.json")).read_text())
    gpu = gpu_type_of(doc["provenance"]["gpu_name"])
    wait = time_model.waiting_s(CellParams.from_dict(doc["params"]), gpu,
                                cpu_threads=time_model.threads_of_run(doc))
    assert wait > 0.05  # a quarter of the stage's step more, for 4 micro batches through 2 stages
    said = "\n".join(fit.report(doc))
    whole = doc["metrics"]["step_time_s"] + wait
    assert f"whole step: {whole:.3f} s" in said and f"({wait:.3f} s:" in said
    # and how far measured pipelines' real steps came from theirs (the committed bands), in seconds here
    band = time_model.whole_step_band(CellParams.from_dict(doc["params"]))
    assert band["ranks"] >= 2 and band["low"] <= band["median"] <= band["high"]
    assert (f"(tensor or pipeline parallel, {band['ranks']} ranks) stepped "
            f"{band['low']:.2f}-{band['high']:.2f} x their whole step: "
            f"{whole * band['low']:.3f}-{whole * band['high']:.3f} s here") in said
