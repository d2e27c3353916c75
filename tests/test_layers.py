"""The import layers of DESIGN.md section 4, as the import-linter contracts in pyproject.toml state them:
tasks/ | bench/ | scenarios/ | clusters/ | sim/ | dns/, certs/ (these two use only sim.errors).
Nothing imports upward, lazy imports inside functions included; a broken contract fails the suite with
import-linter's own account of each offending import chain."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINT_TIMEOUT = 60.0  # seconds; the whole tree takes well under one


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache"],  # reads pyproject.toml in cwd
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT,
    )
    report = done.stdout + done.stderr
    assert "Contracts:" in report, report  # the contracts ran at all (not a configuration error)
    assert done.returncode == 0, report[report.find("Broken contracts") :] or report
