"""The figures a result's timed windows give: throughput, TFLOPS and MFU from step times, each a median
with its 95% interval.

MFU = achieved model FLOPs / peak FLOPs of the GPU at the training precision, where model FLOPs per
token are `ModelSpec.train_flops_per_token` (6N + 12 L H Q T, PaLM appendix B). Peaks are the dense
(not 2:4 sparse) tensor-core figures of the data sheets, in hardware.GPUS.

They sit with the result's contract because reading an older result derives them too: one computation
for the run that writes a metrics.json and for the reader of one written before timing windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainbench.registry import hardware
from trainbench.registry.models import get_model
from trainbench.study.params import CellParams
from trainbench.study.timing import TimingSettings, summarize_windows


def peak_flops(gpu_name: str | None, precision: str, tf32: bool) -> float | None:
    """Peak FLOP/s of one GPU (as NVML names it) for this precision; None for CPUs and GPUs the hardware
    table does not know (hardware.GPUS: one table for MFU, the memory model and the time model)."""
    return hardware.peak_flops(hardware.gpu_type_of(gpu_name), precision, tf32)


@dataclass(frozen=True)
class Figure:
    """A measured figure: the median over timed windows and its 95% interval (None: too few windows)."""

    value: float
    low: float | None
    high: float | None

    def interval(self, digits: int) -> list[float] | None:
        return None if self.low is None else [round(self.low, digits), round(self.high, digits)]


@dataclass(frozen=True)
class Throughput:
    step_time_s: Figure
    samples_per_s: Figure
    tokens_per_s: Figure
    tflops_per_gpu: Figure
    mfu: Figure | None
    half_width: float | None  # of the step time's interval, relative to its median
    windows: int


def throughput(step_times_s: list[float], *, global_batch: int, seq_len: int, flops_per_token: float,
               gpus: int, peak: float | None) -> Throughput:
    """Throughput from the windows' mean step times: medians and 95% intervals (see timing.py)."""
    summary = summarize_windows(step_times_s)
    samples = Figure(*summary.rate(global_batch))
    flops_per_gpu = global_batch * seq_len * flops_per_token / gpus
    tflops = Figure(*summary.rate(flops_per_gpu / 1e12))
    mfu = Figure(*summary.rate(flops_per_gpu / peak)) if peak else None
    return Throughput(Figure(summary.median_s, summary.low_s, summary.high_s), samples,
                      Figure(*summary.rate(global_batch * seq_len)), tflops, mfu, summary.half_width,
                      summary.windows)


def timed_metrics(params: CellParams, step_times_s: list[float], *, steps_per_window: int,
                  gpu_name: str | None, target_ci: float = TimingSettings().target_ci) -> dict:
    """The metrics.json figures that come from the timed windows: step time and every rate derived
    from it, each a median with its 95% interval (null where too few windows give none), and whether
    the cell ended `noisy` (its interval wider than the target)."""
    spec = get_model(params.model)
    flops_per_token = spec.train_flops_per_token(params.seq_len, params.head, params.num_classes)
    rate = throughput(step_times_s, global_batch=params.global_batch, seq_len=params.seq_len,
                      flops_per_token=flops_per_token, gpus=params.gpus,
                      peak=peak_flops(gpu_name, params.precision, params.tf32))
    figures = {"step_time_s": (rate.step_time_s, 6), "samples_per_s": (rate.samples_per_s, 3),
               "tokens_per_s": (rate.tokens_per_s, 1), "tflops_per_gpu": (rate.tflops_per_gpu, 4),
               "mfu": (rate.mfu, 4)}
    if params.float8:
        # MFU stays against the precision's (bf16) dense peak, comparable across cells; a float8 cell
        # also has it against the FP8 tensor cores' peak, what its matmuls could reach at most
        fp8 = throughput(step_times_s, global_batch=params.global_batch, seq_len=params.seq_len,
                         flops_per_token=flops_per_token, gpus=params.gpus,
                         peak=hardware.peak_flops_of(hardware.gpu_type_of(gpu_name), "fp8"))
        figures["mfu_fp8"] = (fp8.mfu, 4)
    out: dict = {"steps_timed": len(step_times_s) * steps_per_window, "steps_per_window": steps_per_window,
                 "windows": len(step_times_s), "flops_per_token": flops_per_token}
    for key, (figure, digits) in figures.items():
        out[key] = None if figure is None else round(figure.value, digits)
        out[f"{key}_ci"] = None if figure is None else figure.interval(digits)
    out["ci_half_width"] = None if rate.half_width is None else round(rate.half_width, 5)
    out["noisy"] = rate.half_width is None or rate.half_width > target_ci
    return out
