"""Processes the benchmark starts (nginx, dnsmasq, `invoke`), and what psutil says about any process.

Everything is started in its own session (process group) and stopped by that group's id, so a helper's
children (nginx's workers) go with it. CPU and memory come from psutil; PSS where the platform
has it (Linux), else it reads as zero and the report leaves it out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Self

import psutil

STOP_GRACE = 3.0


def spawn(
    cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    """Start `cmd` in a new session with stdout and stderr to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )


def stop(proc: subprocess.Popen, grace: float = STOP_GRACE) -> None:
    """SIGTERM the process group, SIGKILL it if it outlives `grace`, and reap the leader."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    # The leader is gone; members of its group (nginx workers) may linger a moment longer.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port the kernel just handed out on 127.0.0.1 (for tools that cannot bind port 0 and report it)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:  # gone since it was listed
        return None


def groups_members(pgids: Iterable[int]) -> dict[int, list[int]]:
    """Live processes by process group, for each of `pgids`, in one pass over the process table (a
    getpgid each: the sampler runs this five times a second beside a 10,000-worker fleet)."""
    wanted = set(pgids)
    found: dict[int, list[int]] = {pgid: [] for pgid in wanted}
    for pid in psutil.pids():
        if (pgid := _pgid(pid)) in wanted:
            found[pgid].append(pid)
    return found


def parents(pids: Iterable[int]) -> set[int]:
    """The parents of the live processes among `pids`."""
    found = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.add(psutil.Process(pid).ppid())
    return found


def gone(pids: Iterable[int], timeout: float = STOP_GRACE) -> list[int]:
    """Wait until none of `pids` is alive (children or not), at most `timeout`; those still alive."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [proc.pid for proc in alive]


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (a helper and the children it forked)."""
    return groups_members([pgid])[pgid]


def _each(pids: Iterable[int], read: Callable[[psutil.Process], float]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # gone between listing and reading, or not ours
            total += read(psutil.Process(pid))
    return total


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU time the processes have used so far."""
    return _each(pids, lambda proc: sum(proc.cpu_times()[:2]))


def rss_bytes(pids: Iterable[int]) -> int:
    return int(_each(pids, lambda proc: proc.memory_info().rss))


def pss_bytes(pids: Iterable[int]) -> int:
    """Proportional set size: each page shared by n processes counts 1/n in each, so a sum over processes
    counts it once (RSS counts the pages forked processes share from their zygote in every one). Zero
    where the platform has no PSS (psutil reports it on Linux only)."""
    return pss_shares(pids)[0]


def pss_shares(pids: Iterable[int]) -> tuple[int, int]:
    """The PSS sum and its anonymous part (heap, stacks, what the forks wrote: Pss_Anon and Pss_Shmem of
    /proc/PID/smaps_rollup). The rest is file pages (the programs' and libraries' code), which the page
    cache keeps after the processes exit: a machine's delta across `up` and `down` sees only the anonymous
    part. Where smaps_rollup cannot be read, psutil's PSS and no anonymous part."""
    pss = anon = 0
    for pid in pids:
        if rollup := _rollup(pid):
            pss += rollup.get("Pss", 0)
            anon += rollup.get("Pss_Anon", 0) + rollup.get("Pss_Shmem", 0)
        else:
            pss += int(_each([pid], lambda proc: getattr(proc.memory_full_info(), "pss", 0)))
    return pss, anon


def _rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in bytes (Linux 4.14+), empty where there is none or the process is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            found[name] = int(rest.split()[0]) * 1024
    return found


def machine_used_bytes() -> int:
    """What the machine has given out: total less what the kernel says is available to a new program
    (MemTotal - MemAvailable on Linux). Unlike a sum over processes it also holds the kernel's share
    (page tables, socket buffers, unreclaimable slab) and every other process's, so a delta across a run
    is the fleet's cost to the machine only when nothing else on it moved."""
    memory = psutil.virtual_memory()
    return int(memory.total - memory.available)


KERNEL_FIELDS = ("PageTables", "SUnreclaim", "KernelStack", "Shmem")


def kernel_bytes(meminfo: Path = Path("/proc/meminfo")) -> dict[str, int]:
    """The kernel's own allocations that a machine delta holds and no process's PSS does (Linux; empty
    elsewhere): what explains a gap between the two."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        name, _, rest = line.partition(":")
        if name in KERNEL_FIELDS:
            found[name] = int(rest.split()[0]) * 1024  # /proc/meminfo counts kB
    return found


class MemorySampler:
    """Samples the memory of `groups()` (pids by role) on a thread, three ways. RSS sum every sample:
    `peak` is the largest and `peak_by_role` how that sample split (the roles add up to the peak); it counts
    every page the zygote's forks share once in each process. PSS sum every `pss_every`-th sample (dearer:
    the kernel walks each process's pages): `peak_pss`, its split `peak_pss_by_role` and its anonymous part
    `peak_pss_anon`, each page once. The
    machine's used memory (`machine_used_bytes`) every sample: `peak_machine` is its largest, with the
    kernel's allocations at that moment in `kernel_at_peak`."""

    def __init__(
        self, groups: Callable[[], Mapping[str, Iterable[int]]], interval: float = 0.2, pss_every: int = 5
    ):
        self.groups, self.interval, self.pss_every = groups, interval, pss_every
        self.peak = self.peak_pss = self.peak_machine = 0
        self.peak_pss_anon = 0  # the anonymous part of the peak PSS sample (pss_shares)
        self.peak_by_role: dict[str, int] = {}
        self.peak_pss_by_role: dict[str, int] = {}
        self.kernel_at_peak: dict[str, int] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        groups = self.groups()
        by_role = {role: rss_bytes(pids) for role, pids in groups.items()}
        if sum(by_role.values()) > self.peak:
            self.peak, self.peak_by_role = sum(by_role.values()), by_role
        if self.samples % self.pss_every == 0:
            shares = {role: pss_shares(pids) for role, pids in groups.items()}
            if (pss := sum(total for total, _ in shares.values())) > self.peak_pss:
                self.peak_pss, self.peak_pss_anon = pss, sum(anon for _, anon in shares.values())
                self.peak_pss_by_role = {role: total for role, (total, _) in shares.items()}
        if (used := machine_used_bytes()) > self.peak_machine:
            self.peak_machine, self.kernel_at_peak = used, kernel_bytes()
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()


class CpuMeter:
    """CPU seconds used by a set of processes between `__enter__` and `__exit__`."""

    def __init__(self, pids: Callable[[], list[int]]):
        self.pids = pids
        self.seconds = 0.0
        self._start = 0.0
        self._wall = 0.0
        self.wall = 0.0

    def __enter__(self) -> Self:
        self._start, self._wall = cpu_seconds(self.pids()), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = cpu_seconds(self.pids()) - self._start
        self.wall = time.perf_counter() - self._wall
