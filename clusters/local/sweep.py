"""This stack's processes known by their command lines, never by a pid alone (it may have been reused):
the record's check, and the sweep, the fallback for what the stack's supervisor did not stop.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

from sim.runtime.supervisor import escalate

from .process import wait_exited

COMPONENT = "sim.runtime.run"
ZYGOTE = "sim.runtime.zygote"


def is_ours(pid: int, state_dir: Path) -> bool:
    """True if `pid` is alive and is one of this stack's components (not a recycled pid), on Linux and macOS
    alike: psutil reads the command line there too, so a pid file is never trusted on its own."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False  # nothing left to stop
        args = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):  # gone, or another user's: not ours
        return False
    return _runs(COMPONENT, args, state_dir)


def orphans(pgid: int, state_dir: Path) -> list[psutil.Process]:
    """This stack's processes left in the process group of a component that died (a nats-server whose
    supervisor was SIGKILLed): found by group and by command line, never by the group id alone."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid and _is_stack_process(
                proc.info["cmdline"] or [], state_dir
            ):
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def stop_strays(state_dir: Path, names: set[str] | None = None) -> list[str]:
    """Stop this stack's processes (or only the components `names`), known by their command lines: where
    its supervisor is gone, or is not their parent (a component whose pid file went with a crashed `ncpsim
    up`, a nats-server whose pod's supervisor was stopped while it started it). SIGTERM, then SIGKILL what
    outlives the grace period; says what it stopped: a component's name, another process's pid."""
    strays = {}
    for proc in psutil.process_iter(["cmdline", "status"]):
        args = proc.info["cmdline"] or []
        live = proc.info["status"] != psutil.STATUS_ZOMBIE
        if live and _is_stack_process(args, state_dir) and (names is None or _named(args) in names):
            strays[proc] = _named(args) or f"pid {proc.pid}"
    stop_processes(list(strays))
    return list(strays.values())


def stop_processes(left: list[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL what outlives the grace period (exited is enough: their parent reaps them)."""

    def still_running(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        return [p for p in procs if not wait_exited(p.pid, max(deadline - time.monotonic(), 0), p)]

    escalate(left, _send, still_running)


def _send(proc: psutil.Process, sig: int) -> None:
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.send_signal(sig)


def _named(args: list[str]) -> str:
    """A component's name, from its command line (`--name NAME`), or ''."""
    words = " ".join(a for a in args if a).split()
    return words[words.index("--name") + 1] if "--name" in words[:-1] and COMPONENT in words else ""


def _is_stack_process(args: list[str], state_dir: Path) -> bool:
    """A component of this stack, its launch's zygote, or a nats-server on a config in its state folder."""
    if _runs(COMPONENT, args, state_dir) or _runs(ZYGOTE, args, state_dir):
        return True
    inside = str(state_dir) + os.sep
    return bool(args) and Path(args[0]).name == "nats-server" and any(a.startswith(inside) for a in args)


def _runs(module: str, args: list[str], state_dir: Path) -> bool:
    """`python -m MODULE ... --state DIR ...`, as exec'd (one argument each) or as a forked component's
    title (one string: setproctitle writes the line over the zygote's arguments)."""
    line = " ".join(a for a in args if a) + " "
    return f" -m {module} " in line and f" --state {state_dir} " in line
