"""The launch's zygote: forked components are what `python -m sim.runtime.run` would have been, and a
process that is not the launcher's child counts as exited only once every socket of it is closed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from cli_support import ncpsim

from clusters.local import LocalStack
from clusters.local import zygote as launcher_zygote
from clusters.local.plan import spawn_order
from clusters.local.process import Forked, wait_exited
from clusters.local.zygote import LAUNCH_ORDER, Zygote
from scenarios.load import load_scenario
from sim.errors import BackendError
from sim.runtime import zygote

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the zygote forks")


def test_forked_components_lead_their_own_sessions_and_carry_their_command_lines(tmp_path: Path) -> None:
    stack = LocalStack("zyg", root=tmp_path)
    try:
        stack.up(load_scenario("http-callback").build_topology("zyg"), "http-callback")
        running = stack.launcher.running()
        assert {"resolver", "nats-0", "worker-callback-proxy"} <= set(
            running
        )  # http-callback: one NATS server
        for name, pid in running.items():
            proc = psutil.Process(pid)
            assert os.getsid(pid) == pid, f"{name} does not lead a session of its own"
            line = " ".join(a for a in proc.cmdline() if a)
            assert "-m sim.runtime.run " in line and f"--state {stack.state_dir} --name {name} " in line, line
            assert proc.cwd() == str(stack.state_dir)
            assert "--ready-fd" not in line  # the title is the command a user would run
        # one supervisor for the stack, after the launch: every component's parent
        [supervisor] = supervisors(stack.state_dir)
        assert {psutil.Process(pid).ppid() for pid in running.values()} == {supervisor.pid}
        for name, path in stack.logs().items():
            assert "Traceback" not in Path(path).read_text(errors="replace"), name
    finally:
        stack.down()
    assert not stack.launcher.running()
    assert not supervisors(stack.state_dir), "the supervisor outlived `down`"


def supervisors(state_dir: Path) -> list[psutil.Process]:
    """The zygotes whose title names the stack's folder."""
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if "-m sim.runtime.zygote --state " + str(state_dir) in " ".join(p.info["cmdline"] or ())
    ]


@pytest.mark.usefixtures("own_zygote")
def test_the_zygote_preloads_only_the_kinds_its_launch_forks(tmp_path: Path) -> None:
    """An HTTP scenario has no grpc-proxy pod: told the launch's kinds before its first import, the zygote
    never loads grpcio, whose imports would otherwise come before the proxy's (in LAUNCH_ORDER)."""
    kinds = {spec.kind for _, spec in spawn_order(load_scenario("http-callback").build_topology("zk"))}
    assert "grpc-proxy" not in kinds and LAUNCH_ORDER.index("grpc-proxy") < LAUNCH_ORDER.index("proxy")
    http, every = Zygote(tmp_path / "http", 30, kinds), Zygote(tmp_path / "every", 30, LAUNCH_ORDER)
    try:
        assert http.preloading() == {"preloading": [k for k in LAUNCH_ORDER if k in kinds], "loaded": []}
        # the control: a launch of every kind leaves grpc-proxy's runner to load
        assert every.preloading() == {"preloading": list(LAUNCH_ORDER), "loaded": []}
    finally:
        http.close(kill=True)
        every.close(kill=True)


def test_the_zygote_refuses_to_fork_beside_a_thread() -> None:
    """A fork copies only the calling thread: a lock another thread holds would stay held forever."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    a, b = socket.socketpair()
    try:
        with pytest.raises(RuntimeError, match="thread"):
            zygote.fork_component(a, ["resolver"], -1, -1)
    finally:
        stop.set()
        other.join()
        a.close()
        b.close()


@pytest.mark.usefixtures("own_zygote")
def test_closing_a_zygote_ends_another_threads_wait_for_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during a diagnosis stops each probe's launch from the main thread while the probe's own
    thread waits on its zygote's answer: that wait ends at once, as if the zygote had exited, not at the
    zygote's timeout. The stand-in zygote never answers and its end of the socket stays open here, so
    only the close itself can end the wait."""
    ours, silent = socket.socketpair()
    stand_in = subprocess.Popen(["sleep", "60"], start_new_session=True)
    monkeypatch.setattr(launcher_zygote, "_spawn", lambda _state: (stand_in, ours))
    held = Zygote(tmp_path, 30, ["resolver"])
    ready_r, ready_w = os.pipe()
    errors: list[BackendError] = []

    def fork() -> None:
        try:
            held.fork(["resolver"], ready_w, ready_r)
        except BackendError as exc:
            errors.append(exc)

    waiting = threading.Thread(target=fork, daemon=True)  # daemon: a failing run leaves it to its timeout
    try:
        waiting.start()
        assert waiting_in(waiting, "receive"), "the thread never waited on the zygote: nothing was tested"
        held.close(kill=True)
        waiting.join(5.0)
        assert not waiting.is_alive(), "the wait outlived the zygote's close"
        assert errors and "zygote" in str(errors[0])
        assert stand_in.poll() is not None  # killed, as an interrupted launch's zygote is
    finally:
        held.close(kill=True)
        for fd in (ready_r, ready_w):
            os.close(fd)
        silent.close()


def waiting_in(thread: threading.Thread, function: str, timeout: float = 10.0) -> bool:
    """True once `thread` runs `function` (a frame of its stack): a thread's stack has no event to wait on,
    so look again every millisecond."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or 0)
        while frame is not None:
            if frame.f_code.co_name == function:
                return True
            frame = frame.f_back
        time.sleep(0.001)
    return False


# A process with a thread, killed: its main thread is a zombie before its sockets are closed -----------
LISTENER = """
import socket, sys, threading, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(16)
threading.Thread(target=lambda: time.sleep(60), daemon=True).start()
print(server.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("attempt", range(5))
def test_exited_means_every_socket_is_closed(attempt: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        watched = Forked(proc.pid)  # watched as a non-child would be: no waitpid
        assert watched.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        assert wait_exited(proc.pid, 10), "not seen to exit"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert watched.poll() == 0 and watched.wait(0) == 0
    finally:
        proc.kill()
        proc.communicate()


def test_a_component_gone_before_it_is_watched_counts_as_exited() -> None:
    """A forked component that ends at once (bad arguments) is reaped by the zygote before the launcher
    holds it: that is an exit to report with its log, not a NoSuchProcess traceback."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    watched = Forked(gone.pid)
    assert watched.poll() == 0 and watched.wait(0) == 0


def test_a_component_that_refuses_its_event_loop_is_one_line(invoke_env: dict[str, str]) -> None:
    """In-process (cli_support): the launch's zygote, forked from the session's, takes the command's
    environment, so the components read the bogus loop as an `ncpsim up` process's would."""
    env = {**invoke_env, "NCPSIM_EVENT_LOOP": "bogus"}
    done, down = ncpsim("up", "scenario=http-callback", env=env), ncpsim("down", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "exited before it was ready" in done.stderr
    assert "NCPSIM_EVENT_LOOP='bogus': choose one of uvloop, asyncio" in done.stderr
    assert down.returncode == 0


@pytest.mark.usefixtures("own_zygote")  # a shared zygote of its own, not the session's
def test_a_shared_zygote_forks_each_launchs_zygote_with_the_launchs_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within `shared`, a launch's zygote is a fork of one preloaded zygote, not a new interpreter: its
    components are the same (titles, sessions, folder), and the environment is the launch's, read when it
    launches: a variable set after the shared zygote started reaches the components."""
    topology = load_scenario("http-callback").build_topology("shared")
    with launcher_zygote.shared(tmp_path):
        held = launcher_zygote._SHARED
        assert held is not None
        first = LocalStack("first", root=tmp_path)
        try:
            first.up(topology, "http-callback")
            for name, pid in first.launcher.running().items():
                line = " ".join(a for a in psutil.Process(pid).cmdline() if a)
                assert "-m sim.runtime.run " in line and f"--state {first.state_dir} --name {name} " in line
                assert os.getsid(pid) == pid and psutil.Process(pid).cwd() == str(first.state_dir)
            assert first.status() is not None and not first.status().get("orphans")
        finally:
            first.down()
        monkeypatch.setenv("NCPSIM_EVENT_LOOP", "bogus")  # the control: a launch that must fail
        second = LocalStack("second", root=tmp_path)
        try:
            with pytest.raises(BackendError, match="exited before it was ready"):
                second.up(topology, "http-callback")
        finally:
            second.down()
        assert "NCPSIM_EVENT_LOOP='bogus'" in "".join(Path(p).read_text() for p in second.logs().values())
        assert not held.broken and held.process is not None and held.process.poll() is None
    assert held.process.poll() is not None, "the shared zygote outlived its context"


@pytest.mark.usefixtures("own_zygote")  # a shared zygote of its own, not the session's
def test_a_launch_whose_shared_zygote_died_starts_a_zygote_of_its_own(tmp_path: Path) -> None:
    with launcher_zygote.shared(tmp_path):
        held = launcher_zygote._SHARED
        assert held is not None
        held.start()
        assert held.process is not None
        held.process.kill()
        held.process.wait()
        stack = LocalStack("alone", root=tmp_path)
        try:
            stack.up(load_scenario("http-callback").build_topology("alone"), "http-callback")
            assert {"resolver", "worker-callback-proxy"} <= set(stack.launcher.running())
        finally:
            stack.down()
        assert held.broken  # later launches do not ask it again
