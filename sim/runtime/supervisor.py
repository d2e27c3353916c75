"""The stack's supervisor: the launch's zygote, kept for the life of the stack as the one parent of its components.

Why: a component used to have one of three parents (the zygote, init once the zygote was gone, or whichever
command restarted it), so nothing could wait on it and every stop went by pid files and command-line sweeps.
Now the zygote that forks a launch's components stays after the launch, forks every restart too, reaps its
children, and stops them on `ncpsim down`.

Finding it: a listening AF_UNIX socket, `supervisor.sock` in the stack's state folder, bound (relative to the
folder, so a long path fits) as the launch hands over, speaking sim.runtime.fd_messages. A client connects
(by the absolute path, or through /proc/self/fd where that one is too long for an address), is greeted
``{"ready": true, "pid": N}``, then asks as the launch does: ``{"kinds": [...]}`` and ``{"argv": [...]}``
(a restart forks through it); ``{"stop": [[NAME, ...], ...]}`` (stages, in order) is answered
``{"stopped": [NAME, ...]}``, as is ``{"kill": [NAME, ...]}`` (SIGKILL, a node lost); ``{"down": STAGES}`` stops every child, the stages first, and the supervisor
exits once the client has gone. One client at a time; the others wait in the listen queue.

Gone (SIGKILLed, the machine rebooted): the socket refuses or is missing, and the command line sweeps the
stack's command lines (clusters.local.sweep), as it does for what the supervisor is not the parent of (a
component of an earlier supervisor); a restart then starts a zygote of its own, which supervises what it
forks. The pid files stay what `status` reads.

Reaping: SIGCHLD has a handler and a wakeup pipe (signal.set_wakeup_fd), so a child that exits wakes the
loop, which collects every exited child with waitpid(WNOHANG). waitpid reports a thread-group leader only
once all its threads are gone: reaped means every socket of it is closed. A stop waits on the same pipe.

Handing over: `ncpsim up` holds the launch's socket pair while it forks; when it closes its end (the launch
is done, or `up` died), the zygote binds the socket and serves. Ctrl-C during `up` still stops everything:
the launcher kills the zygote while it launches, and asks the supervisor to stop the stack after that.

Stopping: it exits once it has no child left and no client connected: after `down`, or once the sweep (or
anything else) has stopped its last component. It unlinks the socket it bound, if it is still its own.
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

from sim.runtime.fd_messages import Channel

SOCKET = "supervisor.sock"
ADDRESS_MAX = 100  # bytes of a socket path: Linux holds 107, macOS 103
STOP_TIMEOUT = 3.0  # SIGTERM grace before SIGKILL, as the launcher's
GRACEFUL = (signal.SIGTERM, signal.SIGKILL)
IDLE_TIMEOUT = 300.0  # a client silent this long is dropped: the next one waits behind it


class Children:
    """The components this process forked, by pid with their names; reaped as SIGCHLD wakes the loop."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.wakeup, write = os.pipe()
        for fd in (self.wakeup, write):
            os.set_blocking(fd, False)
        self._write = write
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, not SIG_IGN: exits are ours to collect
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)

    def forked(self, pid: int, argv: list[str]) -> None:
        self.names[pid] = argv[argv.index("--name") + 1] if "--name" in argv else argv[0]

    def in_child(self) -> None:
        """In a freshly forked child: none of this is its own."""
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
        """Each stage's process groups together: SIGTERM, SIGKILL past the grace period (or `signals`); with
        `everything`, then the children no stage names. Returns the names of the children stopped."""
        self.reap()
        named = {name: pid for pid, name in self.names.items()}
        rest = sorted(set(named) - {name for stage in stages for name in stage}) if everything else []
        stopped = []
        for stage in [*stages, rest]:
            pids = [named[name] for name in stage if name in named]
            stopped += [name for name in stage if name in named]
            for sig in signals:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, sig)
                if not (pids := self.wait(pids, STOP_TIMEOUT)):
                    break
        return stopped


def address(state_dir: Path, folder_fd: int | None = None) -> str:
    """The socket's path as a client connects to it: absolute where it fits, else through the folder's
    descriptor (Linux's /proc); '' when neither can name it."""
    path = str(state_dir / SOCKET)
    if len(os.fsencode(path)) <= ADDRESS_MAX:
        return path
    return (
        f"/proc/self/fd/{folder_fd}/{SOCKET}"
        if folder_fd is not None and Path("/proc/self/fd").is_dir()
        else ""
    )


def connect(state_dir: Path, timeout: float) -> socket.socket | None:
    """A connection to the stack's supervisor, or None when there is none to reach."""
    try:
        folder = os.open(state_dir, os.O_RDONLY)
    except OSError:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address(state_dir, folder) or "\0unreachable")
        return sock
    except OSError:
        sock.close()
        return None
    finally:
        os.close(folder)


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
    listener = bound[0] if bound else None
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
