"""Energy per step and token: NVML's counter read around the timed windows (execute/gpus.py), the
figures metrics.json gets from every rank's reading (execute/results.py), and the table's columns.

The counter itself needs an NVIDIA GPU; here it is a counter function the tests drive, and the GPU
runs publish the real figures (docs/measurement.md, "Energy")."""

from __future__ import annotations

import pytest

from trainbench.execute.gpus import EnergyCounter
from trainbench.execute.results import energy_metrics
from trainbench.reporting.columns import COLUMNS, expand_sets

from conftest import make_cell


def counter_of(readings: list[int]):
    values = iter(readings)
    return EnergyCounter(lambda: next(values))


def test_the_counter_adds_only_what_the_timed_windows_took():
    counter = counter_of([1_000, 4_000, 10_000, 12_500])  # mJ at window 1's two ends, then window 2's
    assert counter.energy_j is None  # before any window: not measured, not zero
    counter.window_ended()  # an end without a start (a window the counter missed) adds nothing
    counter.window_started()
    counter.window_ended()
    counter.window_started()
    counter.window_ended()
    assert counter.windows == 2 and counter.energy_j == pytest.approx(5.5)  # 3 J + 2.5 J, not 11.5 J


def test_a_cpu_rank_has_no_counter():
    assert EnergyCounter.for_device("cpu", None) is None


def test_a_counter_that_fails_mid_run_gives_no_energy_and_stops_nothing():
    readings = iter([1_000, 4_000, 10_000])

    def read():
        value = next(readings, None)
        if value is None:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return value

    counter = EnergyCounter(read)
    for _ in range(3):
        counter.window_started()
        counter.window_ended()
    assert counter.failed and counter.energy_j is None  # a partial sum would pass for the whole


def ranks(*energy_and_time):
    return [{"gpu_energy_j": e, "gpu_energy_timed_s": t} for e, t in energy_and_time]


def test_energy_per_step_and_token_add_every_gpu_of_the_cell():
    params = make_cell(strategy="ddp", gpus=2, micro_batch=4, seq_len=16).params  # 8 samples, 128 tokens
    out = energy_metrics(params, ranks((600.0, 2.0), (500.0, 2.0)), steps_timed=10)
    assert out["gpu_energy_j_per_rank"] == [600.0, 500.0]
    assert out["energy_j_per_step"] == pytest.approx(110.0)
    assert out["energy_j_per_token"] == pytest.approx(110.0 / 128)
    assert out["gpu_power_w"] == pytest.approx(275.0)  # (300 W + 250 W) / 2


def test_an_emulated_rank_gives_its_own_gpu_only():
    params = make_cell(strategy="ddp", gpus=8, emulate=True).params
    out = energy_metrics(params, ranks((600.0, 2.0)), steps_timed=10)
    # the world's other 7 GPUs were not there: no energy per step or token
    assert out == {"gpu_energy_j_per_rank": [600.0], "gpu_power_w": 300.0}


def test_a_rank_without_a_reading_leaves_the_cell_without_energy():
    params = make_cell(strategy="ddp", gpus=2).params
    assert energy_metrics(params, ranks((600.0, 2.0), (None, None)), steps_timed=10) == {}


def test_the_energy_column_set_reads_the_metrics():
    assert expand_sets(["step_time_ms", "energy"]) == ["step_time_ms", "energy_j_step", "energy_mj_token",
                                                       "gpu_power_w"]
    doc = {"status": "ok", "metrics": {"energy_j_per_step": 110.0, "energy_j_per_token": 0.000859,
                                       "gpu_power_w": 275.0}}
    shown = {name: COLUMNS[name].text(COLUMNS[name].value(doc)) for name in expand_sets(["energy"])}
    assert shown == {"energy_j_step": "110.0", "energy_mj_token": "0.859", "gpu_power_w": "275"}
