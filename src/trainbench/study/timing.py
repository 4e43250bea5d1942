"""How a cell's steps are timed, and how sure each figure is.

Timed steps run in windows of `steps_per_window` optimizer steps. The device is synchronised only
at a window's two ends, so inside a window the host queues work while the GPU computes, as in a
bare training loop; losses stay on the device and are read once per window. Each window gives one
value, its mean step time; a cell's step time is the median over its windows, and its 95%
confidence interval is the distribution-free interval of a median: the order statistics
x(j) <= median <= x(n+1-j) with the largest j whose binomial coverage, 1 - 2 P(B(n, 1/2) <= j - 1),
is at least 95%. That needs 6 windows at least (5 cover only 93.75%).

Every rate derived from the step time (samples/s, tokens/s, TFLOPS, MFU) is a constant over it, so
its median and interval are the step time's, inverted. A cell keeps timing windows until the
interval's half-width is within `target_ci` of the median, or until its timed steps took
`max_timed_s` (then it is `noisy`).

Results from before windows (one synchronised step per value) read the same way: their
`step_times_s` are windows of one step.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, fields

CONFIDENCE = 0.95
MIN_WINDOWS_FOR_INTERVAL = 6


def _setting(default, kind: str, description: str, **limits):
    return field(default=default, metadata={"type": kind, "description": description, **limits})


@dataclass(frozen=True)
class TimingSettings:
    """A study's `timing` block: how long its cells measure, not what they measure, so changing it
    reruns nothing (like `execution`). The config schema is built from these fields."""

    min_windows: int = _setting(6, "integer", "Timed windows a cell runs at least (6 is the fewest that "
                                "give a 95% interval of the median; with fewer a cell has no interval and "
                                "is marked noisy).", minimum=1)
    target_ci: float = _setting(0.02, "number", "Keep timing windows until the 95% interval of the step time "
                                "is within this share of its median (0.02: ±2%).",
                                exclusiveMinimum=0, maximum=1)
    max_timed_s: float = _setting(120, "number", "Stop timing after this many seconds of timed steps, "
                                  "however wide the interval; a cell that stops wider than target_ci "
                                  "is 'noisy'.",
                                  exclusiveMinimum=0)
    min_window_s: float = _setting(0.2, "number", "The shortest window, sized from the warm-up's steps: "
                                   "shorter ones would measure the host's jitter.", minimum=0)
    profile_steps: int = _setting(0, "integer", "Steps profiled with torch.profiler on every rank after the "
                                  "timed ones (0: none): each rank's trace, and where its step time went, "
                                  "kept with the cell (docs/profiles.md). The cell's figures stay those of "
                                  "its unprofiled steps.", minimum=0, maximum=50)
    memory_snapshot: int = _setting(0, "integer", "1: record the GPU allocator's history from the "
                                    "run's start (a small cost per allocation, in the timed steps too) "
                                    "and keep a snapshot at the end, with its peak by category. A GPU "
                                    "cell that runs out of memory keeps a snapshot whatever this says.",
                                    minimum=0, maximum=1)
    stall_s: float = _setting(0, "number", "End the cell as failed when no rank has made progress for this "
                              "many seconds after its first step (a hung collective, a deadlock): 0 derives "
                              "it, twenty times the slowest step so far and at least 120 s. A rank that "
                              "dies or is stopped ends the cell within seconds whatever this says.",
                              minimum=0)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def json_schema(cls) -> dict:
        properties = {}
        for f in fields(cls):
            spec = dict(f.metadata)
            properties[f.name] = {**spec, "default": f.default}
        return {"type": "object", "additionalProperties": False, "properties": properties}

    def as_argument(self) -> str:
        """One word for the command line (and Snakemake's resources): min_windows=6,target_ci=0.02,..."""
        return ",".join(f"{name}={value:g}" for name, value in self.as_dict().items())

    @classmethod
    def from_argument(cls, text: str) -> "TimingSettings":
        kinds = {f.name: int if f.metadata["type"] == "integer" else float for f in fields(cls)}
        values = {}
        for part in filter(None, text.split(",")):
            name, _, value = part.partition("=")
            if name not in kinds:
                raise ValueError(f"unknown timing setting {name!r}; known: {', '.join(kinds)}")
            values[name] = kinds[name](float(value))
        return cls(**values)


def steps_per_window(timed_steps: int, min_windows: int, step_estimate_s: float | None,
                     min_window_s: float) -> int:
    """Steps in each window: enough for the cell's `timed_steps` to fill `min_windows` windows, and
    enough for a window to last `min_window_s` at the warm-up's pace (like pyperf's calibration: a
    window of a few milliseconds would measure the host's jitter)."""
    per_window = max(1, math.ceil(timed_steps / min_windows))
    if step_estimate_s and step_estimate_s > 0:
        per_window = max(per_window, math.ceil(min_window_s / step_estimate_s))
    return per_window


def fixed_step_count(warmup_steps: int, timed_steps: int, settings: TimingSettings) -> int:
    """Steps of a run whose framework owns its loop and must know their number up front (Lightning,
    the Hugging Face Trainer): warm-up, `min_windows` windows of the uncalibrated size, and the
    profiled steps."""
    per_window = steps_per_window(timed_steps, settings.min_windows, None, settings.min_window_s)
    return warmup_steps + settings.min_windows * per_window + profiled_step_count(settings)


def profiled_step_count(settings: TimingSettings) -> int:
    """Steps run after the timed ones to profile: `profile_steps`, and one before them that warms
    the profiler up (execute/profiling.py)."""
    return settings.profile_steps + 1 if settings.profile_steps else 0


def _binomial_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The distribution-free confidence interval of the median of `values`; None if too few values
    for the confidence asked."""
    n = len(values)
    xs = sorted(values)
    best = None
    for j in range(1, n // 2 + 1):
        if 1 - 2 * _binomial_cdf(j - 1, n) >= confidence:
            best = j
        else:
            break
    return None if best is None else (xs[best - 1], xs[n - best])


@dataclass(frozen=True)
class StepTimeSummary:
    """The step time of a cell: median over windows, its interval, and whether it is tight enough."""

    median_s: float
    low_s: float | None
    high_s: float | None
    windows: int

    @property
    def half_width(self) -> float | None:
        """Half the interval's width relative to the median (0.02 = ±2%)."""
        if self.low_s is None:
            return None
        return (self.high_s - self.low_s) / 2 / self.median_s

    def tight(self, target: float) -> bool:
        return self.half_width is not None and self.half_width <= target

    def rate(self, numerator: float) -> tuple[float, float | None, float | None]:
        """A rate numerator / step time: median, low, high (a longer step is a lower rate)."""
        low = numerator / self.high_s if self.high_s else None
        high = numerator / self.low_s if self.low_s else None
        return numerator / self.median_s, low, high


def summarize_windows(step_times_s: list[float]) -> StepTimeSummary:
    """Median step time over windows (each value one window's mean step time) and its interval."""
    interval = median_interval(step_times_s)
    low, high = interval if interval else (None, None)
    return StepTimeSummary(statistics.median(step_times_s), low, high, len(step_times_s))
