"""The thread exponent (time_model.CPU_THREAD_EXPONENT) chosen on thread curves no fit is given
(`trainbench check-models time --thread-exponents A ...`, with the curves as --held-out): for each
exponent the model is fitted on the folders' cells and predicts every curve, and each curve is read at
the exponent the other curves chose. Writes nothing."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from trainbench.checks.inputs import counted_params
from trainbench.checks.inputs import published
from trainbench.checks.step_time import label, leave_one_out, measured_cells
from trainbench.predict import time_model
from trainbench.registry.hardware import gpu_type_of
from trainbench.reporting.compare import shorten


def curve_of(cell: dict) -> str:
    """A thread curve's name: the cell run at several thread counts (its label, which names no threads)."""
    return label(cell["result"])


def with_work_again(cells: list[dict]) -> list[dict]:
    """The cells with their work computed again from their parameters (after a change to the model's
    module constants), as measured_cells computed it."""
    return [{**c, "work": time_model.work(counted_params(c["result"].params),
                                          gpu_type_of(c["result"].gpu_name), c["threads"])}
            for c in cells]


def thread_exponent_choice(folders: list[Path], held_folders: list[Path], exponents: list[float]) -> None:
    """The thread exponent (time_model.CPU_THREAD_EXPONENT) from the held-out thread curves, honestly:
    for each exponent the model is fitted on the folders' cells and predicts every curve; each curve's
    error is then read at the exponent the *other* curves chose (the smallest median |error| over
    them), so no curve is predicted with an exponent it chose. The exponent all curves choose is
    the one to commit."""
    base = time_model.CPU_THREAD_EXPONENT
    errors: dict[float, list[tuple[str, int, float]]] = {}
    fits: dict[float, str] = {}
    every, held_out = measured_cells(folders), measured_cells(held_folders)  # read once
    try:
        for exponent in exponents:
            time_model.CPU_THREAD_EXPONENT = exponent  # work() reads it: the cells' work again
            cells, held = with_work_again(every), with_work_again(held_out)
            errors[exponent] = []
            loo = []
            for gpu in sorted({c["gpu"] for c in held}):
                chosen = [c for c in cells if c["gpu"] == gpu]
                works = time_model.stack([c["work"] for c in chosen])
                measured = np.array([c["measured_s"] for c in chosen])
                constants = time_model.fit(works, measured)
                loo += list(np.abs(leave_one_out(works, measured, constants) / measured - 1) * 100)
                for c in held:
                    if c["gpu"] == gpu:
                        predicted = float(time_model.step_time(c["work"], constants))
                        errors[exponent].append((curve_of(c), c["threads"],
                                                 100 * (predicted - c["measured_s"]) / c["measured_s"]))
            fits[exponent] = f"{statistics.median(loo):.1f}% / {max(loo):.1f}%"
    finally:
        time_model.CPU_THREAD_EXPONENT = base
    curves = sorted({curve for rows in errors.values() for curve, _, _ in rows})

    def median(exponent: float, keep) -> float:
        return statistics.median(abs(e) for curve, _, e in errors[exponent] if keep(curve))

    print("thread curves (never fitted) by the exponent threads are raised to, |error| median by curve; "
          "the fitted cells leave-one-out median / worst:")
    print(f"{'exponent':>8}  " + "  ".join(f"{shorten(c, 30):>30}" for c in curves)
          + f"  {'all':>6}  fitted cells")
    for exponent in exponents:
        print(f"{exponent:>8g}  " + "  ".join(f"{median(exponent, lambda x, c=c: x == c):>29.1f}%"
                                              for c in curves)
              + f"  {median(exponent, lambda x: True):>5.1f}%  {fits[exponent]}")
    print("\neach curve at the exponent the other curves chose:")
    crossed = []
    for curve in curves:
        chosen = min(exponents, key=lambda e: median(e, lambda x: x != curve))
        rows = [(t, e) for c, t, e in errors[chosen] if c == curve]
        crossed += [abs(e) for _, e in rows]
        print(f"  {shorten(curve, 52):<52} exponent {chosen:g}: "
              + ", ".join(f"{t} threads {e:+.1f}%" for t, e in sorted(rows)))
    print(f"held out across curves: {len(crossed)} cells, |error| median {statistics.median(crossed):.1f}%, "
          f"worst {max(crossed):.1f}%")
    best = min(exponents, key=lambda e: median(e, lambda x: True))
    print(f"chosen on all curves: {best:g} (time_model.CPU_THREAD_EXPONENT is {base:g})")


def run(args) -> int:
    thread_exponent_choice(args.folders or published("runs", "search"), args.held_out, args.thread_exponents)
    return 0
