"""mypy, strict, on the pure cores listed under [tool.mypy] in pyproject.toml (the proxy's policy, the DNS
rule, values, scenario expectations and the runbook models): a type error there fails the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MYPY_TIMEOUT = 120.0  # seconds; about 3 s with a warm cache, 20 s cold on 2 cores


def test_pure_cores_type_check_strictly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--config-file", str(REPO / "pyproject.toml")],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=MYPY_TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
