"""The local launcher's restarts and stops: a restart forks its component through the stack's supervisor
(the launch's zygote), `down` goes through it with the sweep as the fallback, and the components of one
stop stage stop together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from clusters.local import LocalStack, launcher
from clusters.local.launcher import Launcher
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
def test_a_restarted_component_is_the_supervisors_child(
    tmp_path: Path, zygote: str, request: pytest.FixtureRequest
) -> None:
    """The launch's zygote stays as the stack's supervisor and forks the restart too, whether the launch's
    zygote was forked by the shared one (tests, diagnose, replay of several) or started for it (`ncpsim
    up`): one parent for every component, before and after, under its command line in a session of its
    own. `down` goes through it, and nothing of the stack is left."""
    if zygote == "own":
        request.getfixturevalue("own_zygote")
    stack = LocalStack("restarted", root=tmp_path)
    try:
        stack.up(load_scenario("http-callback").build_topology("restarted"), "http-callback")
        before = stack.launcher.running()
        [supervisor] = supervisors(stack.state_dir)
        stack.restart("worker-callback-proxy")
        after = stack.launcher.running()
        assert after["worker-callback-proxy"] != before["worker-callback-proxy"]
        assert {psutil.Process(pid).ppid() for pid in after.values()} == {supervisor.pid}
        pid = after["worker-callback-proxy"]
        assert os.getsid(pid) == pid
        line = " ".join(a for a in psutil.Process(pid).cmdline() if a)
        assert f"-m sim.runtime.run proxy --state {stack.state_dir} --name worker-callback-proxy " in line, (
            line
        )
        killed = stack.kill(
            "resolver"
        )  # the kill fault: SIGKILLed and reaped by its parent before it answers
        assert not psutil.pid_exists(killed), "a zombie: nobody waited on the killed component"
        assert "resolver" not in stack.launcher.running()
    finally:
        stopped = stack.down()
    assert "worker-callback-proxy" in stopped
    assert not stack.launcher.running() and not supervisors(stack.state_dir)
    assert not stack_processes(stack.state_dir)


@pytest.mark.usefixtures("own_zygote")
def test_down_with_the_supervisor_killed_first_still_stops_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback: with the supervisor SIGKILLed (its socket left behind, refusing), a restart starts a
    zygote of its own, which supervises the one component it forked; `down` asks it, then sweeps what no
    supervisor stopped. The control: the same `down` without the sweep leaves the orphans running. The
    resolver was restarted through the supervisor first: forked while it listened, it must not hold the
    listener open (then the socket accepted with nobody to answer, and the restart below timed out)."""
    stack = LocalStack("orphaned", root=tmp_path)
    try:
        stack.up(load_scenario("http-callback").build_topology("orphaned"), "http-callback")
        [supervisor] = supervisors(stack.state_dir)
        stack.restart("resolver")
        supervisor.kill()
        supervisor.wait(10)
        assert (stack.state_dir / "supervisor.sock").exists()  # left behind: refused, not trusted
        stack.restart("worker-callback-proxy")
        [second] = supervisors(stack.state_dir)
        assert second.pid != supervisor.pid
        assert psutil.Process(stack.launcher.running()["worker-callback-proxy"]).ppid() == second.pid
        orphan = stack.launcher.running()["resolver"]
        assert psutil.Process(orphan).ppid() != second.pid  # init's now
        with monkeypatch.context() as unswept:
            unswept.setattr(launcher, "stop_strays", lambda *_: [])
            assert "worker-callback-proxy" in stack.down()  # the second supervisor stopped its child
        assert psutil.pid_exists(orphan) and not supervisors(stack.state_dir), "the control stopped them"
        assert "resolver" in stack.down()
    finally:
        stack.down()
    assert not stack.launcher.running() and not stack_processes(stack.state_dir)


def supervisors(state_dir: Path) -> list[psutil.Process]:
    """The zygotes whose title names the stack's folder: its supervisor, once the launch is done."""
    return [p for p in psutil.process_iter(["cmdline"]) if ZYGOTE_TITLE + str(state_dir) in _line(p)]


def stack_processes(state_dir: Path) -> list[psutil.Process]:
    """Every live process whose command line names the stack's folder."""
    return [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if str(state_dir) in _line(p) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def _line(proc: psutil.Process) -> str:
    return " ".join(proc.info["cmdline"] or ())


ZYGOTE_TITLE = "-m sim.runtime.zygote --state "


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
