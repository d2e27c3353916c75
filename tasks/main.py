"""The `ncpsim` binary's first lines: a local `ncpsim up` starts its stack's zygote before anything else is
imported, so the zygote's imports (every runner the launch forks) overlap invoke's and the tasks' as well as
the launch's own preparation. Every other command goes straight to the program (tasks.program).

Only the standard library, the state folder's rules and the zygote's launcher end are imported first; which
stack an `up` will launch is read from its words here, before invoke parses them. A guess that misses (a
command line invoke then refuses) costs the head start only: the zygote nobody adopted is ended on the way
out, and the launch starts its own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from clusters.interrupts import INTERRUPTED, InterruptGuard
from clusters.local.zygote import early_for

HELP = ("--help", "-h")


def main() -> None:
    stack = local_up_stack(sys.argv[1:])
    if stack is None:
        _program()
        return
    guard = InterruptGuard()  # the command's one (the task takes it up): Ctrl-C or SIGTERM from here on
    try:  # ends the early zygote too
        with guard.installed(), early_for(stack, guard):
            _program()
    except KeyboardInterrupt:  # during the imports, before the task that answers it is running
        print(f"ncpsim: {INTERRUPTED}", file=sys.stderr)
        sys.exit(130)


def _program() -> None:
    from tasks.program import main as program  # invoke and every task: what the head start overlaps

    program()


def local_up_stack(words: Sequence[str]) -> str | None:
    """The stack `ncpsim <words>` brings up on the local backend, or None when it is another command, asks
    for help, or names another backend. Reads the flags as `ncpsim up --help` lists them: -s/--stack and
    -b/--backend, each `--flag value` or `--flag=value`."""
    if not words or words[0] != "up" or any(word in HELP for word in words):
        return None
    given = {"stack": "default", "backend": "local"}
    names = {"-s": "stack", "--stack": "stack", "-b": "backend", "--backend": "backend"}
    rest = iter(words[1:])
    for word in rest:
        flag, equals, value = word.partition("=")
        if flag in names:
            given[names[flag]] = value if equals else next(rest, "")
    return given["stack"] if given["backend"] == "local" and given["stack"] else None
