"""The machine a benchmark ran on: what the table's figures mean depends on it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from sim.runtime.run import event_loop


def _cpu_model() -> str:
    # psutil does not name the CPU; /proc/cpuinfo does on Linux.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    return round(psutil.virtual_memory().total / 2**30, 1)


def load_average() -> list[float]:
    return [round(x, 2) for x in psutil.getloadavg()]


def cpu_busy(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over `seconds` (idle and I/O wait are not busy): what other work takes from
    the benchmark. The load average is no guide on some virtual machines (seen here: 2.7 with every CPU idle).
    """
    return round(psutil.cpu_percent(interval=seconds) / 100, 3)  # the sampling window, not a readiness wait


def _version(cmd: list[str]) -> str | None:
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0] if text else None


def describe() -> dict[str, Any]:
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else psutil.cpu_count()
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
