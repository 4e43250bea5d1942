"""`trainbench check-models memory|time|predictions|emulation`: the command line of the checks. Building
the parser imports no check (they import numpy and the models); running one imports it."""

from __future__ import annotations

from pathlib import Path

from trainbench.checks.inputs import first_present
from trainbench.errors import UsageError

# the thread curves no fit is given: from the repository root, or from the validation workspace
THREADS = ("validation/results/bench/threads", "validation/results/bench/threads")


def add_check_models(sub):
    """The `check-models` command and its four checks, under the command line's subparsers `sub`; its
    parser, for the command line to set its handler (which calls `run`)."""
    checks = sub.add_parser("check-models", help="how good the memory and time models are on the published "
                                                 "results (memory, time, predictions, emulation)",
                            description="Check the memory and time models against what was measured. By "
                                        "default each check reads the published results: results/ (the "
                                        "campaigns) and validation/results/ (the validation rounds), where "
                                        "present.")
    which = checks.add_subparsers(dest="check", required=True, metavar="CHECK")

    memory = which.add_parser("memory", help="the memory model's predicted peak memory and fit/OOM verdicts "
                                             "against every measured cell, in and out of sample")
    memory.add_argument("folders", nargs="*", type=Path, metavar="FOLDER",
                        help="where to find metrics.json files (default: the published runs and searches)")
    memory.add_argument("--csv", type=Path, help="also write the per-cell comparison here")
    memory.add_argument("--snapshots", action="store_true",
                        help="the cells' allocator snapshots beside the model's parts, by category")
    memory.set_defaults(check="memory")

    time = which.add_parser("time", help="the time model's step times, leave-one-out and on held-out cells, "
                                         "and the constants it fits")
    time.add_argument("folders", nargs="*", type=Path, metavar="FOLDER",
                      help="the cells to fit and predict (default: the published runs and searches)")
    time.add_argument("--held-out", nargs="*", type=Path, metavar="FOLDER",
                      help=f"cells to predict with the all-cells fit without fitting on them (default: "
                           f"{THREADS[0]} where present; none: --held-out alone)")
    time.add_argument("--csv", type=Path, help="also write the per-cell comparison here")
    time.add_argument("--thread-exponents", nargs="+", type=float, metavar="A",
                      help="choose the thread exponent on the held-out thread curves, each predicted at the "
                           "exponent the others chose (writes nothing)")
    time.add_argument("--write", action="store_true",
                      help="store the all-cells fit in src/trainbench/predict/time_model_constants.json")
    time.set_defaults(check="time")

    predictions = which.add_parser("predictions", help="predictions committed before cells ran against the "
                                                       "cells' results")
    predictions.add_argument("predictions", type=Path, help="a CSV written by `trainbench predict --gpu`")
    predictions.add_argument("--runs", nargs="+", type=Path, metavar="FOLDER",
                             help="the results' roots, <study>/<cell>/metrics.json below each (default: "
                                  "results/runs and validation/results/runs, where present)")
    predictions.add_argument("--json", type=Path, help="also write every row and the summary here")
    predictions.set_defaults(check="predictions")

    emulation = which.add_parser("emulation", help="emulated ranks against the real ranks of their number "
                                                   "(memory, parameter shards, step time)")
    emulation.add_argument("folders", nargs="*", type=Path, metavar="FOLDER",
                           help="emulated results and their real twins (default: the emulation_check study's "
                                "published runs)")
    emulation.add_argument("--json", type=Path, help="also write the rows here")
    emulation.add_argument("--predictions", type=Path, metavar="CSV",
                           help="the waits of a predictions file committed before the cells ran "
                                "(`trainbench predict`'s emulated_wait_s) for the whole step, instead of "
                                "the model fitted without the cells' study")
    emulation.add_argument("--write-bands", action="store_true",
                           help="write how far real steps came from their whole step, by what the world "
                                "waits on, to src/trainbench/predict/whole_step_bands.json (trainbench fit "
                                "reads it)")
    emulation.set_defaults(check="emulation")

    architectures = which.add_parser(
        "architectures", help="every causal LM of the installed transformers, made tiny: accepted or "
                              "refused, and counted right")
    architectures.add_argument("types", nargs="*", metavar="MODEL_TYPE",
                               help="these model types only (default: every causal LM)")
    architectures.add_argument("--write", action="store_true",
                               help="write the coverage page (docs/architectures.md)")
    architectures.add_argument("--json", type=Path, help="also write every row here")
    architectures.set_defaults(check="architectures")
    return checks


def run(args) -> int:
    """The check `args.check` with its arguments."""
    if args.check == "architectures":
        from trainbench.checks.architectures import run as run_architectures

        return run_architectures(args)
    if args.check == "time":
        return run_time_check(args)
    if args.check == "memory":
        from trainbench.checks import memory

        return memory.run(args)
    if args.check == "predictions":
        from trainbench.checks import predictions

        return predictions.run(args)
    from trainbench.checks import emulation

    return emulation.run(args)


def run_time_check(args) -> int:
    if args.held_out is None:
        args.held_out = first_present(*THREADS)
    if args.thread_exponents:
        if not args.held_out or args.write:
            raise UsageError("--thread-exponents needs --held-out (the thread curves) and writes nothing")
        from trainbench.checks import thread_curves

        return thread_curves.run(args)
    from trainbench.checks import step_time

    return step_time.run(args)
