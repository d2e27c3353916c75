"""The command line in tests: `ncpsim ARGV` run in this process, or as a real process where a test needs one.

In-process (`ncpsim`) is the default: the same Program, tasks and exit codes as the console script, without
an interpreter start and the imports (most of a command's CPU, hundreds of times in a run). `up` runs here
too: its launch's zygote is forked by the session's shared zygote (conftest.py), so neither that zygote nor
the components it forks is a child of the test, and the signals `up` settles are put back when it returns
(which also spares the launch's zygote its own imports: 1-2 CPU-seconds an `up`). A restart or a redeploy
runs here too: the stack's supervisor forks the new component. A real process (`ncpsim_process`) is for
what only a process shows: signals and Ctrl-C, a terminal, the console script from outside the repository
or as the commands `up` prints name it, commands pasted into a shell, an `up` with a zygote of its own, a
restart whose stack's supervisor is gone (the zygote it starts stays as the supervisor).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import psutil
from timeouts import COMMAND

from clusters import interrupts
from clusters.local import zygote
from tasks import ns
from tasks.program import Ncpsim

REPO = Path(__file__).resolve().parents[1]
NCPSIM = str(Path(sys.executable).with_name("ncpsim"))  # the console script, as a user runs it


def ncpsim(
    *argv: str,
    home: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | bytes | BinaryIO | None = None,
) -> subprocess.CompletedProcess[str]:
    """`ncpsim ARGV` in this process: the exit code, stdout and stderr as a CompletedProcess.

    `home` is NCPSIM_HOME; `env` are variables set for the run (the processes a task starts inherit them);
    `cwd` the folder it runs in (default: the repository); `stdin` what the command reads there."""
    variables = {**(env or {}), **({"NCPSIM_HOME": str(home)} if home is not None else {})}
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(variables),
        _folder(cwd or REPO),
        _argv(argv),
        _stdin(stdin),
        _stack_not_kept(argv),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = _run(["ncpsim", *argv])
    return subprocess.CompletedProcess(["ncpsim", *argv], code, out.getvalue(), err.getvalue())


def ncpsim_process(
    *argv: str,
    home: Path | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = COMMAND,
) -> subprocess.CompletedProcess[str]:
    """The console script as a real process, with this environment plus `env` (and NCPSIM_HOME=`home`)."""
    variables = {**os.environ, **(env or {}), **({"NCPSIM_HOME": str(home)} if home is not None else {})}
    return subprocess.run(
        [NCPSIM, *argv],
        cwd=cwd or REPO,
        env=variables,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _run(argv: list[str]) -> int:
    try:
        Ncpsim(name="ncpsim", binary="ncpsim", namespace=ns, version="test").run(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _folder(cwd: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _argv(argv: tuple[str, ...]) -> Iterator[None]:
    """sys.argv as the console script's process has it: the commands `up` and `status` print name the program
    as it was run (scenarios.paste), here the console script beside this Python."""
    before, sys.argv = sys.argv, [NCPSIM, *argv]
    try:
        yield
    finally:
        sys.argv = before


@contextlib.contextmanager
def _stdin(data: str | bytes | BinaryIO | None) -> Iterator[None]:
    """Standard input as the command reads it (text, and `sys.stdin.buffer` for bytes): given text or bytes,
    or an open binary file (read as far as the command reads, as a shell's `<` would give it)."""
    if isinstance(data, str):
        data = data.encode()
    source = io.BytesIO(data or b"") if data is None or isinstance(data, bytes) else data
    before, sys.stdin = sys.stdin, io.TextIOWrapper(source)
    try:
        yield
    finally:
        sys.stdin.detach()  # the caller's file stays open, theirs to close
        sys.stdin = before


@contextlib.contextmanager
def _stack_not_kept(argv: tuple[str, ...]) -> Iterator[None]:
    """A command run here must leave no process of its own behind. A zygote this process starts itself (an
    `up` whose zygote is not the shared one's fork, a restart with no supervisor to reach) stays as the
    stack's supervisor, a child (in the field that process exits, and the supervisor outlives it): such a
    command runs with ncpsim_process. An `up` settles
    its signals (SIGINT and SIGTERM ignored until the process exits, so its report and its stack agree):
    they are restored here either way."""
    dispositions = {sig: signal.getsignal(sig) for sig in interrupts.InterruptGuard.SIGNALS}
    before = {child.pid for child in _children()}
    try:
        yield
    finally:
        if interrupts._settled:
            interrupts._settled = False
            for sig, handler in dispositions.items():
                signal.signal(sig, handler)
    left = [child.pid for child in _children() if child.pid not in before]
    if left:
        raise AssertionError(
            f"`ncpsim {' '.join(argv)}` left processes {left} as children of the test process: "
            "run it with ncpsim_process"
        )


def _children() -> list[psutil.Process]:
    """Live children of the test process, but the session's shared zygote (conftest), which the first
    launch of the session starts whichever command that is."""
    shared = zygote._SHARED.process if zygote._SHARED is not None else None
    alive = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and (shared is None or child.pid != shared.pid):
                alive.append(child)
    return alive
