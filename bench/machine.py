"""The machine a benchmark ran on: what the table's figures mean depends on it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sim.runtime.run import event_loop


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_busy(seconds: float = 1.0) -> float | None:
    """Share of all CPUs busy over `seconds`, from /proc/stat: what other work takes from the benchmark.

    The load average is no guide on some virtual machines (seen here: 2.7 with every CPU idle).
    """

    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as stat:
                fields = [int(x) for x in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields)

    first = sample()
    time.sleep(seconds)  # the sampling window, not a wait for readiness
    second = sample()
    if first is None or second is None or second[1] == first[1]:
        return None
    return round(1 - (second[0] - first[0]) / (second[1] - first[1]), 3)


def _version(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0] if text else None


def describe() -> dict[str, Any]:
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nproc": nproc,
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "python": sys.version.split()[0],
        "event_loop": event_loop(os.environ.get("NCPSIM_EVENT_LOOP")),  # the components'
        "os": platform.platform(),
        "nginx": _version(["nginx", "-v"]),
        "dnsmasq": _version(["dnsmasq", "--version"]),
        "load_average_start": load_average(),
        "cpu_busy_start": cpu_busy(),
    }
