"""`ncpsim`: the tasks as a program of their own (invoke's `Program`), from any folder.

invoke's own command line is a task runner: its core flags (`-f/--config`, `-e/--echo`, `-d/--debug`, ...)
are read anywhere on the line, so `render -f customer.yaml` silently loaded the customer's file as invoke's
configuration, and every parse error exited 1. ncpsim keeps only the core flags its users have (`--help`,
`--version`, `--list`, shell completion), reads `TASK --help` as that task's help, and turns every usage
error (an unknown flag, a missing word, a value that is not a number) into one line and exit 2.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from invoke import Argument, Exit, ParseError, ParserContext, Program
from invoke.completion.complete import print_completion_script

from tasks import ns
from tasks.cli import EXIT_USAGE, parsing

CORE_FLAGS = ("help", "version", "list", "complete", "print-completion-script")
HELP_WORDS = ("--help", "-h")
UNKNOWN = re.compile(r"^No idea what '(.*)' is!$")
NOT_A_NUMBER = re.compile(r"invalid literal for (int|float)\(\)(?: with base 10)?: (.*)$")


def version() -> str:
    try:
        return metadata.version("ncpsim")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


class Ncpsim(Program):
    """invoke's Program over the tasks collection, with a command line that holds its shape."""

    def core_args(self) -> list:
        return [arg for arg in super().core_args() if arg.name in CORE_FLAGS]

    def parse_core(self, argv: list[str] | None) -> None:
        with self._usage_errors():
            self.normalize_argv(argv)
            self.argv = self._task_help_first(self.argv)
            parsing(self.argv)  # optional positional words are read from this line, not sys.argv
            self.parse_core_args()
        if self.args.version.value:
            self.print_version()
            raise Exit
        if self.args["print-completion-script"].value:
            print_completion_script(shell=self.args["print-completion-script"].value, names=["ncpsim"])
            raise Exit

    def _task_help_first(self, argv: list[str]) -> list[str]:
        """`ncpsim call --help` as `ncpsim --help call`: a task's required words must not swallow --help."""
        words = argv[1:]
        task = next((word for word in words if not word.startswith("-")), None)
        if task is None or task not in ns.task_names:
            return argv
        after = words[words.index(task) + 1 :]
        return [argv[0], "--help", task] if any(word in HELP_WORDS for word in after) else argv

    def parse_tasks(self) -> None:
        with self._usage_errors():
            self._refuse_unknown_flags(self.core.unparsed)
            try:
                super().parse_tasks()
            except ValueError as exc:  # invoke casts `--count abc` with int() and lets the ValueError out
                raise ParseError(self._not_a_number(str(exc)), self._task_at_fault()) from None

    def _refuse_unknown_flags(self, words: list[str]) -> None:
        """A word that looks like a flag is a flag: invoke gives it to a task's missing positional word
        (`ncpsim call --bogus` called function '--bogus'), so an unknown one is refused before it parses."""
        contexts = self._make_parser().contexts
        context, value_next = None, False
        for word in words:
            if value_next:
                value_next = False
            elif word in contexts and (context is None or not word.startswith("-")):
                context = contexts[word]
            elif context is not None and word.startswith("-") and word != "-" and word not in HELP_WORDS:
                flag = word.split("=", 1)[0]
                if flag not in context.flags and flag not in context.inverse_flags:
                    raise ParseError(f"No idea what {flag!r} is!", context)
                argument = context.flags.get(flag)
                value_next = "=" not in word and bool(
                    argument and argument.takes_value and not argument.optional
                )

    def parse_cleanup(self) -> None:
        for name, value in (
            ("list-format", "flat"),
            ("list-depth", 0),
        ):  # read there; ncpsim has no such flags
            self.args[name] = Argument(names=(name,), default=value)
        with self._usage_errors():
            super().parse_cleanup()

    def update_config(self, merge: bool = True) -> None:
        if merge:  # no invoke configuration flags: the tasks read their own options only
            self.config.merge()

    @contextlib.contextmanager
    def _usage_errors(self) -> Iterator[None]:
        """A usage error is one line on stderr and exit 2, naming the task and where its help is."""
        try:
            yield
        except ParseError as exc:
            raise Exit(f"ncpsim: {self._usage(exc)}", code=EXIT_USAGE) from None

    def _usage(self, exc: ParseError) -> str:
        task = getattr(exc.context, "name", None)
        message = str(exc)
        unknown = UNKNOWN.match(message)
        if unknown and not task:
            word = unknown.group(1)
            close = difflib.get_close_matches(word, ns.task_names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else " (see ncpsim --help)"
            return f"unknown task {word!r}{hint}"
        if unknown:
            message = f"unknown flag or word {unknown.group(1)!r}"
        return f"{task}: {message} (see ncpsim {task} --help)" if task else message

    def _task_at_fault(self) -> Any:
        words = [word for word in self.argv[1:] if word in ns.task_names]
        return ParserContext(name=words[0]) if words else None

    def _not_a_number(self, reason: str) -> str:
        match = NOT_A_NUMBER.search(reason)
        if not match:
            return reason
        kind, given = match.groups()
        flag = self._flag_given(given.strip("'\""))
        what = "a whole number" if kind == "int" else "a number"
        return f"{flag or 'a flag'} {given}: give {what}"

    def _flag_given(self, value: str) -> str | None:
        words = self.argv[1:]
        for index, word in enumerate(words):
            if word.startswith("-") and word.endswith(f"={value}"):
                return word.split("=", 1)[0]
            if word == value and index and words[index - 1].startswith("-"):
                return words[index - 1]
        return None


def main() -> None:
    Ncpsim(name="ncpsim", binary="ncpsim", namespace=ns, version=version()).run()
