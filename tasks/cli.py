"""What every task shares: user mistakes as one line and exit 2, optional positional words, the backend.

Thin tasks: each parses its arguments, calls into the packages, and turns a user mistake
(NcpsimError) into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from invoke import Exit, Task, task

ROOT = Path(__file__).resolve().parents[1]  # the repository (ncpsim test runs there)
EXIT_FAILED, EXIT_USAGE = 1, 2

# One meaning per short flag, on every task that has the option (invoke would otherwise take each option's
# first free letter, so `-s` was --scenario on one task and --stack on the next). `-f` is Helm's values file;
# on a task that follows a stream (`logs -f`, `events -f`) it is kubectl's and compose's --follow instead.
SHORT_FLAGS = {
    "file": "f",
    "follow": "f",
    "stack": "s",
    "backend": "b",
    "jobs": "j",
    "count": "n",
    "lines": "n",
    "out": "o",
    "yes": "y",
}


class NcpsimTask(Task):
    """A task whose short flags come from SHORT_FLAGS, never from invoke's first-free-letter rule."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "auto_shortflags": False})

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(opts["names"][0])
        if short and short not in taken_names:
            opts["names"].append(short)
        return opts

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        """invoke pops each option's help as it reads it, so a second read (ncpsim parses twice: the
        unknown-flag check, then the parse) had none left, and `ncpsim TASK --help` showed bare options."""
        kept = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept


ncpsim_task = functools.partial(task, klass=NcpsimTask)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map ncpsim's user-facing errors to a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from sim.errors import NcpsimError

        try:
            result = fn(*args, **kwargs)
            sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at exit as a traceback
            return result
        except NcpsimError as exc:
            raise Exit(f"ncpsim: {exc}", code=EXIT_USAGE) from None
        except BrokenPipeError:  # `ncpsim scenarios | head`: the reader has all it wanted
            _quiet_stdout()
            raise Exit(code=0) from None
        except KeyboardInterrupt:
            raise Exit("ncpsim: interrupted; the processes started so far were stopped", code=130) from None

    return wrapper


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so nothing more is written to the closed pipe, even at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _closed_pipe_is_quiet(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """invoke's own output (`invoke --list | head`, `ncpsim replay --help | head`) meets a closed pipe too."""
    if issubclass(kind, BrokenPipeError):
        _quiet_stdout()
        return
    _default_excepthook(kind, exc, tb)


_default_excepthook, sys.excepthook = sys.excepthook, _closed_pipe_is_quiet


def scenario_arg(scenario: str | None, usage: str = "ncpsim up scenario=grpc-callback") -> str:
    """Accept `scenario=NAME` (a positional word), `NAME`, and `--scenario NAME` alike."""
    value = (scenario or "").strip()
    value = value.removeprefix("scenario=")
    if not value:
        from sim.errors import ScenarioError

        raise ScenarioError(f"name a scenario: {usage} (see `ncpsim scenarios`)")
    return value


def backend_named(name: str, guard=None):
    """The one place a backend is chosen; every task then drives the Stack it returns. `guard`: the
    command's interrupt guard (clusters.interrupts), which the local backend's launches use."""
    from sim.errors import ConfigError

    if name == "local":
        from clusters.local import LocalBackend

        return LocalBackend(guard=guard)
    if name == "k3d":
        from clusters.k3d.stack import K3dBackend

        return K3dBackend()
    raise ConfigError(f"--backend {name!r}: choose local or k3d")


def stack_named(name: str, backend: str = "local"):
    return backend_named(backend).attach(name)


def colour(stream: Any) -> bool:
    """Colour on a terminal, none into a pipe or a file, or when NO_COLOR is set (no-color.org)."""
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def terminal(stream: Any) -> tuple[int | None, bool]:
    """(width, colour) for printing to `stream`: a terminal's own width and colour; a pipe gets neither."""
    if not getattr(stream, "isatty", lambda: False)():
        return None, False
    return shutil.get_terminal_size().columns, colour(stream)


def existing_stack(name: str, backend: str = "local"):
    """The stack of that name, which must exist: every task but `up` refuses a name it does not know
    (`certs --stack <typo>` once created a new stack with new CAs)."""
    from clusters.state import adopt
    from sim.errors import ConfigError

    stack = stack_named(name, backend)
    if backend == "local" and not adopt(stack.state_dir):  # ncpsim's, or holding nothing but what it writes
        raise ConfigError(
            f"no stack {name!r} in {stack.state_dir.parent} (`ncpsim ls` lists the stacks there; "
            f"`ncpsim up --stack {name}` brings one up)"
        )
    return stack


def state_folder(stack: str) -> Path:
    """The stack's folder, created (with its marker) for a task that writes there without bringing it up."""
    from clusters.state import create_stack_dir, state_dir

    folder = state_dir(stack)
    create_stack_dir(folder)
    return folder


def whole_number(flag: str, text: Any) -> int:
    from sim.errors import ConfigError

    try:
        value = int(str(text).strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{flag} {text!r}: give a whole number, e.g. {flag} 100")
    return value


def out_file(flag: str, out: str) -> Path:
    """A file to write: not a folder, with no file where a folder of its path should be."""
    from sim.errors import ConfigError

    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"{flag} {out}: is a folder; name a file to write")
    out_folder(str(path.parent), flag=flag, shown=out)
    if problem := _unwritable(path):  # /proc, a read-only mount: said now, not after the whole run
        raise ConfigError(
            f"{flag} {out}: cannot be written ({problem}); name a file in a folder you can write"
        )
    return path


def _unwritable(path: Path) -> str | None:
    """Why `path` cannot be written: tried by making a scratch file in the nearest folder that exists."""
    import tempfile

    if path.exists():
        return None if os.access(path, os.W_OK) else "permission denied"
    place = next(p for p in path.parents if p.exists())
    try:
        with tempfile.TemporaryFile(dir=place):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def out_folder(out: str, flag: str = "--out", shown: str | None = None) -> Path:
    """`--out DIR`: a folder, or a path where one can be made; a file on the way is one line, not a traceback."""
    from sim.errors import ConfigError

    folder = Path(out)
    for place in (folder, *folder.parents):
        if place.exists() or place.is_symlink():
            if not place.is_dir():
                raise ConfigError(
                    f"{flag} {shown or out}: {place} is a file, not a folder; name a folder to write into"
                )
            break
    return folder


# The command line the Program is parsing (ncpsim sets it; `invoke` in the repository parses its own argv).
_command_line: list[str] | None = None


def parsing(argv: list[str]) -> None:
    """Name the command line about to be parsed, so optional positional words are read from it, not from
    this process's argv: ncpsim run in-process (the tests) parses a new command line each time."""
    global _command_line
    _command_line = list(argv)


def _bare_words(fn: Callable[..., Any], name: str) -> int:
    """How many bare words follow task `name` on this command line (flag values are not bare words)."""
    takes_value = {
        alias.replace("-", "_"): arg.takes_value
        for arg in NcpsimTask(fn, positional=[]).get_arguments()
        for alias in arg.names
    }
    argv = sys.argv if _command_line is None else _command_line
    if name not in argv[1:]:
        return 0
    words, skip = 0, False
    for token in argv[argv.index(name, 1) + 1 :]:
        if skip:
            skip = False
        elif token.startswith("-"):
            flag = token.lstrip("-")
            skip = "=" not in flag and takes_value.get(flag.replace("-", "_"), False)
        else:
            words += 1
    return words


class WordsTask(NcpsimTask):
    """A task whose positional words are those its command line holds (see optional_positional): fitted
    each time the command line is read for arguments, which every parse does before the task runs."""

    def __init__(self, body: Callable[..., Any], *, words: tuple[str, ...], more: str | None, **options: Any):
        self.words, self.more, self.plain = words, more, body
        self.word_name = options.get("name") or body.__name__.strip("_")
        super().__init__(body, positional=[], **options)

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Any]:
        self._fit(_bare_words(self.plain, self.word_name))
        return super().get_arguments(ignore_unknown_help)

    def _fit(self, given: int) -> None:
        names, more = self.words, self.more
        self.body = self.plain
        if more and given > len(names):
            self.body = _taking_more(self.plain, more, given - len(names) + 1)
        extra = [f"{more}_{n}" for n in range(2, given - len(names) + 2)] if more else []
        self.positional = [*names, *extra][:given]


def optional_positional(*names: str, more: str | None = None, **task_options: Any) -> Callable[..., Task]:
    """@task whose positional arguments may be left out, which invoke itself does not allow.

    Each name is positional only when the command line holds a bare word for it, so `ncpsim up`,
    `ncpsim up NAME` and `ncpsim up --help` all parse. With `more`, the last name takes every further
    word too (`ncpsim set a=1 b=2`): invoke reads a task's signature, so they become parameters.
    """

    def decorate(fn: Callable[..., Any]) -> Task:
        return WordsTask(fn, words=names, more=more, **task_options)

    return decorate


def _taking_more(fn: Callable[..., Any], name: str, count: int) -> Callable[..., Any]:
    """`fn` with `count` words for parameter `name` (a list): parameters name_2..name_N gather them."""
    signature = inspect.signature(fn)
    extra = [
        inspect.Parameter(f"{name}_{n}", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
        for n in range(2, count + 1)
    ]

    @functools.wraps(fn)
    def body(*args: Any, **kwargs: Any) -> Any:
        words = [kwargs.pop(f"{name}_{n}", None) for n in range(2, count + 1)]
        kwargs[name] = [kwargs.get(name), *words]
        return fn(*args, **kwargs)

    body.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *extra]
    )
    return body
