"""A preloaded parent that forks a stack's components, so a launch pays the interpreter and imports once.

Why: a component is a short program on 0.1-0.25 s of CPU for the interpreter and its imports, about
1.2 s per stack; started together on two cores, that was most of `invoke up`'s first second and most
of what a replay of the catalogue costs. The launcher starts one zygote as a launch begins; it imports
every runner while the launcher prepares certificates, then forks one child per request. A child is
what `python -m sim.runtime.run KIND ...` would have been: a session of its own (setsid, done before
its pid is reported, so the launcher's killpg always finds the group), its log as stdout and stderr,
the ready pipe as ``--ready-fd``, default signal handlers, the state folder as its working directory,
and that command line as its process title, for ps and for `invoke down`.

Fork-safety: the zygote has one thread and no event loop (checked before every fork), so a child
inherits no lock another thread held. It ends when the launcher closes its end of the socket;
components outlive it, as they outlive `invoke up`. It ignores SIGCHLD, so the kernel reaps children
that end before it does; a child sets SIGCHLD back (nats-server's supervisor waits on its own child).

Protocol, on an AF_UNIX stream socket pair, one request in flight at a time: the zygote first sends
``{"ready": true}`` or ``{"error": traceback}``; then each request is a JSON line ``{"argv": [...]}``
(the arguments of `sim.runtime.run`, without ``--ready-fd``) carrying the ready pipe's write end and
the log file as SCM_RIGHTS, and each answer a JSON line ``{"pid": N}`` or ``{"error": text}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from setproctitle import setproctitle

from sim.runtime import run

MAX_MESSAGE = 64 * 1024
COMMAND = ("-m", "sim.runtime.run")  # what a forked child's title says it runs, after sys.executable


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.sendall(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One JSON line and the descriptors that came with it; (None, []) when the peer closed."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 2)
        fds += got
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        data += chunk
    return json.loads(data), fds


def preload() -> None:
    for kind in run.RUNNERS:
        run.load_runner(kind)


def title(argv: list[str]) -> str:
    return " ".join([sys.executable, *COMMAND, *argv])


def fork_component(sock: socket.socket, argv: list[str], ready_fd: int, log_fd: int) -> int:
    """Fork one component; returns its pid once it leads a session of its own."""
    if _threads() != 1:
        raise RuntimeError("the zygote grew a thread: forking now could copy a lock it holds")
    sys.stdout.flush()
    sys.stderr.flush()
    session_r, session_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the component
        code = 1
        try:
            os.close(session_r)
            os.setsid()
            os.close(session_w)  # the zygote's read returns: the session exists before the pid is told
            code = _become(sock, argv, ready_fd, log_fd)
        except SystemExit as exc:  # as the interpreter ends: a message goes to the log, then status 1
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if code == 1 and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):  # the log may be gone: nothing left to tell
                    stream.flush()
            os._exit(code)
    os.close(session_w)
    os.read(session_r, 1)  # EOF once the child has its session (or died trying)
    os.close(session_r)
    return pid


def _threads() -> int:
    """Threads of this process, the C ones included where the system tells (Linux)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _become(sock: socket.socket, argv: list[str], ready_fd: int, log_fd: int) -> int:
    sock.close()
    for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    args = [*argv, "--ready-fd", str(ready_fd)]
    os.chdir(args[args.index("--state") + 1])
    setproctitle(title(argv))
    return run.main(args)


def serve(sock: socket.socket) -> None:
    while True:
        request, fds = receive(sock)
        if request is None:
            return  # the launcher is done launching
        try:
            ready_fd, log_fd = fds
            send(sock, {"pid": fork_component(sock, request["argv"], ready_fd, log_fd)})
        except Exception as exc:  # noqa: BLE001 - told to the launcher, which raises it
            send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.runtime.zygote", description=__doc__)
    parser.add_argument("--state", required=True, help="the stack folder (names the zygote in ps)")
    parser.add_argument("--socket-fd", required=True, type=int)
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.socket_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the zygote; Ctrl-C is the launcher's
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        try:
            preload()
        except Exception:  # noqa: BLE001 - an import error is the launcher's to report
            send(sock, {"error": traceback.format_exc()})
            return 1
        send(sock, {"ready": True})
        serve(sock)
    except OSError:  # the launcher went away (an interrupted launch): nothing left to serve
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
