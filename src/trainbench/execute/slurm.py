"""Before the SLURM executor submits anything: make sure it can see its jobs finish.

snakemake-executor-plugin-slurm follows its jobs with `sacct` where the command exists, or `squeue`.
On a cluster whose job accounting is off, `sacct` exists but every query fails ("Slurm accounting
storage is disabled"): the plugin then retries silently, and a workflow whose jobs finished in
seconds waits forever. So the workflow checks, once, that the status command it will use answers,
and switches to one that does (telling the user), or stops with one message naming the flag.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

FLAG = "--slurm-status-command"
# the plugin falls back from squeue to sacct when MinJobAge is below this many status intervals
PLUGIN_FALLBACK_INTERVALS = 3


@dataclass(frozen=True)
class Probe:
    works: bool
    why: str = ""


def probe(command: str, run: Callable = subprocess.run) -> Probe:
    """Ask `sacct` or `squeue` about a job name nobody uses, as the plugin's status query does."""
    if shutil.which(command) is None:
        return Probe(False, f"{command} is not installed")
    argv = {"sacct": ["sacct", "-X", "--parsable2", "--noheader", "--format=JobIdRaw,State", "--starttime",
                      "now-1hours", "--endtime", "now", "--name", "trainbench-status-probe"],
            "squeue": ["squeue", "--noheader", "--name", "trainbench-status-probe"]}[command]
    try:
        done = run(argv, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return Probe(False, f"{command} did not answer within 30 s")
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return Probe(False, f"{command} failed: {said[-1] if said else f'exit status {done.returncode}'}")
    return Probe(True)


def min_job_age_s(run: Callable = subprocess.run) -> int | None:
    """How long slurmctld remembers a finished job (squeue sees it that long), from scontrol."""
    try:
        done = run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MinJobAge":
            digits = value.strip().split()[0] if value.strip() else ""
            return int(digits) if digits.isdigit() else None
    return None


class StatusCommandError(Exception):
    """Neither status command can follow this cluster's jobs."""


def choose_status_command(asked: str, *, first_check_s: float, probe_fn: Callable[[str], Probe] = probe,
                          min_job_age_fn: Callable[[], int | None] = min_job_age_s) -> tuple[str, str | None]:
    """The status command to follow jobs with, and what to tell the user if it is not the one asked.

    Raises StatusCommandError when no command works (or when the one that works is one the plugin
    would abandon for the broken one).
    """
    asked_probe = probe_fn(asked)
    other = "squeue" if asked == "sacct" else "sacct"
    if asked_probe.works:
        if asked == "squeue" and not probe_fn("sacct").works:
            _check_squeue_is_kept(first_check_s, min_job_age_fn)
        return asked, None
    other_probe = probe_fn(other)
    if not other_probe.works:
        raise StatusCommandError(f"the SLURM executor cannot follow its jobs here: {asked_probe.why}; "
                                 f"{other_probe.why}")
    if other == "squeue":
        _check_squeue_is_kept(first_check_s, min_job_age_fn)
    return other, (f"{asked_probe.why}; following jobs with {other} instead (set {FLAG} {other} "
                   f"to say so yourself)")


def _check_squeue_is_kept(first_check_s: float, min_job_age_fn) -> None:
    """The plugin swaps squeue for sacct (when sacct exists) if finished jobs may leave squeue's view
    before its first status check; with a broken sacct that swap is the silent wait again."""
    age = min_job_age_fn()
    threshold = PLUGIN_FALLBACK_INTERVALS * first_check_s
    if shutil.which("sacct") and (age is None or age < threshold):
        raise StatusCommandError(
            f"sacct does not work here, and squeue cannot be used either: slurmctld forgets finished jobs "
            f"after MinJobAge={age if age is not None else 'unknown'} s, under the {threshold:.0f} s that "
            f"snakemake-executor-plugin-slurm needs for squeue "
            f"(3 x --slurm-init-seconds-before-status-checks); "
            f"lower that flag, or ask the cluster's admins for a longer MinJobAge or for job accounting")


def ensure_status_command(workflow, say: Callable[[str], None] = print) -> None:
    """Snakemake's onstart hook: under the SLURM executor, check (and if need be switch) the status
    command before any job is submitted. Does nothing for other executors."""
    plugin = getattr(workflow, "executor_plugin", None)
    settings = getattr(workflow, "executor_settings", None)
    if getattr(plugin, "name", None) != "slurm" or settings is None:
        return
    asked = getattr(settings, "status_command", None) or "sacct"
    first_check = getattr(settings, "init_seconds_before_status_checks", None) or 40
    command, message = choose_status_command(asked, first_check_s=first_check)
    if message:
        say(f"trainbench: {message}")
        settings.status_command = command
