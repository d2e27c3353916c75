"""The launcher's end of `sim.runtime.zygote`: start a launch's zygote (or reach the stack's supervisor it
became), ask it for components, ask it to stop them."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from clusters.interrupts import InterruptGuard
from clusters.state import state_dir
from sim.errors import BackendError, ConfigError
from sim.runtime import supervisor
from sim.runtime.fd_messages import Channel
from sim.runtime.supervisor import STOP_TIMEOUT

from .process import Forked, wait_exited

# The order a launch forks its components in, by kind (clusters.local.plan.spawn_order), which is also
# the order the zygote loads their runners in. grpc-proxy's and the proxy's are the heaviest imports
# (grpcio, aioquic): worker hosts come before them, so their NATS sign-in overlaps those imports.
LAUNCH_ORDER = ("resolver", "nats", "nats-callout", "invocation", "workers", "grpc-proxy", "proxy")


Process = subprocess.Popen[bytes] | Forked  # a zygote started here, or forked by the shared one


def command(state_dir: Path, order: Iterable[str], socket_fd: int | None = None) -> list[str]:
    """A zygote's command line, after the interpreter (a forked one's title: it has no socket argument)."""
    fd = [] if socket_fd is None else ["--socket-fd", str(socket_fd)]
    return ["-m", "sim.runtime.zygote", "--state", str(state_dir), *fd, "--order", ",".join(order)]


def _spawn(state_dir: Path) -> tuple[Process, socket.socket]:
    shared = _SHARED
    if shared is not None:
        forked = shared.fork_zygote(state_dir)
        if forked is not None:
            return forked
    return _start(state_dir)


def _start(
    state_dir: Path, order: Iterable[str] = LAUNCH_ORDER
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    _reap_supervisors()
    ours, theirs = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, *command(state_dir, order, theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # it reports on the socket; a child's output goes to its log
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C on the terminal is the launcher's, not the zygote's
            cwd=_folder(state_dir),  # a child works in its own
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return process, ours


# Supervisors this process started (a launch's zygote, once the launch is done): they outlive the launch,
# and are reaped once they exit (a Popen dropped while its process runs, or never reaped, warns).
_SUPERVISING: list[subprocess.Popen[bytes]] = []


def _reap_supervisors() -> None:
    _SUPERVISING[:] = [process for process in _SUPERVISING if process.poll() is None]


def _folder(state_dir: Path) -> Path:
    """Where a zygote runs: the stack folder, or the nearest folder above it (not made yet)."""
    return next(folder for folder in (state_dir, *state_dir.parents) if folder.is_dir())


# A zygote started before its launch (`ncpsim up`, first thing), waiting to be adopted by that launch.
_EARLY: dict[Path, tuple[Process, socket.socket]] = {}


@contextlib.contextmanager
def early_for(stack: str, guard: InterruptGuard) -> Iterator[None]:
    """Within it, a launch of the local stack `stack` adopts a zygote started now, so its imports overlap the
    command's own (`ncpsim up` has a third of a second of them, and the scenario's checks, before it
    launches). On the way out, however it comes, one no launch adopted is ended (it would end by itself
    once this process does, but only after the import it is in): a config error, Ctrl-C before the launch,
    or a Ctrl-C `guard` deferred while it started, raised as the start ends, so already inside the cleanup.
    A name or NCPSIM_HOME the launch will refuse starts none: the head start is not worth a message."""
    try:
        with guard.held(), contextlib.suppress(ConfigError, OSError):  # started and recorded as one step
            folder = state_dir(stack)
            if folder not in _EARLY and folder.parent.is_dir():
                _EARLY[folder] = _spawn(folder)
        yield
    finally:
        while _EARLY:
            process, sock = _EARLY.popitem()[1]
            sock.close()
            _kill(process)


def _kill(process: Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class Shared:
    """One preloaded zygote that forks each launch's zygote (see `shared`): every runner is imported once
    for a run of many launches, and a launch's zygote answers at once instead of after its imports."""

    def __init__(self, root: Path):
        self.root = root
        self.process: subprocess.Popen[bytes] | None = None  # started by the first launch (see start)
        self._channel: Channel | None = None
        self._lock = threading.Lock()  # replays run launches from several threads (replay --jobs)
        self.broken = False

    def start(self) -> Channel:
        """Start it, if no launch has yet: a run that launches nothing (every scenario refused, a test
        session of pure tests) pays nothing."""
        if self._channel is None:
            self.process, sock = _start(self.root)
            self._channel = Channel(sock)
        return self._channel

    def fork_zygote(self, state_dir: Path) -> tuple[Forked, socket.socket] | None:
        """A zygote for the launch of `state_dir`, or None if the shared one cannot fork it (then the
        launch starts one of its own: slower, the same components; and later launches do too)."""
        title = " ".join([sys.executable, *command(state_dir, LAUNCH_ORDER)])
        spec = {
            "title": title,
            "order": LAUNCH_ORDER,
            "env": dict(os.environ),
            "state": str(state_dir),
            "cwd": str(_folder(state_dir)),
        }
        ours, theirs = socket.socketpair()
        try:
            with self._lock:
                if self.broken:
                    raise OSError("the shared zygote failed before")
                self.broken = True  # until its answer is read: a half-read conversation is out of step
                channel = self.start()
                channel.sock.settimeout(STOP_TIMEOUT * 10)  # at most its imports, once
                channel.send({"zygote": spec}, [theirs.fileno()])
                while "ready" in (message := _received(channel)):
                    pass  # its own readiness answer comes first
                self.broken = False
            return Forked(int(message["pid"])), ours  # KeyError on an error answer: handled below
        except (OSError, ValueError, KeyError):
            ours.close()
            return None
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()

    def close(self) -> None:
        if self._channel is None or self.process is None:
            return
        self._channel.close()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill(self.process)


_SHARED: Shared | None = None


@contextlib.contextmanager
def shared(root: Path) -> Iterator[None]:
    """Within it, each launch in this process takes its zygote from one preloaded zygote (a fork: a few
    milliseconds) instead of a new interpreter that imports the runners (0.5-0.9 CPU-seconds, and most of a
    launch's wall time): for a run of many launches, such as a replay of several scenarios, a diagnosis's
    probes or a test session. `root` names it in ps. Nested, the outer one serves."""
    global _SHARED
    if _SHARED is not None:
        yield
        return
    _SHARED = Shared(root)
    try:
        yield
    finally:
        held, _SHARED = _SHARED, None
        held.close()


class Zygote:
    """One launch's zygote: started at once (or earlier, see early_for), so its imports overlap the
    launcher's own preparation. It is told the launch's `kinds` at once, so it preloads only their
    runners; the answer is read before the first fork's, and the launch goes on preparing meanwhile."""

    def __init__(self, state_dir: Path, timeout: float, kinds: Iterable[str], attach: bool = False):
        """With `attach` (a restart), the stack's supervisor where it runs: it is never killed from here."""
        self.timeout = timeout
        running = supervisor.connect(state_dir, timeout) if attach else None
        self.process: Process | None = None
        if running is None:
            early = _EARLY.pop(state_dir, None)
            if early is not None and early[0].poll() is not None:  # it did not last: start another
                early[1].close()
                early = None
            self.process, running = early or _spawn(state_dir)
        self._channel: Channel | None = Channel(running)
        self._talk = threading.Lock()  # one conversation at a time, and no close under one (see close)
        self._owed = 1  # answers sent to us and not read yet: {"ready": true} first
        self._preloading: dict[str, list[str]] = {}
        try:
            with self._talking() as channel:  # answers come in order: this one is read with the next
                channel.send({"kinds": sorted(set(kinds))})
        except BaseException:
            self.close(kill=True)  # no launcher holds it yet
            raise
        self._owed += 1

    def preloading(self) -> dict[str, list[str]]:
        """What the zygote had loaded ("loaded") and still had to ("preloading") when it heard the kinds."""
        with self._talking() as channel:
            self._catch_up(channel)
        return self._preloading

    def fork(self, argv: list[str], ready_fd: int, log_fd: int) -> int:
        """A component running `sim.runtime.run` with `argv`; its ready pipe and log are passed along."""
        return int(self.ask({"argv": argv}, [ready_fd, log_fd])["pid"])

    def ask(self, request: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        with self._talking() as channel:
            self._catch_up(channel)
            channel.send(request, fds)
            return self._answer(channel)

    @contextlib.contextmanager
    def _talking(self) -> Iterator[Channel]:
        """The open channel, under the timeout; a zygote that does not answer is a BackendError. Held by
        one thread at a time: `close` from another thread waits for it (see there)."""
        with self._talk:
            channel = self._channel
            if channel is None:
                raise BackendError("the zygote is closed")
            channel.sock.settimeout(self.timeout)
            try:
                yield channel
            except (OSError, ValueError) as exc:
                raise BackendError(f"the zygote did not answer: {exc}") from exc

    def _catch_up(self, channel: Channel) -> None:
        """Read the answers owed so far: its readiness, then what it preloads."""
        while self._owed:
            message = self._answer(channel)
            self._owed -= 1
            if "preloading" in message:
                self._preloading = message

    def _answer(self, channel: Channel) -> dict[str, Any]:
        message, fds = channel.receive()
        for fd in fds:
            os.close(fd)
        if message is None:
            code = "" if self.process is None else f" ({self.process.wait(STOP_TIMEOUT)})"
            raise BackendError(f"the zygote exited{code} before it answered")
        if "error" in message:
            raise BackendError(f"the zygote could not start a component:\n{message['error']}")
        return message

    def close(self, kill: bool = False) -> None:
        """Shut the socket down: the zygote goes on as the stack's supervisor (and ends once it has no child);
        with `kill`, it is killed at once (an interrupted launch: it may still be importing).

        Another thread may be waiting on an answer (a probe stack's launch, stopped from the main thread
        on Ctrl-C): the shutdown ends its read at once, as the zygote's exit would, and the socket is
        closed only once that thread is done with it. Closed under its wait, the descriptor was gone (or
        already another file's, such as the next pidfd) and the wait lasted its whole timeout (15 s),
        in about half the interrupted diagnoses."""
        channel = self._channel
        if channel is not None:
            with contextlib.suppress(OSError):
                channel.sock.shutdown(socket.SHUT_RDWR)
        if kill and self.process is not None:  # while it launches; after that it supervises the stack
            _kill(self.process)
        elif isinstance(self.process, subprocess.Popen):  # our child: reaped when it ends (see _start)
            _SUPERVISING.append(self.process)
        with self._talk:
            channel, self._channel = self._channel, None
            if channel is not None:
                channel.close()


def ask(state_dir: Path, request: dict[str, Any], timeout: float) -> tuple[int, dict[str, Any]] | None:
    """The stack's supervisor's pid and its answer, or None when there is none to ask."""
    sock = supervisor.connect(state_dir, timeout)
    if sock is None:
        return None
    with contextlib.closing(Channel(sock)) as channel:
        try:
            pid = int(_received(channel)["pid"])
            channel.send(request)
            return pid, _received(channel)
        except (OSError, ValueError, KeyError):
            return None


def down(state_dir: Path, stages: list[list[str]], timeout: float) -> list[str] | None:
    """The stack's supervisor stops every child, `stages` first, and exits: the names it stopped, or None
    when there is no supervisor to ask (then the sweep is all there is)."""
    asked = ask(state_dir, {"down": stages}, timeout)
    if asked is None:
        return None
    if not wait_exited(asked[0], STOP_TIMEOUT):  # it exits once its last child is reaped and we are gone
        with contextlib.suppress(ProcessLookupError):
            os.kill(asked[0], signal.SIGKILL)
    _reap_supervisors()  # ours, if this process started it
    return list(asked[1].get("stopped", []))


def _received(channel: Channel) -> dict[str, Any]:
    message, fds = channel.receive()
    for fd in fds:
        os.close(fd)
    if message is None:
        raise OSError("the supervisor closed the connection")
    return message
