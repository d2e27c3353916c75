"""The machine a benchmark ran on: what the table's figures mean depends on it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


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
        "os": platform.platform(),
        "nginx": _version(["nginx", "-v"]),
        "dnsmasq": _version(["dnsmasq", "--version"]),
        "load_average_start": load_average(),
    }
