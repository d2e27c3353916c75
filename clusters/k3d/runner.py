"""One place every external command goes through: `k3d`, `kubectl`, `docker`.

It records each argv before running it (tests assert the exact sequence with fake programs first on
PATH), captures output, and turns a failure into a BackendError that names the command and the
last line it printed, so the user sees one line and the backend can roll back.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sim.errors import BackendError

COMMAND_TIMEOUT = 600.0  # k3d cluster create pulls k3s on a first run; nothing legitimate takes longer


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandFailed(BackendError):
    def __init__(self, result: Completed):
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()
        reason = detail[-1] if detail else "no output"
        super().__init__(f"`{shlex.join(result.argv)}` failed (exit {result.returncode}): {reason}")
        self.result = result


def _stderr_echo(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class CommandRunner:
    """Runs commands; `commands` keeps every argv in order. `echo` shows progress (None: silent)."""

    env: Mapping[str, str] | None = None
    echo: Callable[[str], None] | None = _stderr_echo
    commands: list[tuple[str, ...]] = field(default_factory=list)

    def which(self, program: str) -> str | None:
        path = (self.env or os.environ).get("PATH")
        return shutil.which(program, path=path)

    def run(
        self, *argv: str, check: bool = True, timeout: float = COMMAND_TIMEOUT, input_text: str | None = None
    ) -> Completed:
        self.commands.append(tuple(argv))
        if self.echo:
            self.echo(f"+ {shlex.join(argv)}")
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                input=input_text,
                env=dict(self.env) if self.env is not None else None,
                check=False,
            )
        except FileNotFoundError:
            raise BackendError(
                f"{argv[0]}: not found on PATH; run `ncpsim doctor` for the install step"
            ) from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"`{shlex.join(argv)}` did not finish in {timeout:.0f}s") from None
        result = Completed(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and not result.ok:
            raise CommandFailed(result)
        return result

    def spawn(self, *argv: str) -> subprocess.Popen[str]:
        """A long-running command (kubectl port-forward), in its own process group so it can be
        stopped with everything it started; recorded like the others."""
        self.commands.append(tuple(argv))
        if self.echo:
            self.echo(f"+ {shlex.join(argv)} &")
        return subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(self.env) if self.env is not None else None,
        )
