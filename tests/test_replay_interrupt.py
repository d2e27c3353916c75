"""`ncpsim replay` of several scenarios, ended by Ctrl-C or SIGTERM mid-run, leaves nothing running.

The scenarios run in threads, which no signal reaches: the command's main thread turns both signals into the
cleanup (issue 31, item 4: stopped as `up` is), stops every stack it started, then the ones the scenario
running at the time started after that, and the shared zygote with them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from cli_support import NCPSIM, REPO, ncpsim_process
from timeouts import COMMAND

SCENARIOS = ("http-callback", "upstream-plaintext", "wrong-path")
pytestmark = pytest.mark.usefixtures("sigint_as_on_a_terminal")  # `pytest &` must not make Ctrl-C a no-op


def naming(folder: Path) -> list[str]:
    """Live processes whose command line names `folder` (components, zygotes, nats-servers)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        line = " ".join(proc.info["cmdline"] or ())
        if str(folder) in line and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(f"{proc.pid}: {line}")
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_replay_signalled_while_a_scenario_runs_leaves_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [NCPSIM, "replay", *SCENARIOS, "--jobs", "1"],
        cwd=REPO,
        env={**os.environ, "NCPSIM_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the signal is the test's alone
    )
    try:
        deadline = time.monotonic() + COMMAND
        # The cue: the first scenario's stack is up (status.json is written as its launch completes).
        while not list(home.glob("replay-*/status.json")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no stack came up"
            time.sleep(0.01)
        assert proc.poll() is None, f"the replay ended before the signal:\n{proc.communicate()}"
        assert naming(home), "nothing ran at the signal: this test tested nothing"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=COMMAND)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = naming(home)
    try:
        assert proc.returncode != 0, out
        assert "Traceback" not in err, err
        assert left == [], "left running after the signal"
    finally:
        ncpsim_process("down", "--all", home=home)  # what a failing run left: the test's to stop
