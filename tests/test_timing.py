"""Timing windows and the intervals of their median (src/trainbench/study/timing.py)."""

from __future__ import annotations

import random

import pytest

from trainbench.study.timing import (TimingSettings, fixed_step_count, median_interval, steps_per_window,
                               summarize_windows)


def test_the_median_interval_takes_the_order_statistics_whose_binomial_coverage_is_95_percent():
    assert median_interval([5, 1, 4, 2, 3]) is None  # five values cover 93.75% at most
    assert median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)  # 1 - 2 / 2^6 = 96.9%
    assert median_interval(list(range(1, 10))) == (2, 8)  # n = 9: j = 2 covers 96.1%
    assert median_interval(list(range(1, 21))) == (6, 15)  # n = 20: j = 6 covers 95.9%, j = 7 88.5%


def test_the_interval_covers_the_true_median_at_least_95_percent_of_the_time_even_for_skewed_times():
    rng = random.Random(7)
    true_median = 1.0  # of 1 + an exponential of median 0 ... shifted: lognormal with median 1
    trials, covered = 2000, 0
    for _ in range(trials):
        values = [rng.lognormvariate(0.0, 0.5) for _ in range(10)]
        low, high = median_interval(values)
        covered += low <= true_median <= high
    assert covered / trials >= 0.95


def test_windows_hold_enough_steps_for_the_timed_steps_and_the_shortest_window():
    assert steps_per_window(30, 6, None, 0.2) == 5  # 30 timed steps in 6 windows
    assert steps_per_window(3, 6, None, 0.2) == 1
    assert steps_per_window(3, 6, 0.033, 0.2) == 7  # 33 ms steps: 7 make a 0.2 s window
    assert steps_per_window(30, 6, 0.25, 0.2) == 5
    assert fixed_step_count(10, 190, TimingSettings()) == 10 + 6 * 32  # Lightning: 190 timed steps round up


def test_a_summary_is_tight_only_within_its_target():
    tight = summarize_windows([1.00, 1.01, 0.99, 1.00, 1.005, 0.995])
    assert tight.tight(0.02) and not tight.tight(0.001)
    assert not summarize_windows([1.0] * 5).tight(1.0)  # no interval, however alike


def test_timing_settings_travel_as_one_word_and_refuse_unknown_names():
    settings = TimingSettings(min_windows=8, target_ci=0.01, max_timed_s=30, min_window_s=0.5)
    assert TimingSettings.from_argument(settings.as_argument()) == settings
    assert TimingSettings.from_argument("") == TimingSettings()
    with pytest.raises(ValueError, match="unknown timing setting 'windows'"):
        TimingSettings.from_argument("windows=3")


def _agree_rank(rank: int, store_file: str, values: list[int], out: dict) -> None:
    import torch.distributed as dist

    from trainbench.execute.worker import agree_through_store

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    try:
        out[rank] = [agree_through_store(v, rank, f"k{i}") for i, v in enumerate(values[rank::2])]
    finally:
        dist.destroy_process_group()


def test_ranks_agree_on_rank_0s_values_through_the_rendezvous_store_in_order(tmp_path):
    """Window sizes and stopping (worker.StepRecorder._agree): every rank gets rank 0's value for each
    key, whatever its own; through the store, so no collective builds a communicator on the GPUs."""
    import torch.multiprocessing as mp

    values = [8, 3, 0, 1, 1, 0]  # rank 0's and rank 1's values for three agreements, interleaved
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_agree_rank, args=(str(tmp_path / "store"), values, out), nprocs=2, join=True)
        assert dict(out) == {0: [8, 0, 1], 1: [8, 0, 1]}
