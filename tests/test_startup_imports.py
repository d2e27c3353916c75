"""`ncpsim up` reaches its first component without the imports it needs only later or elsewhere.

The command line's imports were most of its work before the stack's first component (issue 32,
bench/findings.md): aioquic came with the replay client's Context, the bundle's readers with every up, rich
with the report's module. A real `ncpsim up` process runs until the launch asks its zygote for the first
component; there it lists its modules and exits, and the test stops the zygote it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from timeouts import COMMAND

from clusters.local import LocalStack

REPO = Path(__file__).resolve().parents[1]
# Each of these is needed only after the first component (rich: the report), or only by other commands and
# components (aioquic: the worker hosts and the proxy; grpc: a gRPC scenario's client; the bundle's readers).
NOT_BEFORE_FIRST_FORK = ("aioquic", "grpc", "rich", "tarfile", "scenarios.bundle", "scenarios.diagnose")
# What the launch has surely imported by its first fork: the snapshot is late enough to mean something.
BY_FIRST_FORK = ("scenarios.engine", "scenarios.load", "clusters.local.launcher", "sim.client.http_client")

# The command line with Zygote.fork replaced: at the first fork, print the modules and end the process (the
# zygote ends as its socket closes). `first` is imported before the command runs (the negative control).
PROBE = """
import json, os, sys
for name in sys.argv[1:]:
    __import__(name)
from clusters.local import zygote

def fork(self, argv, ready_fd, log_fd):
    print(json.dumps(sorted(sys.modules)), flush=True)
    os._exit(0)

zygote.Zygote.fork = fork
from tasks.program import main
sys.argv = ["ncpsim", "up", "http-callback", "--stack", "imports"]
main()
"""


def modules_at_first_fork(home: Path, *first: str) -> set[str]:
    env = {**os.environ, "NCPSIM_HOME": str(home)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, *first],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND,
            check=False,
        )
    finally:
        LocalStack("imports", root=home).down()  # the launch's zygote, by its title
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The `names` (packages included) that `modules` holds."""
    return [name for name in names if any(m == name or m.startswith(f"{name}.") for m in modules)]


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        ((), []),
        (("sim.runtime.quic_dial",), ["aioquic"]),  # control: what the check finds when it is there
    ],
)
def test_up_imports_no_quic_bundle_or_report_before_its_first_component(
    tmp_path: Path, first: tuple[str, ...], expected: list[str]
) -> None:
    modules = modules_at_first_fork(tmp_path / "home", *first)
    assert loaded(modules, BY_FIRST_FORK) == list(BY_FIRST_FORK)
    assert loaded(modules, NOT_BEFORE_FIRST_FORK) == expected
