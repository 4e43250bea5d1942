"""Every rank of a running cell, watched: one that dies, freezes or stops making progress ends the cell
within seconds, with a true reason, and nothing of the cell outlives it.

Each rank keeps a progress file (`work/progress/rank<r>`: its pid, host, step, phase and the time,
rewritten at most once a second and at every change of phase: `Progress`). The cell runner reads
them while its launchers run (`RankWatch.check`, once a second) and ends the attempt when

- a rank of this host is gone (killed, crashed without a word) while the cell has no result: the
  launcher is given a few seconds to stop the others and say how the rank ended (torchrun names its
  root cause: rank, exit code, signal), then everything is stopped;
- a rank is stopped (SIGSTOP, a debugger, a frozen container) for `STOPPED_GRACE_S`;
- no rank has made progress for the stall limit, once the first step is done: the rank furthest
  behind is named. The limit is the cell's `timing.stall_s`, or twenty times its slowest step so far
  with a floor of two minutes: a healthy step is never that slow, and a collective that does not
  complete (a hung peer, a lost node) stops every rank's progress.

Losing a rank to a signal, its node, or a freeze is the infrastructure's failure, not the cell's: the
attempt is retried (`retries`), and a result that still says so is run again by the next run
(freshness.py). A stall is the cell's own failure (a deadlock in the model's code stalls it too).

Whatever way an attempt ends, `sweep` kills every process of the cell (SIGKILL, stopped ones included),
found by the token each rank carries in its environment, whichever process group or session it is
in (torchrun starts each rank in a session of its own), and waits until they are gone.

Nor does a cell outlive what started it. The cell runner starts its launchers in sessions of their
own (so a launcher's whole tree can be stopped together), which also means nothing reaps them when
the Snakemake process above dies by a signal it cannot catch. So each level watches the one above
it through the kernel:

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
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainbench.execute.launch import LAUNCHER_LOGS

PROGRESS_DIR = "progress"
CELL_TOKEN_ENV = "TRAINBENCH_CELL_TOKEN"  # set in every rank's environment: what `sweep` looks for
STOPPED_GRACE_S = 5.0  # a rank stopped this long is frozen
DEAD_GRACE_S = 10.0  # after a rank is gone, how long its launcher has to stop the others and report
STALL_FLOOR_S = 120.0
STALL_STEPS = 20  # the stall limit is this many of the slowest step seen, at least the floor
SWEEP_WAIT_S = 15.0

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


@dataclass
class Progress:
    rank: int
    pid: int
    host: str
    step: int
    phase: str
    time: float

    @classmethod
    def read(cls, path: Path) -> Progress | None:
        try:
            rank, pid, host, step, phase, stamp = path.read_text().split()
            return cls(int(rank), int(pid), host, int(step), phase, float(stamp))
        except (OSError, ValueError):
            return None  # being written, or not yet


class ProgressWriter:
    """A rank's side: its progress file, rewritten in place (a short line; a reader that catches it
    mid-write reads nothing and asks again a second later)."""

    def __init__(self, work_dir: Path, rank: int):
        folder = work_dir / PROGRESS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"rank{rank}"
        self.rank, self.pid, self.host = rank, os.getpid(), socket.gethostname()
        self.last_write, self.last_phase = 0.0, None
        self.slowest_step = 0.0

    def beat(self, step: int, phase: str, force: bool = False) -> None:
        now = time.time()
        if not force and phase == self.last_phase and now - self.last_write < 1.0:
            return
        self.path.write_text(f"{self.rank} {self.pid} {self.host} {step} {phase} {now:.3f}\n")
        self.last_write, self.last_phase = now, phase


@dataclass
class Verdict:
    """How an attempt went wrong, as the watch saw it."""

    kind: str  # "dead", "stopped", "stalled"
    rank: int
    host: str
    reason: str
    infrastructure: bool


def process_status(pid: int) -> str | None:
    """'running', 'sleeping', 'stopped', ... or None where the process is gone (a zombie is gone)."""
    import psutil

    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return None
    return None if status == psutil.STATUS_ZOMBIE else status


class RankWatch:
    def __init__(self, work_dir: Path, stall_s: float | None = None):
        self.folder = work_dir / PROGRESS_DIR
        self.work_dir = work_dir
        self.stall_s = stall_s
        self.here = socket.gethostname()
        self.stopped_since: dict[int, float] = {}
        self.gone_since: dict[int, float] = {}
        self.slowest_step = 0.0
        self.steps_seen: dict[int, tuple[int, float]] = {}  # rank -> (step, when it was first seen)

    def progress(self) -> list[Progress]:
        found = [Progress.read(p) for p in sorted(self.folder.glob("rank*"))]
        return [p for p in found if p is not None]

    def stall_limit(self) -> float:
        if self.stall_s is not None:
            return self.stall_s
        return max(STALL_FLOOR_S, STALL_STEPS * self.slowest_step)

    def check(self, now: float | None = None) -> Verdict | None:
        """What is wrong with the ranks now, or None. A result already written (the cell ended) is
        no failure: ranks finishing one after the other are not dead ones."""
        now = time.time() if now is None else now
        if (self.work_dir / "result.json").exists():
            return None
        ranks = self.progress()
        for p in ranks:
            seen = self.steps_seen.get(p.rank)
            if seen is None or seen[0] != p.step:
                if seen is not None and p.step > seen[0]:
                    self.slowest_step = max(self.slowest_step, (p.time - seen[1]) / (p.step - seen[0]))
                self.steps_seen[p.rank] = (p.step, p.time)
        reported = {path.stem for path in self.work_dir.glob("rank*.json")}  # failed, and said why
        for p in ranks:
            if p.host != self.here or p.phase in ("done", "failed") or f"rank{p.rank}" in reported:
                continue
            status = process_status(p.pid)
            if status is None:
                self.gone_since.setdefault(p.rank, now)
                return Verdict("dead", p.rank, p.host, f"rank {p.rank} on {p.host} (pid {p.pid}) ended at "
                               f"{_where(p)}", infrastructure=True)
            if status == "stopped":
                since = self.stopped_since.setdefault(p.rank, now)
                if now - since >= STOPPED_GRACE_S:
                    return Verdict("stopped", p.rank, p.host,
                                   f"rank {p.rank} on {p.host} (pid {p.pid}) was stopped (SIGSTOP) at "
                                   f"{_where(p)} and made no progress for {now - p.time:.0f} s",
                                   infrastructure=True)
            else:
                self.stopped_since.pop(p.rank, None)
        stepping = [p for p in ranks if p.step > 0 and p.phase != "done"]
        if stepping:
            limit = self.stall_limit()
            latest = max(p.time for p in stepping)
            if now - latest > limit:
                behind = min(stepping, key=lambda p: (p.step, p.time))
                others = sorted({p.step for p in stepping if p.rank != behind.rank})
                if others and min(others) == behind.step:  # all alike: no rank to blame
                    return Verdict("stalled", behind.rank, behind.host,
                                   f"no rank made progress for {now - latest:.0f} s (the limit: {limit:.0f} "
                                   f"s): all at {_where(behind)}", infrastructure=False)
                at = f"; the others at step {', '.join(map(str, others))}" if others else ""
                return Verdict("stalled", behind.rank, behind.host,
                               f"rank {behind.rank} made no progress for {now - behind.time:.0f} s (the "
                               f"limit: {limit:.0f} s), last at {_where(behind)}{at}", infrastructure=False)
        return None


def _where(p: Progress) -> str:
    if p.phase == "step":
        return f"step {p.step}" if p.step <= 10 else f"step {p.step} or a little after"
    return p.phase + (f" after step {p.step}" if p.step else "")


# --- what the launcher said of a rank that ended ---------------------------------------------------------

ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?"
                        r"exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)", re.S)


FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", re.M)


def root_cause(launcher_output: str) -> tuple[int, int] | None:
    """torchrun's report of the first rank that failed: (rank, exit code; a signal is negative)."""
    found = ROOT_CAUSE.findall(launcher_output)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def failures(launcher_output: str) -> list[tuple[int, int]]:
    """Every rank torchrun's last report says failed, (rank, exit code), its root cause first.

    torchrun takes the failure of the earliest timestamp for the root cause, in whole seconds: a rank
    killed by a signal and a peer that failed for its loss in the same second tie, and the lower rank
    is named, however it ended. Its other failures tell them apart."""
    start = launcher_output.rfind("Failures:")
    if start < 0:
        return []
    found = [(int(rank), int(code)) for rank, code in FAILURE.findall(launcher_output[start:])]
    cause = root_cause(launcher_output)
    return sorted(found, key=lambda failure: failure != cause)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"{signal.Signals(-code).name} (signal {-code})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def last_lines(work_dir: Path, rank: int, ranks_per_node: int = 0, count: int = 4) -> list[str]:
    """The last lines a rank printed, from torchrun's own copy of its output (--tee 3 --log-dir): its
    stderr's, else its stdout's. Multi-node, a rank's local number on its node names its files."""
    local = rank % ranks_per_node if ranks_per_node else rank
    for name in ("stderr.log", "stdout.log"):
        for path in sorted((work_dir / LAUNCHER_LOGS).glob(f"*/attempt_*/{local}/{name}")):
            try:
                text = path.read_text(errors="replace")
                lines = [line.strip() for line in text.splitlines() if line.strip()]
            except OSError:
                continue
            if lines:
                return [line[:200] for line in lines[-count:]]
    return []


# --- nothing outlives the cell --------------------------------------------------------------------------

def processes_of(token: str) -> list:
    """This host's processes whose environment carries the cell's token (a rank, its launcher, what a
    rank started), whatever session they are in, stopped ones included."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == os.getpid():
            continue
        try:
            if process.environ().get(CELL_TOKEN_ENV) == token:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def sweep(token: str, wait_s: float = SWEEP_WAIT_S) -> list[int]:
    """Kill every process of the cell (SIGKILL: a stopped process takes it too) and wait until they are
    gone; the pids it had to kill."""
    import psutil

    left = processes_of(token)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(left, timeout=wait_s)
    return [p.pid for p in left if p not in alive] + [p.pid for p in alive]
