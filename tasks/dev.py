"""For ncpsim's own developers: the benchmarks and the test suite."""

from __future__ import annotations

import os
import subprocess
import sys

from invoke import Exit

from tasks.cli import ROOT, ncpsim_task, out_folder, user_errors


@ncpsim_task(
    help={
        "quick": "short run (< 2 min): 2 warm runs, no catalogue, 1,000-callback scale run",
        "install_peers": "install nginx and dnsmasq first if missing (apt-get or brew); without them, "
        "their comparisons are skipped",
        "out": "folder for benchmarks.json and benchmarks.md (default: bench/ in the stack home)",
        "update_docs": "write docs/benchmarks.* (the committed figures) instead",
        "check": "exit 1 when a target is missed (a failed section always does)",
    }
)
@user_errors
def bench(c, quick=False, install_peers=False, out=None, update_docs=False, check=False):
    """Start-up, relays (vs direct, vs nginx), QUIC, scale, DNS (vs dnsmasq): benchmarks.md and .json."""
    import bench as benchmarks  # the task's name shadows the package here

    folder = out_folder(out, "--out") if out else None
    raise Exit(code=benchmarks.run(quick, install_peers, folder, update_docs=update_docs, check=check))


@ncpsim_task(
    help={"k": "only tests matching this expression (pytest -k)", "long": "include long-running tests"}
)
def test(c, k=None, long=False):
    """Run the test suite (the same command CI runs)."""
    cmd = [sys.executable, "-m", "pytest", "-q"]
    if k:
        cmd += ["-k", k]
    if long:
        cmd += ["-m", "long or not long"]
    raise Exit(code=subprocess.call(cmd, cwd=ROOT, env={**os.environ}))
