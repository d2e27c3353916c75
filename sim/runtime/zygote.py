"""A preloaded parent that forks a stack's components, so a launch pays the interpreter and imports once.

Why: a component is a short program on 0.1-0.25 s of CPU for the interpreter and its imports, about 1.2 s
per stack; started together on two cores, that was most of `ncpsim up`'s first second. The launcher starts
one zygote as a launch begins (clusters.local.zygote), which imports the runners in the order the launch
needs them, forking each component as soon as its runner is in. A child is what `python -m sim.runtime.run
KIND ...` would have been: a session of its own (setsid, before its pid is reported, so killpg always finds
the group), its log as stdout and stderr, the ready pipe as ``--ready-fd``, default signal handlers, the
state folder as its working directory, and that command line as its title (for ps and the sweep). Once the
launch is done the zygote stays as the stack's supervisor (sim.runtime.supervisor).

Fork-safety: the zygote has one thread and no event loop (checked before every fork), so a child inherits
no lock another thread held.

Protocol (sim.runtime.fd_messages), answered in order after the greeting ``{"ready": true, "pid": N}``:
``{"kinds": [...]}``, the kinds the launch forks, is answered ``{"preloading": [...], "loaded": [...]}``
(only their runners still load: an HTTP scenario has no grpc-proxy, whose grpcio came before the proxy's
imports). ``{"argv": [...]}`` (`sim.runtime.run`'s arguments, without ``--ready-fd``) carries the ready
pipe and the log file as SCM_RIGHTS and is answered ``{"pid": N}`` or ``{"error": text}``. ``{"zygote":
{"title", "order", "env", "cwd", "state"}}`` carries one end of a new socket pair and is answered ``{"pid":
N}``: a zygote for another launch, forked with the runners already in (clusters.local.zygote.shared).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from setproctitle import setproctitle

from sim.runtime import run, supervisor
from sim.runtime.fd_messages import Channel

COMMAND = ("-m", "sim.runtime.run")  # what a forked child's title says it runs, after sys.executable


def title(argv: list[str]) -> str:
    return " ".join([sys.executable, *COMMAND, *argv])


def fork_component(sock: socket.socket, argv: list[str], ready_fd: int, log_fd: int) -> int:
    """Fork one component; returns its pid once it leads a session of its own."""
    return _fork(lambda: _become(sock, argv, ready_fd, log_fd))


def _fork(become: Callable[[], int]) -> int:
    """Fork a child that runs `become` in a session of its own and never returns into the zygote's loop;
    returns its pid once the session exists."""
    if _threads() != 1:
        raise RuntimeError("the zygote grew a thread: forking now could copy a lock it holds")
    sys.stdout.flush()
    sys.stderr.flush()
    session_r, session_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the component
        code = 1
        try:
            if _zygote is not None:
                _zygote.children.in_child()
            os.close(session_r)
            os.setsid()
            os.close(session_w)  # the zygote's read returns: the session exists before the pid is told
            code = become()
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
    # What the zygote preloaded stays shared: the collector never walks it again (a full collection writes
    # to every object it walks, and each page written is copied into the child).
    gc.freeze()
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


def _become_zygote(sock: socket.socket, spec: dict[str, Any], socket_fd: int) -> int:
    """The forked zygote: the launch's environment and folder (the runners read both when they run, not at
    import), the title a started one has (for ps and for `ncpsim down`'s sweep), then its own loop."""
    sock.close()
    setproctitle(spec["title"])  # first: it finds the space for titles by where the environment is now
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    return _serve_launch(Channel(socket.socket(fileno=socket_fd)), tuple(spec["order"]), Path(spec["state"]))


class Zygote:
    """What the zygote keeps from one connection to the next: the runners loaded and still to load, and
    its children (sim.runtime.supervisor)."""

    def __init__(self, order: tuple[str, ...] = ()) -> None:
        self.unloaded = [kind for kind in order if kind in run.RUNNERS]
        self.unloaded += [kind for kind in run.RUNNERS if kind not in self.unloaded]
        self.loaded: list[str] = []
        self.children = supervisor.Children()

    def serve(self, channel: Channel) -> None:
        """Between requests, load the runners in the launch's order (then any other, until the launch names
        its kinds), so the first components fork while later ones' imports (the proxy's aioquic) are still to
        come; a request that arrives meanwhile waits for at most one runner's imports, and loads its own
        runner first if it is not in yet."""
        while True:
            while self.unloaded and not channel.pending():
                kind = self.unloaded.pop(0)
                with contextlib.suppress(Exception):  # one that cannot load says why when asked for
                    run.load_runner(kind)
                    self.loaded.append(kind)
            request, fds = channel.receive()
            if request is None:
                return  # the client is done
            self.children.reap()
            try:
                channel.send(self.answer(channel.sock, request, fds))
            finally:
                for fd in fds:
                    os.close(fd)

    def answer(self, sock: socket.socket, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        if "kinds" in request:  # the launch forks only these: nothing else is worth its imports
            self.unloaded = [kind for kind in self.unloaded if kind in request["kinds"]]
            return {"preloading": self.unloaded, "loaded": self.loaded}
        if "zygote" in request:
            try:
                [socket_fd] = fds
                return {"pid": _fork(lambda: _become_zygote(sock, request["zygote"], socket_fd))}
            except Exception as exc:  # noqa: BLE001 - told to the launcher, which starts a zygote of its own
                return {"error": f"{type(exc).__name__}: {exc}"}
        if "kill" in request:
            return {"stopped": self.children.stop([request["kill"]], False, (signal.SIGKILL,))}
        if "stop" in request or "down" in request:
            stages = request["stop"] if "stop" in request else request["down"]
            return {"stopped": self.children.stop(stages, "down" in request)}
        reply = answer(sock, request, fds)
        if "pid" in reply:
            self.children.forked(reply["pid"], request["argv"])
        return reply


def answer(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
    """Load the component's runner, then fork it: its pid, or the error for the launcher to raise."""
    try:
        ready_fd, log_fd = fds
        run.load_runner(request["argv"][0])  # its imports stay shared with every child forked later
    except Exception:  # noqa: BLE001 - an import error is the launcher's to report, traceback and all
        return {"error": traceback.format_exc()}
    try:
        return {"pid": fork_component(sock, request["argv"], ready_fd, log_fd)}
    except Exception as exc:  # noqa: BLE001 - told to the launcher, which raises it
        return {"error": f"{type(exc).__name__}: {exc}"}


def _serve_launch(channel: Channel, order: tuple[str, ...], state_dir: Path) -> int:
    """Serve the launch, then, as its supervisor, the stack (sim.runtime.supervisor) until no child is left."""
    global _zygote
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher stops the zygote; Ctrl-C is the launcher's
    _zygote = Zygote(order)
    try:
        channel.send({"ready": True, "pid": os.getpid()})
        _zygote.serve(channel)
    except OSError:  # the launcher went away (an interrupted launch): its children are still ours
        pass
    channel.close()
    supervisor.supervise(state_dir, _zygote.children, _zygote.serve)
    return 0


_zygote: Zygote | None = None  # this process's, once it serves: a forked child lets go of its children


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.runtime.zygote", description=__doc__)
    parser.add_argument("--state", required=True, help="the stack folder (names the zygote in ps)")
    parser.add_argument("--socket-fd", required=True, type=int)
    parser.add_argument("--order", default="", help="component kinds, comma-separated: runners load in it")
    args = parser.parse_args(argv)
    order = tuple(filter(None, args.order.split(",")))
    return _serve_launch(Channel(socket.socket(fileno=args.socket_fd)), order, Path(args.state))


if __name__ == "__main__":
    os._exit(main())  # as a forked one ends: its output is /dev/null, and the finalization of every runner's
    # modules took a tenth of a second of each `ncpsim down`
