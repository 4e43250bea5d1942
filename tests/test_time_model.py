"""The time model: what each strategy moves over which link, the parts that must grow with their cause,
the fit recovering constants it was given, the hardware table, and `trainbench predict`'s time columns."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
import subprocess
import sys

import numpy as np
import pytest

from trainbench.predict import time_model
from trainbench.predict.communication import Interconnect, interconnect_of, step_collectives
from trainbench.study.config import load_config
from trainbench.registry.hardware import GPUS, gpu_type_named_in, gpu_type_of
from trainbench.predict.memory_model import hardware_from_args
from trainbench.registry.models import get_model
from trainbench.study.params import CellParams

from conftest import PROJECT_CONFIG, REPO

H200 = GPUS["h200"]
NVLINK = H200.nvlink_gb_s * 1e9
# links with no table at NVLink's full bandwidth: a group's seconds x NVLINK are the bytes it moves
BYTES = Interconnect("h200", {}, 1.0)


def bytes_work(params: CellParams, gpu=H200):
    return time_model.work(params, gpu, links=BYTES)


def cell(**changes) -> CellParams:
    """A cell's parameters: the schema's defaults, a GPU cell of GPT-345M, the changes."""
    return CellParams.resolve({"framework": "deepspeed", "model": "gpt-345m", "strategy": "zero1",
                               "device": "cuda", "gpus": 4, "nodes": 1, "micro_batch": 4, "grad_accum": 1,
                               "precision": "fp16", "seq_len": 1024, "tp": 1, "pp": 1, **changes})


def psi(model: str = "gpt-345m") -> float:
    return get_model(model).param_count()


def test_ddp_all_reduces_fp32_gradients_once_per_step_behind_the_last_backward():
    w = bytes_work(cell(framework="torch", strategy="ddp", precision="bf16", grad_accum=4))
    assert w.overlapped_link_s * NVLINK == pytest.approx(2 * 3 / 4 * 4 * psi())  # 2(n-1)/n x fp32 gradients
    assert w.overlap_budget == pytest.approx(2 / 3 / 4)  # the last of 4 micro batches' backward
    assert w.sync_link_s == 0


def test_zero_stages_move_what_the_zero_paper_says():
    n, b = 4, 2  # ranks, fp16 bytes
    zero0 = bytes_work(cell(strategy="zero0"))
    assert zero0.sync_link_s * NVLINK == pytest.approx(2 * (n - 1) / n * b * psi())  # an all-reduce
    zero1 = bytes_work(cell(strategy="zero1", grad_accum=3))
    # the gradients all-reduced once in buckets (each rank keeps its partition, DeepSpeed's default
    # use_multi_rank_bucket_allreduce), the updated weights all-gathered
    assert zero1.sync_link_s * NVLINK == pytest.approx((2 + 1) * (n - 1) / n * b * psi())
    zero2 = bytes_work(cell(strategy="zero2", grad_accum=3))
    # ZeRO-2 all-reduces every micro batch's gradients
    assert zero2.sync_link_s * NVLINK == pytest.approx((3 * 2 + 1) * (n - 1) / n * b * psi())
    zero3 = bytes_work(cell(strategy="zero3", grad_accum=3, activation_checkpointing=True))
    # the blocks' weights gathered for forward, recomputation and backward, the embeddings' for forward
    # and backward, all gradients reduce-scattered, per micro batch
    blocks = get_model("gpt-345m").n_layer * get_model("gpt-345m").block_params()
    root = psi() - blocks
    assert zero3.overlapped_link_s * NVLINK == pytest.approx(
        3 * (3 * blocks + 2 * root + psi()) * (n - 1) / n * b)
    assert zero3.sync_link_s == 0 and zero3.calls > 0


def test_fsdp_gathers_for_forward_and_backward_and_reduces_once():
    w = bytes_work(cell(framework="torch", strategy="fsdp", precision="bf16", grad_accum=2,
                        tuning="framework"))
    # bf16 blocks gathered twice per micro batch, the root (embeddings) once, fp32 gradients
    # reduce-scattered once (torch FSDP2)
    blocks = get_model("gpt-345m").n_layer * get_model("gpt-345m").block_params()
    root = psi() - blocks
    assert w.overlapped_link_s * NVLINK == pytest.approx(
        (2 * 2 * 2 * blocks + 2 * 2 * root + 4 * psi()) * 3 / 4)
    # at its best practice the weights stay gathered across the accumulation: one all-gather a step
    best = bytes_work(cell(framework="torch", strategy="fsdp", precision="bf16", grad_accum=2))
    assert best.overlapped_link_s * NVLINK == pytest.approx((2 + 4) * 3 / 4 * psi())


def test_fsdp2_blocks_compiled_one_by_one_move_the_elementwise_bytes_of_a_model_compiled_whole():
    """Compiled blocks, one by one under FSDP2 or in a model compiled whole, keep for backward what
    uncompiled blocks keep (the memory model's count, from allocator snapshots) but take the time of a
    model compiled whole: the time model's elementwise traffic is the compiled list's."""
    from trainbench.predict.memory_model import block_bytes_per_token

    spec = get_model("gpt2-124m")
    gpt2 = {"framework": "torch", "model": "gpt2-124m", "precision": "bf16"}
    compiled, eager = (cell(**gpt2, strategy="fsdp", gpus=2, compile=c) for c in (True, False))
    kept, moved = block_bytes_per_token(compiled, spec), block_bytes_per_token(compiled, spec, traffic=True)
    assert moved < kept == block_bytes_per_token(eager, spec, traffic=True)
    assert bytes_work(compiled).elementwise_s == pytest.approx(bytes_work(eager).elementwise_s * moved / kept)
    whole, whole_eager = (cell(**gpt2, strategy="single", gpus=1, compile=c) for c in (True, False))
    assert block_bytes_per_token(whole, spec) == block_bytes_per_token(whole_eager, spec)
    assert block_bytes_per_token(whole, spec, traffic=True) < block_bytes_per_token(whole, spec)


def test_tensor_parallel_all_reduces_grow_with_the_layers_and_the_batch():
    small = bytes_work(cell(model="bert-180b-l4", strategy="zero0", gpus=4, tp=4, seq_len=2048))
    big = bytes_work(cell(model="bert-180b", strategy="zero0", gpus=4, tp=4, seq_len=2048))
    assert big.calls == 24 * small.calls and big.micro_link_s == pytest.approx(24 * small.micro_link_s)
    # 4 all-reduces a block (2 forward, 2 backward) of micro batch x sequence x width, 2(t-1)/t of it each
    d = get_model("bert-180b-l4").d_model
    assert small.micro_link_s * NVLINK == pytest.approx(4 * 4 * 2 * 3 / 4 * 4 * 2048 * d * 2)
    doubled = bytes_work(cell(model="bert-180b-l4", strategy="zero0", gpus=4, tp=4, seq_len=2048,
                              micro_batch=8))
    assert doubled.micro_link_s == pytest.approx(2 * small.micro_link_s)


def test_collectives_across_nodes_run_at_the_network_cards_of_the_groups_ranks_on_a_node():
    one = bytes_work(cell(strategy="zero0", gpus=8, nodes=1))
    # 4 ranks a node: their 4 cards of 50 GB/s carry the ring across the node's boundary
    two = bytes_work(cell(strategy="zero0", gpus=8, nodes=2))
    assert two.sync_link_s / one.sync_link_s == pytest.approx(H200.nvlink_gb_s / (4 * H200.network_gb_s))
    # 8 ranks a node: 400 GB/s, the NVLink ring inside the node still the faster
    full = bytes_work(cell(strategy="zero0", gpus=16, nodes=2))
    bus = sum(c.bus_bytes() for c in step_collectives(cell(strategy="zero0", gpus=16, nodes=2)))
    assert full.sync_link_s == pytest.approx(bus / (8 * H200.network_gb_s * 1e9))
    # data parallelism over tensor-parallel groups of 8: one rank of each data-parallel group a node,
    # one card
    inside = bytes_work(cell(strategy="zero0", gpus=16, nodes=2, tp=8))
    bus = sum(c.bus_bytes() for c in step_collectives(cell(strategy="zero0", gpus=16, nodes=2, tp=8))
              if c.group == "dp")
    assert inside.sync_link_s == pytest.approx(bus / (H200.network_gb_s * 1e9))
    # tensor parallelism inside a node stays on NVLink however many nodes the data parallelism spans
    across = bytes_work(cell(strategy="zero0", gpus=16, nodes=1, tp=8))
    assert inside.micro_link_s == pytest.approx(across.micro_link_s)
    # and so does a pipeline whose stages share a node; one whose stages do not crosses at one card
    staged = {nodes: bytes_work(cell(strategy="zero1", gpus=16, nodes=nodes, pp=2, grad_accum=4))
              for nodes in (1, 2)}
    assert staged[2].micro_link_s == pytest.approx(staged[1].micro_link_s)
    cells = {nodes: cell(strategy="zero1", gpus=16, nodes=nodes, tp=8, pp=2, grad_accum=4)
             for nodes in (1, 2)}
    apart = {nodes: bytes_work(params) for nodes, params in cells.items()}
    sent = sum(c.bus_bytes() for c in step_collectives(cells[2]) if c.group == "pp")
    assert apart[2].micro_link_s - apart[1].micro_link_s == pytest.approx(
        sent / (H200.network_gb_s * 1e9) - sent / NVLINK)


def test_a_group_with_a_measured_table_takes_the_tables_time_and_one_without_the_measured_share():
    links = interconnect_of(H200)
    # results/comm/h200-x2.json and -x4.json, measured; -x8.json, from nccl-tests' published output
    assert sorted(links.tables) == [2, 4, 8]
    # the large messages of the published tables reach 60-80% of NVLink's 450 GB/s
    assert 0.6 < links.efficiency < 0.8
    for params in (cell(framework="torch", strategy="ddp", precision="bf16", gpus=4, grad_accum=4),
                   cell(strategy="zero2", gpus=2, grad_accum=2)):
        w = time_model.work(params, H200)
        measured = links.tables[params.gpus].step_seconds(step_collectives(params))
        assert w.overlapped_link_s + w.sync_link_s == pytest.approx(measured)
    # DDP in 100 MiB buckets (its best practice) against one of 1 MiB: the table knows small messages
    # cost their issue time, where bytes over a bandwidth see no difference
    small = cell(framework="torch", strategy="ddp", precision="bf16", gpus=4, ddp_bucket_cap_mb=1)
    large = cell(framework="torch", strategy="ddp", precision="bf16", gpus=4, ddp_bucket_cap_mb=100)
    tabled = [time_model.work(p, H200).overlapped_link_s for p in (small, large)]
    assert tabled[0] > 1.5 * tabled[1]
    assert bytes_work(small).overlapped_link_s == pytest.approx(bytes_work(large).overlapped_link_s)
    # 8 ranks: ZeRO-0's all-reduce by the 8-GPU table; ZeRO-1 also all-gathers, which it lacks, so its
    # bus bytes go at the tables' share of the link
    for strategy, table in (("zero0", True), ("zero1", False)):
        eight = cell(strategy=strategy, gpus=8)
        w = time_model.work(eight, H200)
        expected = (links.tables[8].step_seconds(step_collectives(eight)) if table else
                    (lambda b: b.overlapped_link_s + b.sync_link_s)(bytes_work(eight)) / links.efficiency)
        assert w.overlapped_link_s + w.sync_link_s == pytest.approx(expected)
    # across nodes, -n4x8.json from published nccl-tests output of 4 nodes of 8 (InfiniBand): a group of
    # its 32 ranks by its rows; its large messages reach 70-90% of the 8 cards of a node (400 GB/s)
    assert sorted(links.node_tables) == [(4, 32)] and 0.7 < links.network_efficiency < 0.9
    four_nodes = cell(strategy="zero0", gpus=32, nodes=4)
    w = time_model.work(four_nodes, H200)
    published = links.node_tables[(4, 32)]
    assert w.sync_link_s == pytest.approx(published.step_seconds(step_collectives(four_nodes)))


def test_a_table_across_nodes_times_the_groups_that_span_as_many_and_sets_the_networks_share(
        tmp_path, monkeypatch):
    """A user's table of 2 nodes (commbench through SLURM, or nccl-tests' output) times a data-parallel
    group of 2 nodes by its rows; a group of 8 nodes moves its bus bytes at the share of the network
    that table's large messages reached, not at NVLink's."""
    document = json.loads((REPO / "results/comm/h200-x4.json").read_text())
    # 16 ranks on 2 nodes whose collectives take 3 times the 4-GPU host's
    rows = [{**row, "ranks": 16, "time_us": row["time_us"] * 3} for row in document["rows"]]
    (tmp_path / "results/comm").mkdir(parents=True)
    (tmp_path / "results/comm/h200-n2x8.json").write_text(
        json.dumps({**document, "interconnect": "h200-n2x8", "ranks": 16, "nodes": 2, "rows": rows}))
    monkeypatch.chdir(tmp_path)
    links = interconnect_of(H200)
    # (the published table of 4 nodes beside it)
    assert sorted(links.node_tables) == [(2, 16), (4, 32)] and sorted(links.tables) == [2, 4, 8]
    two_nodes = cell(strategy="zero0", gpus=16, nodes=2)
    w = time_model.work(two_nodes, H200)
    assert w.overlapped_link_s + w.sync_link_s == pytest.approx(
        links.node_tables[(2, 16)].step_seconds(step_collectives(two_nodes)))
    eight_nodes = cell(strategy="zero0", gpus=64, nodes=8)
    bus = sum(c.bus_bytes() for c in step_collectives(eight_nodes))
    w = time_model.work(eight_nodes, H200)
    # the share is of the cards of a node's 8 ranks, as the table's: 400 GB/s
    assert links.network_efficiency != links.efficiency
    assert w.overlapped_link_s + w.sync_link_s == pytest.approx(
        bus / (links.network_efficiency * 8 * H200.network_gb_s * 1e9))


def test_torchs_tensor_parallelism_pays_dtensors_dispatch_on_the_host_and_autotp_does_not():
    dtensor = time_model.work(cell(framework="torch", strategy="fsdp", precision="bf16", gpus=2, tp=2), H200)
    autotp = time_model.work(cell(strategy="zero1", gpus=2, tp=2), H200)
    assert dtensor.dtensor_passes == dtensor.layer_passes > 0 and autotp.dtensor_passes == 0
    constants = time_model.load_constants()["h200"]
    host = time_model.parts(dtensor, constants)["framework"]
    assert host > time_model.parts(dtensor, replace(constants, dtensor_pass_s=0.0))["framework"]


def test_deterministic_algorithms_cost_the_host_a_share_of_each_block_pass():
    """Under Lightning's deterministic=True torch fills every tensor it allocates and attention runs
    eagerly: more host work in every block pass (the deterministic Lightning cells ran up to 46% over the
    model that lacked it, the others up to 74% under)."""
    lightning = dict(framework="lightning", strategy="single", model="distilbert-base", head="classifier",
                     seq_len=512, gpus=1, micro_batch=12)
    plain = time_model.work(cell(**lightning), H200)
    strict = time_model.work(cell(**lightning, deterministic=True), H200)
    assert plain.deterministic_passes == 0 and strict.deterministic_passes == strict.layer_passes
    constants = time_model.load_constants()["h200"]
    assert constants.deterministic_pass_s > 0
    before, after = time_model.parts(plain, constants), time_model.parts(strict, constants)
    assert after["framework"] > before["framework"]
    assert after["optimizer"] == before["optimizer"]


def test_a_predictions_host_part_holds_its_ranks_waiting_for_the_slowest_host():
    """host_s, what compare calls host-bound by: the framework's part, and on several ranks the share of
    the host's time parts() moved into communication; never more than the step."""
    share = time_model.load_constants()["h200"].collective_wait_share["4"]
    one = time_model.predict(cell(strategy="zero1", gpus=1), H200)
    four = time_model.predict(cell(strategy="zero1", gpus=4), H200)
    assert one.host_s == pytest.approx(one.parts_s["framework"])
    assert four.host_s == pytest.approx(four.parts_s["framework"] / (1 - share))
    assert four.parts_s["framework"] < four.host_s <= four.step_time_s
    assert four.as_dict()["host_s"] == pytest.approx(four.host_s, abs=1e-6)


def test_the_pipeline_bubble_and_stage_share():
    w = time_model.work(cell(strategy="zero1", gpus=4, pp=4, grad_accum=8), H200)
    whole = time_model.work(cell(strategy="zero1", gpus=4, pp=1, grad_accum=8), H200)
    assert w.pipeline_factor == pytest.approx((8 + 4 - 1) / 8)
    assert w.layer_passes == whole.layer_passes / 4


def test_more_offload_is_slower_and_checkpointing_costs_a_forward():
    constants = time_model.Constants()
    zero3 = cell(model="gpt-2.5b", strategy="zero3")
    times = [time_model.predict(p, H200, constants).step_time_s for p in
             (zero3, zero3.replace(offload_optimizer=True),
              zero3.replace(offload_optimizer=True, offload_param=True))]
    assert times[0] < times[1] < times[2]
    # parameters offloaded alone (the optimizer on the GPU) cross PCIe at every fetch all the same
    params_alone = zero3.replace(offload_param=True)
    assert time_model.work(params_alone, H200).offload_pcie_s == pytest.approx(
        time_model.work(zero3.replace(offload_optimizer=True, offload_param=True), H200).offload_pcie_s
        - time_model.work(zero3.replace(offload_optimizer=True), H200).offload_pcie_s)
    assert times[0] < time_model.predict(params_alone, H200, constants).step_time_s
    plain = time_model.work(cell(model="gpt-2.5b"), H200)
    recomputed = time_model.work(cell(model="gpt-2.5b", activation_checkpointing=True), H200)
    assert 1.2 < recomputed.matmul_s / plain.matmul_s < 4 / 3  # blocks once more forward, not the head


def test_cpu_threads_shorten_only_their_share_of_an_offloaded_step():
    constants = time_model.Constants()
    offloaded = cell(model="gpt-2.5b", strategy="zero2", offload_optimizer=True, gpus=1, precision="bf16")
    one, sixteen = (time_model.predict(offloaded, H200, constants, cpu_threads=t).step_time_s
                    for t in (1, 16))
    # the threads share the work less than in proportion: as threads ** CPU_THREAD_EXPONENT
    a = time_model.CPU_THREAD_EXPONENT
    assert 0.5 < a < 1
    assert one - sixteen == pytest.approx(psi("gpt-2.5b") * (1 - 1 / 16 ** a) / constants.cpu_adam_per_thread)
    # what threads cannot shorten: the host's memory, which every rank of the node steps through at once
    w = time_model.work(offloaded, H200, cpu_threads=16)
    assert w.cpu_host_params == psi("gpt-2.5b")
    assert w.cpu_adam_params == pytest.approx(psi("gpt-2.5b") / 16 ** a)
    four = time_model.work(cell(model="gpt-2.5b", strategy="zero2", offload_optimizer=True), H200)
    assert four.cpu_host_params == pytest.approx(psi("gpt-2.5b"))  # 4 partitions of a quarter, at once
    assert time_model.work(cell(model="gpt-2.5b", strategy="zero2"), H200).cpu_host_params == 0  # on the GPU


def test_the_thread_ratio_moves_only_an_offloaded_step():
    # the fitted constants, as the rerun planner uses them: 2 -> 8 threads a rank shortens an offloaded
    # ZeRO-2 step (its CPU Adam's share), and is the predictions' own ratio
    offloaded = cell(model="gpt-2.5b", strategy="zero2", offload_optimizer=True, gpus=2)
    ratio = time_model.thread_ratio(offloaded, H200, 2, 8)
    assert 0.3 < ratio < 0.9
    assert ratio == pytest.approx(time_model.predict(offloaded, H200, cpu_threads=8).step_time_s
                                  / time_model.predict(offloaded, H200, cpu_threads=2).step_time_s)
    assert time_model.thread_ratio(offloaded, H200, 8, 2) == pytest.approx(1 / ratio)
    # no CPU optimizer: the same step at any threads; a CPU cell: nothing predicted
    assert time_model.thread_ratio(cell(model="gpt-2.5b", strategy="zero2", gpus=2), H200, 2, 8) == 1
    assert time_model.thread_ratio(cell(device="cpu"), H200, 2, 8) is None


def test_a_runs_cpu_threads_come_from_its_provenance_or_from_the_rule_it_ran_under():
    params = cell(gpus=4)
    assert time_model.threads_of_run(
        {"params": params, "provenance": {"environment": {"OMP_NUM_THREADS": "16"}}}) == 16
    # recorded without OMP_NUM_THREADS: the studies' default
    assert time_model.threads_of_run({"params": params, "provenance": {"environment": {}}}) == 8
    # not recorded at all (before b222dfd): Snakemake's export of the job's threads, one per GPU rank
    # on the node
    assert time_model.threads_of_run({"params": params, "provenance": {"gpu_name": "NVIDIA H200"}}) == 4
    assert time_model.threads_of_run({"params": cell(gpus=8, nodes=2).as_dict(), "provenance": {}}) == 4
    # a history line keeps neither the environment nor the parameters: unknown, not the default
    line = {"study": "megatron", "cell_id": "strategy~zero3", "provenance": {"git_commit": "5d3db19"}}
    with pytest.raises(ValueError, match="megatron/strategy~zero3: .* threads are unknown"):
        time_model.threads_of_run(line)


def test_a100s_are_slower_than_h200s_and_say_whose_efficiencies_they_use():
    params = cell(model="gpt-2.5b", micro_batch=16)
    h200 = time_model.predict(params, H200)
    a100 = time_model.predict(params, GPUS["a100-80g"])
    assert a100.step_time_s > 2 * h200.step_time_s  # 312 against 989 TFLOPS on a compute-bound cell
    assert h200.note is None and "no a100-80g cells measured" in a100.note and a100.constants_gpu == "h200"
    assert 0 < a100.mfu < 1 and a100.samples_per_s == pytest.approx(params.global_batch / a100.step_time_s)
    assert time_model.predict(params.replace(device="cpu"), H200) is None
    assert time_model.predict(params.replace(precision="bf16"), GPUS["v100-32g"]) is None  # no bf16


def test_the_fit_recovers_the_constants_that_made_the_times():
    config = load_config(PROJECT_CONFIG)
    cells = [c.params for name in ("megatron", "zero3_pipeline", "lightning", "gpt2_zero", "baseline")
             for c in config.study(name).cells if not c.unsupported and c.params.model != "bert-180b"]
    llama = [c.params for c in config.study("llama").cells if c.params.model == "llama-7b"]
    # Lightning's cells without deterministic algorithms too, as the validation studies have them: else
    # what those add to a block's pass and Lightning's fixed cost would only ever be seen together
    lightning = [c.params.replace(deterministic=False) for c in config.study("lightning").cells
                 if not c.unsupported]
    # CPU threads per rank as the measured cells had them: from 1 to 16, so threads and host are told apart
    works = time_model.stack([time_model.work(p, H200, cpu_threads=(1, 2, 4, 8, 16)[i % 5])
                              for i, p in enumerate(cells + llama[::7] + lightning)])
    truth = time_model.Constants(eta_matmul=0.55, elementwise_passes=2.5, layer_pass_s=4e-4,
                                 deterministic_pass_s=1e-3, call_s=7e-4,
                                 eta_optimizer=0.2, eta_optimizer_torch=0.45, eta_pcie=0.6,
                                 cpu_adam_per_thread=9e7,
                                 cpu_torch_per_thread=3e7, cpu_unscale_per_thread=5e7, cpu_host_rate=2e9,
                                 step_s={"torch": 0.01, "lightning": 0.03, "hf_trainer": 0.5, "ZeRO-0": 0.01,
                                         "ZeRO-1/2": 0.02, "ZeRO-3": 0.04})
    times = time_model.step_time(works, truth)
    fitted = time_model.fit(works, times, prior=1e-4)
    assert np.allclose(fitted.vector(), truth.vector(), rtol=0.03), dict(zip(truth.names(), fitted.vector()))
    # and from noisy times (5% log-normal), still close
    noisy = times * np.exp(np.random.default_rng(0).normal(0, 0.05, len(times)))
    rough = time_model.fit(works, noisy)
    predicted = time_model.step_time(works, rough)
    assert np.median(np.abs(predicted / times - 1)) < 0.05
    # where the search begins is not what it finds (the prior pulls towards `start`, not `initial`):
    # a leave-one-out fit begun at the fit of every cell lands where one begun at the defaults does
    keep = np.arange(len(noisy)) != 3
    some = {k: v[keep] for k, v in works.items()}
    assert np.allclose(time_model.fit(some, noisy[keep], initial=rough).vector(),
                       time_model.fit(some, noisy[keep]).vector(), rtol=1e-3)


def test_ranks_waiting_in_collectives_move_host_time_into_communication_not_the_step():
    """A share of the host's part, by number of ranks, is counted as communication (the profile sees
    ranks waiting for the slowest host inside collective kernels); the step itself does not change,
    one GPU and a rank run alone keep all of it."""
    plain = time_model.load_constants()["h200"]
    plain.collective_wait_share = {}
    waiting = replace(plain, collective_wait_share={"2": 0.2, "4": 0.6})
    for gpus, share in ((1, 0.0), (2, 0.2), (4, 0.6), (8, 0.6)):  # held beyond the largest calibrated
        w = time_model.work(cell(strategy="zero2", gpus=gpus), H200)
        before, after = time_model.parts(w, plain), time_model.parts(w, waiting)
        assert sum(after.values()) == pytest.approx(sum(before.values()))
        assert after["communication"] - before["communication"] == pytest.approx(share * before["framework"])
        assert before["framework"] > 0
    # between calibrated numbers of ranks, in log2 of them: 3 ranks, 0.2 + 0.585 x 0.4
    assert time_model.collective_wait_share(waiting, 3) == pytest.approx(0.2 + np.log2(1.5) * 0.4)
    alone = time_model.work(cell(strategy="zero2", gpus=4), H200, alone=True)
    assert time_model.parts(alone, waiting) == time_model.parts(alone, plain)


def test_the_wait_share_is_calibrated_on_profiled_cells_by_number_of_ranks():
    """Given profiles whose exposed communication is the model's plus 30% of its host part at 2 ranks
    and 70% at 4, the calibration finds those shares, and says how far off the model was without."""
    from trainbench.checks.step_time import collective_wait_shares

    from trainbench.contract.result import METRICS, Section, read_result

    template = read_result(next(REPO.glob("results/runs/baseline/*/metrics.json")))

    def profiled(exposed: float):  # a result whose profile exposed this much communication
        metrics = {**template.metrics.as_dict(), "breakdown": {"parts_s": {"exposed_communication": exposed}}}
        return replace(template, metrics=Section("metrics", METRICS, metrics))

    constants = time_model.load_constants()["h200"]
    constants.collective_wait_share = {}
    cells = []
    for gpus, share in ((2, 0.3), (4, 0.7)):
        for strategy in ("zero0", "zero1", "zero2", "zero3"):
            for micro_batch in (1, 4, 16):
                w = time_model.work(cell(strategy=strategy, gpus=gpus, micro_batch=micro_batch), H200)
                parts = time_model.parts(w, constants)
                exposed = parts["communication"] + share * parts["framework"]
                cells.append({"work": w, "result": profiled(float(exposed))})
    cells.append({"work": time_model.work(cell(framework="torch", strategy="single", gpus=1), H200),
                  "result": profiled(0.0)})
    shares = collective_wait_shares(cells, constants)
    assert sorted(shares) == ["2", "4"]
    assert shares["2"][:2] == (0.3, 12) and shares["4"][:2] == (0.7, 12)
    assert shares["4"][2] > 0 and shares["4"][3] == pytest.approx(0, abs=1e-9)


def test_the_hardware_table_is_the_one_place_for_gpu_facts():
    assert gpu_type_of("NVIDIA H200").key == "h200"
    assert gpu_type_of("NVIDIA A100-SXM4-80GB").key == "a100-80g"
    assert gpu_type_of("NVIDIA A100-SXM4-40GB").key == "a100-40g"
    assert gpu_type_of("NVIDIA A10").key == "a10" and gpu_type_of("NVIDIA H100 PCIe") is None
    assert gpu_type_named_in("8 x H200 per node").key == "h200"
    planned = hardware_from_args("8 x H200", 140.4, 560, 8)  # a study's plan_for: memory given, type named
    assert planned.gpu.key == "h200" and planned.gpu_mem_mib == pytest.approx(140.4 * 1024)
    assert hardware_from_args("a100-80g", None, 512, 8).gpu_mem_mib == GPUS["a100-80g"].memory_mib
    for gpu in GPUS.values():
        assert gpu.peer_gb_s() >= gpu.pcie_gb_s and gpu.network_gb_s <= gpu.peer_gb_s()


def test_predict_prints_step_time_samples_and_mfu_for_every_cell():
    run = subprocess.run([sys.executable, "-m", "trainbench", "predict", "megatron", "--config",
                          str(PROJECT_CONFIG), "--gpu", "a100-80g", "--host-mem-gib", "1024"],
                         capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    assert {"step_time_s", "samples_per_s", "mfu", "time_constants_from"} <= set(rows[0])
    assert all(float(r["step_time_s"]) > 0 and 0 < float(r["mfu"]) < 1 for r in rows)
    assert "no a100-80g cells measured: efficiencies fitted on h200" in run.stderr
    memory_only = subprocess.run([sys.executable, "-m", "trainbench", "predict", "megatron", "--config",
                                  str(PROJECT_CONFIG), "--gpu-mem-gib", "40", "--host-mem-gib", "1024"],
                                 capture_output=True, text=True, check=True)
    assert {r["step_time_s"] for r in csv.DictReader(io.StringIO(memory_only.stdout))} == {""}
    assert "no GPU type" in memory_only.stderr


def test_deepspeeds_optimizer_and_torchs_have_their_own_efficiency():
    """DeepSpeed's engine steps flat fp32 partitions with its own casts and checks; torch's fused AdamW
    steps the module's tensors at several times the rate (holdout_5b: 0.09 against 0.6 of HBM)."""
    constants = time_model.Constants(eta_optimizer=0.1, eta_optimizer_torch=0.5)
    torch_cell = time_model.work(cell(framework="torch", strategy="single", gpus=1, precision="bf16"), H200)
    deepspeed_cell = time_model.work(cell(strategy="zero1", gpus=1, precision="bf16"), H200)
    assert torch_cell.torch_optimizer_hbm_s == pytest.approx(deepspeed_cell.optimizer_hbm_s)  # the same bytes
    assert torch_cell.optimizer_hbm_s == 0 and deepspeed_cell.torch_optimizer_hbm_s == 0
    assert time_model.parts(torch_cell, constants)["optimizer"] == pytest.approx(
        torch_cell.torch_optimizer_hbm_s / 0.5)
    assert time_model.parts(deepspeed_cell, constants)["optimizer"] == pytest.approx(
        deepspeed_cell.optimizer_hbm_s / 0.1)


def test_time_the_gpu_waits_on_the_hosts_launches_is_the_frameworks_part_not_compute():
    """A ZeRO-3 step of many small layers is host-bound (its fetch calls): the model's compute part
    is the device's own work, and what the host adds beyond it goes with the loop's fixed costs, as a
    profile counts it (idle: GPU waiting). The step itself does not depend on the split."""
    constants = time_model.Constants(call_s=0.01, layer_pass_s=0.002, step_s={"ZeRO-3": 0.05})
    host_bound = time_model.work(cell(strategy="zero3", gpus=1, precision="bf16", micro_batch=1), H200)
    parts = time_model.parts(host_bound, constants)
    device = (host_bound.matmul_s / constants.eta_matmul
              + constants.elementwise_passes * host_bound.elementwise_s + host_bound.cast_s)
    host = constants.layer_pass_s * host_bound.layer_passes + constants.call_s * host_bound.calls
    assert host > 2 * device
    assert parts["compute"] == pytest.approx(host_bound.pipeline_factor * device)
    busy = (host ** time_model.SHARPNESS + device ** time_model.SHARPNESS) ** (1 / time_model.SHARPNESS)
    assert parts["framework"] == pytest.approx(0.05 + host_bound.pipeline_factor * (busy - device))
    assert time_model.step_time(host_bound, constants) == pytest.approx(sum(parts.values()))


def test_the_trainers_loop_cost_recurs_every_micro_batch_and_torchs_once_a_step():
    """The Hugging Face Trainer runs its training_step per micro batch (its profiles: 85 and 116 ms of
    idle a micro batch at 2 and 8): its loop cost scales with accumulation; the torch runner's does not."""
    constants = time_model.Constants(step_s={"hf_trainer": 0.1, "torch": 0.01})
    llama = {"model": "llama-1.3b", "strategy": "fsdp", "precision": "bf16", "gpus": 1, "seq_len": 2048,
             "micro_batch": 1}
    trainer = [time_model.work(cell(framework="hf_trainer", grad_accum=ga, **llama), H200) for ga in (1, 8)]
    assert [w.loop_repeats for w in trainer] == [1, 8]
    # (the framework part also holds the GPU's wait on the host's launches: microseconds here)
    framework = [time_model.parts(w, constants)["framework"] for w in trainer]
    assert framework == pytest.approx([0.1, 0.8], rel=1e-3)
    torch_cells = [time_model.work(cell(framework="torch", strategy="single", precision="bf16", gpus=1,
                                        grad_accum=ga), H200) for ga in (1, 8)]
    assert [w.loop_repeats for w in torch_cells] == [1, 1]


def test_an_unpadded_16_bit_lm_head_runs_at_its_own_efficiency_unless_compiled():
    """GPT-2's 50,257-word head has no aligned tensor-core kernel (holdout_pace's profile): its FLOPs
    are counted apart, where padding, torch.compile or fp32 would take the aligned path."""
    eager = dict(framework="torch", strategy="single", model="gpt2-124m", gpus=1, precision="bf16")
    unpadded = time_model.work(cell(**eager), H200)
    spec = get_model("gpt2-124m")
    head = 6 * spec.vocab_size * spec.d_model * 4 * 1024  # tokens of micro batch 4
    assert unpadded.unaligned_head_s * time_model.peak_flops(H200, "bf16", False) == pytest.approx(head)
    padded = time_model.work(cell(**eager, vocab_multiple=64), H200)
    assert padded.unaligned_head_s == 0 and padded.matmul_s > unpadded.matmul_s
    assert time_model.work(cell(**eager, compile=True), H200).unaligned_head_s == 0
    assert time_model.work(cell(**{**eager, "precision": "fp32"}), H200).unaligned_head_s == 0
    c = time_model.Constants(eta_matmul=0.9, eta_unaligned=0.15)
    assert time_model.step_time(unpadded, c) > time_model.step_time(padded, c)


def test_sdpas_fp32_attention_runs_at_the_fp32_peak_even_with_tf32():
    tf32 = dict(framework="torch", strategy="single", gpus=1, precision="fp32", tf32=True)
    sdpa = time_model.work(cell(**tf32, attention="sdpa"), H200)
    eager = time_model.work(cell(**tf32, attention="eager"), H200)
    spec = get_model("gpt-345m")
    attention = 12 * spec.n_layer * spec.d_model * 1024 * 4 * 1024
    fp32, tf32_peak = time_model.peak_flops(H200, "fp32", False), time_model.peak_flops(H200, "fp32", True)
    extra = attention * (1 / fp32 - 1 / tf32_peak)
    assert sdpa.matmul_s - eager.matmul_s == pytest.approx(extra)


def test_a_rank_alone_waits_for_nothing_its_world_makes_it_wait_for():
    """An emulated rank's step lacks what its world adds: the collectives no compute hides, a pipeline's
    bubble, the node's other CPU optimizers on the same host memory. The model's wait is that, and
    nothing for a world of one."""
    constants = time_model.load_constants()["h200"]
    assert time_model.waiting_s(cell(gpus=1, strategy="zero0"), H200, constants) == 0.0
    synced = cell(strategy="zero1", overlap_comm=False)
    alone = time_model.work(synced, H200, alone=True)
    assert alone.sync_link_s == alone.micro_link_s == alone.overlapped_link_s == 0.0
    assert time_model.waiting_s(synced, H200, constants) == pytest.approx(
        time_model.work(synced, H200).sync_link_s)
    piped = cell(strategy="zero1", pp=2, grad_accum=4)
    bubble = time_model.parts(time_model.work(piped, H200, alone=True), constants)["compute"] / 4
    assert time_model.waiting_s(piped, H200, constants) > bubble  # (ga + pp - 1) / ga: a quarter more
    offloaded = cell(strategy="zero2", gpus=4, offload_optimizer=True)
    assert time_model.work(offloaded, H200).cpu_host_params == 4 * time_model.work(
        offloaded, H200, alone=True).cpu_host_params
