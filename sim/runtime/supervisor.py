"""The stack's supervisor: the launch's zygote, kept for the life of the stack as the one parent of its components.

It forks every component, restarts included, reaps them, and stops them for `ncpsim down`, `fault kill`
and a restart's stop; a stop goes by the stack's command lines (clusters.local.sweep) only when it is gone
(SIGKILLed, the machine rebooted) or is not the parent (a component of an earlier supervisor: a restart
with none to reach starts a zygote of its own, which supervises what it forks). The pid files stay what
`status` reads.

Found by a listening AF_UNIX socket, `supervisor.sock` in the stack's folder, bound once the launch hands
over (`ncpsim up` closes its end of the launch's socket pair: the launch is done, or `up` died). A client
(connect) is greeted ``{"ready": true, "pid": N}`` and asks as a launch does (sim.runtime.zygote), or
``{"stop": [[NAME, ...], ...]}`` (stages, in order), ``{"kill": [NAME, ...]}`` (SIGKILL, a node lost) or
``{"down": STAGES}`` (every child, the stages first), each answered ``{"stopped": [NAME, ...]}``. One
client at a time; the others wait in the listen queue. It exits once it has no child and no client, and
unlinks the socket if it is still its own.

Reaping: SIGCHLD wakes the loop through a wakeup pipe (signal.set_wakeup_fd), which collects every exited
child with waitpid(WNOHANG). waitpid reports a thread-group leader only once all its threads are gone:
reaped means every socket of it is closed. A stop waits on the same pipe.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sim.runtime.fd_messages import Channel

SOCKET = "supervisor.sock"
ADDRESS_MAX = 100  # bytes of a socket path: Linux holds 107, macOS 103
STOP_TIMEOUT = 3.0  # SIGTERM grace before SIGKILL
GRACEFUL = (signal.SIGTERM, signal.SIGKILL)
IDLE_TIMEOUT = 300.0  # a client silent this long is dropped: the next one waits behind it
T = TypeVar("T")


class Children:
    """The components this process forked, by pid with their names; reaped as SIGCHLD wakes the loop."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.listener: socket.socket | None = None  # supervise's, once the launch is done
        self.wakeup, write = os.pipe()
        for fd in (self.wakeup, write):
            os.set_blocking(fd, False)
        self._write = write
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, not SIG_IGN: exits are ours to collect
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def forked(self, pid: int, argv: list[str]) -> None:
        self.names[pid] = argv[argv.index("--name") + 1] if "--name" in argv else argv[0]

    def in_child(self) -> None:
        """In a freshly forked child: none of this is its own. The listener above all: a component holding
        it keeps the socket accepting after the supervisor is gone, and every client waits its timeout."""
        if self.listener is not None:
            self.listener.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(self.wakeup)
        os.close(self._write)

    def reap(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wakeup, 512):
                pass
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if not pid:
                return
            self.names.pop(pid, None)

    def wait(self, pids: list[int], timeout: float) -> list[int]:
        """The `pids` still running after at most `timeout`."""
        deadline = time.monotonic() + timeout
        while (left := [p for p in pids if p in self.names]) and (rest := deadline - time.monotonic()) > 0:
            select.select([self.wakeup], [], [], rest)
            self.reap()
        return left

    def stop(
        self, stages: list[list[str]], everything: bool, signals: tuple[int, ...] = GRACEFUL
    ) -> list[str]:
        """Each stage's process groups together (escalate); with `everything`, then the children no stage
        names. Returns the names of the children stopped."""
        self.reap()
        named = {name: pid for pid, name in self.names.items()}
        rest = sorted(set(named) - {name for stage in stages for name in stage}) if everything else []
        stopped = []
        for stage in [*stages, rest]:
            stopped += [name for name in stage if name in named]
            escalate([named[name] for name in stage if name in named], _killpg, self.wait, signals)
        return stopped


def escalate(
    targets: list[T],
    send: Callable[[T, int], None],
    running: Callable[[list[T], float], list[T]],
    signals: tuple[int, ...] = GRACEFUL,
) -> None:
    """How a stack's processes stop, by their supervisor or by the sweep: each signal to every target still
    `running` after the last one's grace period (SIGTERM, then SIGKILL)."""
    for sig in signals:
        for target in targets:
            send(target, sig)
        if not (targets := running(targets, STOP_TIMEOUT)):
            return


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def connect(state_dir: Path, timeout: float) -> socket.socket | None:
    """A connection to the stack's supervisor, or None when there is none to reach: by the socket's absolute
    path where it fits in an address, else through the folder's descriptor (Linux's /proc)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        folder = os.open(state_dir, os.O_RDONLY)
        try:
            path = str(state_dir / SOCKET)
            sock.connect(
                path if len(os.fsencode(path)) <= ADDRESS_MAX else f"/proc/self/fd/{folder}/{SOCKET}"
            )
        finally:
            os.close(folder)
        return sock
    except OSError:
        sock.close()
        return None


def _bind(state_dir: Path) -> tuple[socket.socket, int] | None:
    """The listening socket in the state folder (the folder is this process's working directory from now
    on: a relative address has no length limit), and its inode; None if the folder is gone."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.chdir(state_dir)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCKET)  # a supervisor that was SIGKILLed left it
        listener.bind(SOCKET)
        listener.listen(8)
        return listener, os.stat(SOCKET).st_ino
    except OSError:
        listener.close()
        return None


def supervise(state_dir: Path, children: Children, serve: Callable[[Channel], None]) -> None:
    """After the launch: serve clients one at a time until no child is left (see the module's docstring)."""
    children.reap()
    bound = _bind(state_dir) if children.names else None
    listener = children.listener = bound[0] if bound else None
    try:
        while children.names:
            waiting = [children.wakeup] + ([listener] if listener else [])
            readable = select.select(waiting, [], [])[0]
            children.reap()
            if listener in readable:
                assert listener is not None
                conn = listener.accept()[0]
                conn.settimeout(IDLE_TIMEOUT)
                with contextlib.suppress(OSError, ValueError), contextlib.closing(Channel(conn)) as channel:
                    channel.send({"ready": True, "pid": os.getpid()})
                    serve(channel)
                children.reap()
    finally:
        if bound:
            bound[0].close()
            with contextlib.suppress(OSError):
                if os.stat(SOCKET).st_ino == bound[1]:
                    os.unlink(SOCKET)
