"""ruff, as the suite runs it: the tree is formatted, and clean under the defaults plus complexity (C901 at
12), bugbear and simplify ([tool.ruff] in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_TIMEOUT = 60.0


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "."],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT,
        check=False,
    )


def test_ruff_check_is_clean() -> None:
    done = ruff("check", "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_tree_is_formatted() -> None:
    done = ruff("format", "--check", "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr
