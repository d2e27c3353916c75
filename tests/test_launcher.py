"""The local launcher's restarts and stops: a restart forks its component from a zygote, as a launch does
(not a fresh interpreter: 1-2 s of imports each), and the components of one stop stage stop together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from clusters.local import LocalStack
from clusters.local.launcher import Launcher
from clusters.local.process import Forked
from clusters.state import create_stack_dir
from scenarios.load import load_scenario

EXIT_AFTER = 1.5  # seconds a stand-in component takes to exit once told (a NATS server owed callout answers)
# Three stand-ins of one stage (the NATS servers), stopped together: about EXIT_AFTER; one after the other
# they took three times that.
TOGETHER_BOUND = 2 * EXIT_AFTER
SLOW_TO_STOP = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (time.sleep(float(sys.argv[1])), sys.exit(0)))
print("ready", flush=True)
while True:
    time.sleep(60)
"""


@pytest.mark.parametrize("zygote", ["shared", "own"])
def test_a_restart_forks_its_component_from_a_zygote(
    tmp_path: Path, zygote: str, request: pytest.FixtureRequest
) -> None:
    """In a run of many launches (tests, diagnose, replay of several) from the shared zygote; alone (a
    `ncpsim fault restart` in a process of its own) from a zygote started for the restart. Either way the
    component leads its own session under its command line, and is not this process's child (which the
    restart's fresh `python -m sim.runtime.run` was)."""
    if zygote == "own":
        request.getfixturevalue("own_zygote")
    stack = LocalStack("restarted", root=tmp_path)
    try:
        stack.up(load_scenario("http-callback").build_topology("restarted"), "http-callback")
        before = stack.launcher.running()["worker-callback-proxy"]
        stack.restart("worker-callback-proxy")
        pid = stack.launcher.running()["worker-callback-proxy"]
        assert pid != before
        assert isinstance(stack.launcher.children["worker-callback-proxy"], Forked)
        proc = psutil.Process(pid)
        assert proc.ppid() != os.getpid(), "the restart started the component itself, not from a zygote"
        assert os.getsid(pid) == pid
        line = " ".join(a for a in proc.cmdline() if a)
        assert f"-m sim.runtime.run proxy --state {stack.state_dir} --name worker-callback-proxy " in line, (
            line
        )
    finally:
        stack.down()
    assert not stack.launcher.running()


def test_the_components_of_a_stage_stop_together(tmp_path: Path) -> None:
    """Three stand-in NATS servers (one stop stage) that each take EXIT_AFTER to exit once SIGTERMed: the
    stack is down in about that, not three times it."""
    folder = tmp_path / "stage"
    create_stack_dir(folder)
    (folder / "pids").mkdir()
    stand_ins = []
    try:
        for name in ("nats-0", "nats-1", "nats-2"):
            args = ["-m", "sim.runtime.run", "--state", str(folder), "--name", name]  # read as a component's
            proc = subprocess.Popen(
                [sys.executable, "-c", SLOW_TO_STOP, str(EXIT_AFTER), *args],
                stdout=subprocess.PIPE,
                start_new_session=True,
                text=True,
            )
            stand_ins.append(proc)
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its handler is set
            (folder / "pids" / f"{name}.pid").write_text(str(proc.pid))
        started = time.monotonic()
        stopped = Launcher(folder).stop_all()
        took = time.monotonic() - started
        assert sorted(stopped) == ["nats-0", "nats-1", "nats-2"]
        assert all(p.wait(5) == 0 for p in stand_ins)  # each exited as told, none was killed
        assert EXIT_AFTER <= took < TOGETHER_BOUND, took
    finally:
        for proc in stand_ins:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
