"""`ncpsim diagnose` on a terminal, and interrupted: a live `[n/N] probe ...` line on a terminal's stderr
(a pipe gets none: tests/test_diagnose.py's command-line tests), and SIGTERM or Ctrl-C stopping every
process of its probe stacks, as `ncpsim up` stops its own (issue 31: "SIGTERM to diagnose leaves 7-18
processes of its probe stacks running"). The diagnosis runs under a pseudo-terminal, as a user runs it."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROGRESS_TIMEOUT = 60.0  # seconds until the first probe's line: imports and the customer's values
RUNNING_TIMEOUT = 60.0  # seconds until a probe stack's components run
STOP_TIMEOUT = 60.0  # seconds the interrupted command may take to stop them all
POLL = 0.1  # seconds between looks at the process table
RUNNING = 5  # processes of the probe stacks seen before the signal: the control that there was work to stop
# A run in the background (`pytest &`, a script's job) ignores SIGINT, and the command would inherit that:
# its Ctrl-C case would then run the diagnosis to its end (exit 1) instead of testing the interruption.
pytestmark = pytest.mark.usefixtures("sigint_as_on_a_terminal")
VALUES = {
    "workerCallbackProxy": {
        "enabled": True,
        "workerDomain": "grpc-worker.example.com",
        "service": {"type": "LoadBalancer"},
    },
    "global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}},
}


def stack_processes(scratch: Path) -> list[psutil.Process]:
    """Every process whose command line names the diagnosis's scratch folder (its probe stacks')."""
    marker = str(scratch)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in arg for arg in proc.info["cmdline"] or []):
            found.append(proc)
    return found


class Terminal:
    """The command's terminal: what it wrote, read as it comes."""

    def __init__(self, fd: int):
        self.fd, self.text = fd, ""

    def read_until(self, wanted: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while wanted not in self.text and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], max(deadline - time.monotonic(), 0))
            if not ready or not self._read():
                break
        return wanted in self.text

    def _read(self) -> bool:
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # EIO: the command exited and closed the terminal
            return False
        self.text += chunk.decode(errors="replace")
        return bool(chunk)


def wait_until(condition, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    """A process table has no event to wait on: look again every POLL seconds, up to `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL)
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_diagnosis_stops_every_probe_stack(tmp_path: Path, sig: signal.Signals) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    values = tmp_path / "customer.yaml"
    values.write_text(yaml.safe_dump(VALUES))
    env = {"NCPSIM_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "TMPDIR": str(scratch)}
    command = [
        sys.executable,
        "-m",
        "invoke",
        "diagnose",
        "-f",
        str(values),
        "--workers",
        "1.4.0:system,1.2.9:system",
    ]
    controller, terminal_fd = pty.openpty()
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=terminal_fd, stderr=terminal_fd
    )
    os.close(terminal_fd)
    terminal = Terminal(controller)
    try:
        assert terminal.read_until("[1/2] probe worker-utils 1.4.0, system roots", PROGRESS_TIMEOUT), (
            terminal.text
        )
        assert wait_until(lambda: len(stack_processes(scratch)) >= RUNNING, RUNNING_TIMEOUT)
        running = stack_processes(scratch)
        proc.send_signal(sig)
        code = proc.wait(STOP_TIMEOUT)
        terminal.read_until("\0", 1.0)  # the rest of what it wrote, up to its exit
        left = [p.info["cmdline"] for p in stack_processes(scratch)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stray in stack_processes(scratch):  # a failing run leaves nothing behind either
            with contextlib.suppress(psutil.NoSuchProcess):
                stray.kill()
        os.close(controller)
    assert code == 130 and "interrupted" in terminal.text, terminal.text
    assert len(running) >= RUNNING and left == [], left
    assert list(scratch.iterdir()) == []  # the scratch folder (stand-in Secrets, probe state) went too
