"""A cell never outlives what started it.

The cell runner starts its launchers in sessions of their own (so a launcher's whole tree can be
stopped together), which also means nothing reaps them when the Snakemake process above dies by a
signal it cannot catch. So each level watches the one above it through the kernel:

- the cell runner watches its driver, the nearest Snakemake process above it (or, run by hand, its
  parent): when the driver exits, the runner stops its launchers' process groups and exits, writing
  no result, so the cell runs again next time;
- every rank watches the cell runner (its pid and host reach the ranks in the environment): when the
  runner is gone, even by SIGKILL, the rank exits, and its launcher with it;
- a node's memory sampler stops when its rank's end of the pipe closes (memory_sampler.py).

Watching is a pidfd (Linux 5.3+): a thread blocks in select() until the kernel reports the exit,
with no polling; where pidfds are missing it checks once a second.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable

CELL_PID_ENV = "TRAINBENCH_CELL_PID"
CELL_HOST_ENV = "TRAINBENCH_CELL_HOST"


def _alive(pid: int) -> bool:
    import psutil  # here, not at the top: a cell runner should not wait 10 ms for it before launching

    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def when_gone(pid: int, then: Callable[[], None], name: str = "watch") -> threading.Thread:
    """Call `then` (from a daemon thread) once process `pid` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])
            os.close(fd)
        else:
            while _alive(pid):
                time.sleep(1)
        then()

    if fd is None and not _alive(pid):
        then()
    thread = threading.Thread(target=wait, name=name, daemon=True)
    thread.start()
    return thread


def wait_for_an_exit(pids: list[int], timeout: float) -> None:
    """Return as soon as one of the processes `pids` (children not yet reaped) exits, or after
    `timeout` seconds: a waiter that sleeps in steps instead notices an exit half a step late on
    average, in every cell. Sleeps the whole timeout where pidfds are missing."""
    fds: list[int] = []
    try:
        for pid in pids:
            fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        for fd in fds:
            os.close(fd)
        time.sleep(timeout)
        return
    try:
        select.select(fds, [], [], timeout)
    finally:
        for fd in fds:
            os.close(fd)


def driver_pid() -> int:
    """The process whose end must end this cell: the nearest ancestor running Snakemake (past the job's
    shell), or this process's parent when nothing above is Snakemake (a cell run by hand)."""
    pid = os.getpid()
    for _ in range(6):
        try:
            pid, cmdline = _parent_and_its_command(pid)
        except (OSError, ValueError):
            break
        if pid <= 1:
            break
        if "snakemake" in cmdline:
            return pid
    return os.getppid()


def _parent_and_its_command(pid: int) -> tuple[int, str]:
    """A process's parent and the parent's command line. From /proc where there is one: psutil's
    import alone takes 10 ms, and a cell runner asks this before it launches anything."""
    if not os.path.isdir("/proc/self"):
        import psutil

        parent = psutil.Process(pid).parent()
        if parent is None:
            raise ValueError(f"process {pid} has no parent")
        try:
            return parent.pid, " ".join(parent.cmdline())
        except psutil.Error:
            return parent.pid, ""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'
        ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as cmdline:
            return ppid, cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # not ours to read, or already gone: not Snakemake as far as we can tell
        return ppid, ""


def runner_environment() -> dict[str, str]:
    """What a cell runner tells its ranks so that they can watch it."""
    return {CELL_PID_ENV: str(os.getpid()), CELL_HOST_ENV: socket.gethostname()}


def runner_to_watch() -> int | None:
    """A rank's cell runner, if it runs on this host (ranks on other nodes are SLURM's to stop)."""
    pid = os.environ.get(CELL_PID_ENV)
    if not pid or os.environ.get(CELL_HOST_ENV) != socket.gethostname():
        return None
    return int(pid)


def stale_lock_hint(directory: str = ".") -> str | None:
    """What to tell a user whose last Snakemake run here was killed: its lock stays in .snakemake/locks,
    and Snakemake would only say that the directory cannot be locked. None while a Snakemake process
    still runs in this directory (then the lock is live) or when there is no lock."""
    locks = os.path.join(directory, ".snakemake", "locks")
    if not os.path.isdir(locks) or not os.listdir(locks):
        return None
    import psutil

    here, me = os.path.realpath(directory), os.getpid()
    for process in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            if (process.info["pid"] != me and "snakemake" in " ".join(process.info["cmdline"] or [])
                    and process.info["cwd"] and os.path.realpath(process.info["cwd"]) == here):
                return None
        except (psutil.AccessDenied, psutil.NoSuchProcess, TypeError):
            continue
    return ("a Snakemake run in this folder was stopped without cleaning up: its lock is still in "
            ".snakemake/locks and no Snakemake runs here now. Nothing is lost: finished cells kept their "
            "results, and a cell that was running left none, so it runs again. Go on with "
            "`snakemake --unlock`, then your command again.")


def stop_cells_on_sigterm() -> None:
    """Make SIGTERM to Snakemake stop its running cells too (call from the workflow's onstart).

    Snakemake's own SIGTERM is graceful: it starts no new job and waits for the running ones. A cell can
    run for an hour, and whoever sends SIGTERM (a shutdown, a batch system, `kill`) kills for good after
    a grace period. So the cells stop at once, writing no result (they run again next time), and
    Snakemake then stops as it does."""
    import signal

    import psutil

    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum, frame) -> None:
        for child in psutil.Process().children(recursive=True):
            try:
                if "trainbench run-cell" in " ".join(child.cmdline()):
                    child.terminate()  # the cell runner stops its ranks and exits (cellrun.run_cell)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
