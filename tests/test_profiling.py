"""Profiles of cells: torch.profiler over steps after the timed ones, and where a step's time went."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from trainbench.contract.result import PARTS
from trainbench.execute.profiling import MEMORY_CATEGORIES, breakdown, read_trace, summarise_memory
from trainbench.reporting.columns import expand_sets, report_problems
from trainbench.reporting.plots import write_plots
from trainbench.reporting.predictions import MODEL_PARTS, parts_compared
from trainbench.reporting.tables import table_rows
from trainbench.study.config import load_config
from trainbench.study.timing import TimingSettings, fixed_step_count
from trainbench.training import OPTIMIZER_RANGE
from trainbench.workflow import Workflow

from trainbench.cli import main
from trainbench.reporting.documents import read_reported

from conftest import REPO, tiny_study
from test_cellrun import make_cell, run


def span(name, ts, dur, cat="kernel", tid=7, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid, "args": args}


def test_each_instant_of_a_gpu_step_goes_to_the_first_part_active_then():
    # one 100 us step on the host thread (tid 1); kernels on streams 7 (compute) and 8 (NCCL)
    events = [
        span("ProfilerStep#1", 0, 100, cat="user_annotation", tid=1),
        span("ProfilerStep#1", 1, 99, cat="gpu_user_annotation", tid=7),  # the same step, device side
        span("ampere_bf16_s16816gemm_128x64", 0, 20),               # matmul 0-20
        span("flash_fwd_kernel", 20, 10),                            # attention 20-30
        span("vectorized_elementwise_kernel", 30, 10),               # other 30-40
        span("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 35, 25, tid=8),  # 35-40 hidden, 40-60 exposed
        span("Memcpy HtoD (Pageable -> Device)", 55, 10, cat="gpu_memcpy"),  # 60-65 exposed copy
        span(OPTIMIZER_RANGE, 66, 30, cat="user_annotation", tid=1),  # host in the optimizer 66-96
        span("cudaLaunchKernel", 67, 1, cat="cuda_runtime", tid=1, correlation=42),
        span("multi_tensor_apply_kernel", 90, 4, correlation=42),    # the optimizer's kernel 90-94
    ]
    found = breakdown(events)
    us = {part: round(seconds * 1e6, 3) for part, seconds in found["parts_s"].items()}
    assert us == {"matmul": 20, "attention": 10, "other_kernels": 10, "optimizer_kernels": 4,
                  "exposed_communication": 20, "exposed_copies": 5, "optimizer_host": 26, "idle": 5}
    assert sum(found["parts_s"].values()) == pytest.approx(found["step_s"])
    assert found["timeline"] == "cuda" and found["steps"] == 1
    assert found["communication_s"] == pytest.approx(25e-6)
    assert found["communication_hidden"] == pytest.approx(0.2)  # 5 of its 25 us under compute


def test_a_step_whose_closure_runs_forward_and_backward_is_the_optimizer_only_by_kernel_name():
    # Lightning: optimizer.step(closure) runs forward and backward inside torch's optimizer range
    events = [
        span("ProfilerStep#1", 0, 100, cat="user_annotation", tid=1),
        span("Optimizer.step#Adam.step", 0, 100, cat="user_annotation", tid=1),
        span("autograd::engine::evaluate_function: MmBackward0", 40, 5, cat="cpu_op", tid=2),
        span("cudaLaunchKernel", 1, 1, cat="cuda_runtime", tid=1, correlation=1),
        span("nvjet_sm90_tst_256x128_64x4", 10, 50, correlation=1),
        span("multi_tensor_apply_kernel", 70, 20, correlation=2),
    ]
    us = {part: round(seconds * 1e6, 3) for part, seconds in breakdown(events)["parts_s"].items()}
    assert us["matmul"] == 50 and us["optimizer_kernels"] == 20
    assert us["optimizer_host"] == 0 and us["idle"] == 30  # not the optimizer's host time either


def test_a_trace_without_profiled_steps_is_refused():
    with pytest.raises(ValueError, match="ProfilerStep"):
        breakdown([span("gemm", 0, 10)])


def test_a_ddp_cell_on_cpu_ranks_profiles_steps_after_its_timed_ones(tmp_path):
    """Two gloo ranks: each keeps a trace, the breakdown's parts add up to its step and show the
    all-reduce of the gradients; the timed figures come from the windows alone."""
    cell = make_cell(strategy="ddp", gpus=2, timed_steps=4)
    cell = dataclasses.replace(cell, timing=dataclasses.replace(cell.timing, profile_steps=2))
    doc = run(cell, tmp_path)
    assert doc["status"] == "ok", doc["reason"]
    m = doc["metrics"]
    found = m["breakdown"]
    assert found["timeline"] == "cpu" and found["steps"] == 2
    assert set(found["parts_s"]) == set(PARTS)
    assert sum(found["parts_s"].values()) == pytest.approx(found["step_s"], rel=1e-3)
    assert found["communication_s"] > 0 and found["parts_s"]["matmul"] > 0
    assert found["parts_s"]["optimizer_kernels"] > 0
    assert [r["steps"] for r in m["breakdown_per_rank"]] == [2, 2]
    kept = tmp_path / "results/runs/t/c/profile"
    for rank in (0, 1):
        events = read_trace(kept / f"rank{rank}.json.gz")
        assert sum(e.get("name", "").startswith("ProfilerStep#") for e in events) == 2
        assert any(e.get("name", "").startswith("gloo:all_reduce") for e in events)
    assert found["trace"] == "profile/rank0.json.gz"
    # the profiled steps are not timed: windows and losses are the warm-up's and the timed steps'
    assert m["steps_timed"] == sum(1 for _ in m["step_times_s"]) * m["steps_per_window"]
    assert m["phases_s"]["profiled"] > 0
    # the traces are the measurement: read again (`trainbench breakdown`), they give the same parts
    result = tmp_path / "results/runs/t/c/metrics.json"
    assert main(["breakdown", str(result)]) == 0
    assert read_reported(result)["metrics"]["breakdown_per_rank"] == m["breakdown_per_rank"]

    # a rerun without profiling leaves no profile of the earlier run beside the new result
    cell = dataclasses.replace(cell, timing=dataclasses.replace(cell.timing, profile_steps=0))
    doc = run(cell, tmp_path)
    assert "breakdown" not in doc["metrics"] and not kept.exists()


def test_a_framework_that_owns_its_loop_runs_the_profiled_steps_too(tmp_path):
    timing = TimingSettings(min_windows=2, profile_steps=1)
    assert fixed_step_count(1, 2, timing) == fixed_step_count(1, 2, TimingSettings(min_windows=2)) + 2
    cell = make_cell(framework="lightning", model="distilbert-tiny", head="classifier", seq_len=16,
                     strategy="single", gpus=1, timed_steps=2)
    doc = run(dataclasses.replace(cell, timing=dataclasses.replace(cell.timing, profile_steps=1)), tmp_path)
    assert doc["status"] == "ok", doc["reason"]
    assert doc["metrics"]["breakdown"]["steps"] == 1
    # Lightning's optimizer step is torch's, annotated by torch itself
    assert doc["metrics"]["breakdown"]["parts_s"]["optimizer_kernels"] > 0


def profiled_doc() -> dict:
    """A published H200 result, given the breakdown of a profile whose steps took half its timed step."""
    doc = read_reported(REPO / "results/runs/baseline"
                      / "strategy~single__model~gpt2-124m__gpus~1__micro_batch~32/metrics.json")
    step = doc["metrics"]["step_time_s"]
    parts = dict.fromkeys(PARTS, 0.0) | {"matmul": 0.3 * step, "other_kernels": 0.1 * step,
                                         "idle": 0.1 * step}
    doc["metrics"]["breakdown"] = {"timeline": "cuda", "steps": 2, "step_s": step / 2, "parts_s": parts,
                                   "communication_s": 0.0, "communication_hidden": None}
    return doc


def test_the_breakdown_columns_are_a_set_a_study_can_ask_for_and_show_shares():
    assert report_problems("s", ["breakdown", "mfu"]) == []
    assert "breakdown" in report_problems("s", ["breakdwn"])[0]  # did you mean
    columns = expand_sets(["breakdown"])
    assert columns[:len(PARTS)] == [f"time_{p}" for p in PARTS]
    [row] = table_rows([profiled_doc()], id_keys=[], report=columns)
    assert row["time_matmul"] == pytest.approx(0.6) and row["time_idle"] == pytest.approx(0.2)


def test_the_time_model_parts_are_held_against_the_profile_at_the_timed_step(tmp_path):
    doc = profiled_doc()
    compared = parts_compared(doc)
    assert set(compared) == set(MODEL_PARTS)
    # the profile's shares applied to the timed step: compute 80%, the host's idle time 20%
    step = doc["metrics"]["step_time_s"]
    assert compared["compute"][0] == pytest.approx(0.8 * step)
    assert compared["framework"][0] == pytest.approx(0.2 * step)
    assert all(predicted > 0 for _, predicted in (compared["compute"], compared["optimizer"]))
    write_plots([doc, {**doc, "cell_id": "d", "status": "oom"}], study="t", id_keys=["strategy"],
                directory=tmp_path, profiled=True)
    assert (tmp_path / "breakdown.png").stat().st_size > 10_000


def test_a_study_that_profiles_has_a_breakdown_plot_in_its_plots_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # results/ of the test's own, empty
    plain = {**tiny_study(strategy="single", gpus=1), "axes": {"micro_batch": [1, 2]}}
    profiled = {**plain, "timing": {**plain["timing"], "profile_steps": 2}}
    config = {"studies": {"p": profiled, "q": plain}, "default_studies": {"without_gpus": ["p", "q"]}}
    workflow = Workflow(load_config(config))
    assert workflow.config.study("p").profiled and not workflow.config.study("q").profiled
    outputs = workflow.final_output(have_gpus=False)
    assert {"results/plots/p", "results/plots/q"} <= set(outputs)
    # rule study_plots draws the breakdown of a study that profiles (make_plots.py: study.profiled)
    for name in ("p", "q"):
        written = write_plots([profiled_doc()], study=name, id_keys=["micro_batch"],
                              directory=tmp_path / name, profiled=workflow.config.study(name).profiled)
        assert ("breakdown.png" in [path.name for path in written]) == (name == "p")
    # once a cell has a profile: a study none of whose cells has one yet gets no placeholder plot
    unprofiled = {**profiled_doc(), "metrics": {k: v for k, v in profiled_doc()["metrics"].items()
                                                if k != "breakdown"}}
    written = write_plots([unprofiled], study="p", id_keys=["micro_batch"], directory=tmp_path / "none",
                          profiled=True)
    assert [path.name for path in written] == ["memory.png", "throughput.png"]



def test_a_memory_snapshot_is_read_at_its_peak_by_category():
    # blocks live at the snapshot: a parameter (at address 1) and an optimizer state (2); the history
    # allocated an activation (3, 40 MiB) and a gradient (4, 20 MiB) and freed both before the end
    m = 1 << 20
    snapshot = {
        "segments": [{"total_size": 1000 * m, "allocated_size": 30 * m, "blocks": [
            {"address": 1, "size": 10 * m, "state": "active_allocated"},
            {"address": 2, "size": 20 * m, "state": "active_allocated"},
            {"address": 5, "size": 900 * m, "state": "inactive"}]}],
        "device_traces": [[
            {"action": "alloc", "addr": 3, "size": 40 * m}, {"action": "alloc", "addr": 4, "size": 20 * m},
            {"action": "free_requested", "addr": 3, "size": 40 * m},
            {"action": "free_completed", "addr": 3, "size": 40 * m},
            {"action": "free_completed", "addr": 4, "size": 20 * m}]]}
    summary = summarise_memory(snapshot, {"parameters": {1}, "optimizer_states": {2}, "gradients": {4}})
    assert summary["peak_allocated_mib"] == 90 and summary["history"]
    assert summary["allocated_mib"] == 30 and summary["reserved_mib"] == 1000
    assert summary["peak_by_category_mib"] == {"parameters": 10, "gradients": 20, "optimizer_states": 20,
                                               "activations_and_other": 40}
    assert set(summary["peak_by_category_mib"]) == set(MEMORY_CATEGORIES)
    # without history, the snapshot's own blocks are all there is
    summary = summarise_memory({**snapshot, "device_traces": [[]]}, {"parameters": {1}})
    assert summary["peak_allocated_mib"] == 30 and not summary["history"]
    assert summary["peak_by_category_mib"]["activations_and_other"] == 20


def test_a_runner_names_its_parameters_gradients_and_optimizer_states(tmp_path):
    import torch

    from trainbench.training.runners import RunContext
    from trainbench.training.runners.load import make_runner

    cell = make_cell(strategy="single", gpus=1)
    runner = make_runner(RunContext(cell.params, 0, 1, 0, torch.device("cpu"), tmp_path))
    runner.setup()
    runner.train_step()
    found = runner.memory_tensors()
    parameters = list(runner.model().parameters())
    assert len(found["parameters"]) == len(parameters)
    # AdamW's two moments per parameter (and its step counts), none of them a parameter
    states = {id(t) for t in found["optimizer_states"]}
    for p in parameters:
        moments = runner.optimizer.state[p]
        assert {id(moments["exp_avg"]), id(moments["exp_avg_sq"])} <= states
    assert not states & {id(p) for p in parameters}


FSDP_RANK = """
import torch
from trainbench.study.params import CellParams
from trainbench.training import emulation
from trainbench.training.runners import RunContext
from trainbench.training.runners.load import make_runner

params = CellParams.resolve({"model": "gpt2-tiny", "device": "cpu", "seq_len": 16, "micro_batch": 2,
                             "gpus": 2, "strategy": "fsdp", "framework": "torch"})
emulation.init_process_group(emulation.EmulatedRank(0, 2, 2))
runner = make_runner(RunContext(params, 0, 2, 0, torch.device("cpu")))
runner.setup()
runner.train_step()
found = runner.memory_tensors()
# every tensor one whose storage a snapshot's blocks can be matched against: no DTensor left
assert found["parameters"] and found["optimizer_states"]  # the step's end set the gradients to None
for category, tensors in found.items():
    for t in tensors:
        assert type(t) is torch.Tensor or type(t) is torch.nn.Parameter, (category, type(t))
        t.untyped_storage().data_ptr()
# each parameter's AdamW moments among the states, as the local shards the rank holds
states = {t.untyped_storage().data_ptr() for t in found["optimizer_states"]}
for p in runner.model().parameters():
    moments = runner.optimizer.state[p]
    assert {moments[m].to_local().untyped_storage().data_ptr() for m in ("exp_avg", "exp_avg_sq")} <= states
print("ok", {c: len(t) for c, t in found.items()})
"""


def test_an_fsdp2_rank_names_its_shards_of_gradients_and_optimizer_states_as_plain_tensors():
    """FSDP2's gradients and AdamW states are DTensors: a memory snapshot matches blocks by storage, so
    the runner names their local shards (rank 0 of 2 through the fake process group, in a process of
    its own)."""
    run = subprocess.run([sys.executable, "-c", FSDP_RANK], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("ok")


def test_trainbench_profile_runs_one_cell_again_with_its_steps_profiled(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    study = {**tiny_study(strategy="single", gpus=1), "axes": {"micro_batch": [1, 2]}}
    (tmp_path / "config.yaml").write_text(json.dumps({"studies": {"t": study},
                                                      "default_studies": {"without_gpus": ["t"]}}))
    assert main(["profile", "t", "micro_batch~2", "--steps", "2"]) == 0
    doc = read_reported(tmp_path / "results/runs/t/micro_batch~2/metrics.json")
    assert doc["status"] == "ok" and doc["metrics"]["breakdown"]["steps"] == 2
    assert doc["metrics"]["timing"]["profile_steps"] == 2
    assert (tmp_path / "results/runs/t/micro_batch~2/profile/rank0.json.gz").exists()
    assert "of a" in capsys.readouterr().out  # the shares, printed
    assert not (tmp_path / "results/runs/t/micro_batch~1").exists()  # that cell alone
    assert main(["profile", "t", "micro_batch~3"]) != 0  # no such cell: said, nothing run
    assert "has no cell 'micro_batch~3'" in capsys.readouterr().err


def test_kernels_are_sorted_into_the_classes_a_breakdown_names_by_their_names():
    """KERNEL_CLASSES on kernels an H200's traces hold: cuBLAS's and cuDNN's by their families, inductor's
    by what it fused (its loss apart), the fused optimizer's and the copies by theirs."""
    from trainbench.execute.profiling import classify

    assert classify("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT") == "matmul"
    assert classify("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26") == "attention"
    assert classify("triton_red_fused__log_softmax__to_copy__unsafe_view_prepare_softmax_online") == "loss"
    assert classify("triton_poi_fused_gelu_gelu_backward_view") == "fused (compiler)"
    assert classify("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert classify("Memcpy HtoD (Pageable -> Device)") == "copies and fills"
    assert classify("a kernel no pattern knows") == "other"
