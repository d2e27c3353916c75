"""`ncpsim`, invoke's Program over the tasks package (issue 29): help on every task, usage errors in one line.

The parse runs in-process (nothing of a task runs before its arguments parse), and so do the tasks; `--version`
and a task from a folder outside the repository run the installed console script, as a user would.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest
from cli_support import ncpsim, ncpsim_process

from tasks import ns
from tasks.cli import SHORT_FLAGS, parsing

TASKS = sorted(ns.task_names)


def run(*argv: str) -> tuple[int, str, str]:
    done = ncpsim(*argv)
    return done.returncode, done.stdout, done.stderr


def one_line_usage_error(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ncpsim: "), err
    return err.strip()


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_help_after_its_name(task: str) -> None:
    code, out, err = run(task, "--help")
    assert code == 0 and f"Usage: ncpsim [--core-opts] {task}" in out, err
    assert run(task, "-h")[0] == 0


@pytest.mark.parametrize("task", TASKS)
def test_an_unknown_flag_is_one_line_and_exit_2(task: str) -> None:
    code, _, err = run(task, "--no-such-flag")
    line = one_line_usage_error(code, err)
    assert f"ncpsim {task} --help" in line and "'--no-such-flag'" in line


@pytest.mark.parametrize("task", [t for t in TASKS if "file" not in ns[t].argspec(ns[t].body).parameters])
def test_dash_f_on_a_task_without_values_is_refused(task: str) -> None:
    """invoke read it as its own --config (the customer's file loaded as invoke's configuration)."""
    code, _, err = run(task, "-f", "customer.yaml")
    one_line_usage_error(code, err)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["call", "http-echo", "--count", "abc"], "--count 'abc': give a whole number"),
        (["call", "http-echo", "--count=abc"], "--count 'abc': give a whole number"),
        (["call", "http-echo", "-n", "abc"], "-n 'abc': give a whole number"),
        (["upp"], "unknown task 'upp' (did you mean up?)"),
        (["call"], "call:"),
        (["status", "--stack"], "status:"),
    ],
)
def test_usage_errors_name_what_is_wrong(argv: list[str], says: str) -> None:
    code, _, err = run(*argv)
    assert says in one_line_usage_error(code, err)


def test_each_short_flag_has_one_meaning_across_tasks() -> None:
    """invoke's first-free-letter rule made `-s` --scenario on up and --stack elsewhere."""
    meanings: dict[str, set[str]] = {}
    for name in TASKS:
        for argument in ns[name].get_arguments(ignore_unknown_help=True):
            for short in (n for n in argument.names if len(n) == 1):
                meanings.setdefault(short, set()).add(argument.name)
    for short, names in meanings.items():
        assert all(SHORT_FLAGS.get(n) == short or n == short for n in names), (short, names)
        assert names <= {"file", "follow"} or len(names) == 1 or short == "n", (short, names)


def test_version_and_a_task_from_outside_the_repository(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent)}
    shown = ncpsim_process("--version", cwd=tmp_path, env=env, home=tmp_path / "home")
    assert shown.returncode == 0 and shown.stdout.strip() == f"ncpsim {metadata.version('ncpsim')}"
    listed = ncpsim_process("scenarios", cwd=tmp_path, env=env, home=tmp_path / "home")
    assert listed.returncode == 0 and "grpc-callback" in listed.stdout, listed.stderr


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (["up"], []),
        (["up", "-f", "customer.yaml", "http-callback"], ["scenario"]),
        (["up", "--stack", "http-callback"], []),  # a flag's value is not a word
        (["set", "--unset", "a"], []),
        (["set", "a=1", "b=2", "--redeploy", "proxy", "c=3"], ["assignment", "assignment_2", "assignment_3"]),
        (["fault", "kill", "invocation-service-0"], ["action", "target"]),
        (["fault", "clear-links"], ["action"]),
        (["logs", "-n", "5"], []),
    ],
)
def test_optional_words_are_read_from_the_line_being_parsed(line: list[str], words: list[str]) -> None:
    """The same task, other lines, other words: read from the line the Program parses, not from this process's
    argv (fixed at import, it made every in-process `ncpsim set a=1` an unknown word)."""
    parsing(["ncpsim", *line])
    task = ns[line[0]]
    assert [a.attr_name or a.name for a in task.get_arguments() if a.positional] == words
    assert set(words) <= set(task.argspec(task.body).parameters)


def test_in_process_runs_read_each_command_lines_own_words(tmp_path: Path) -> None:
    """One process, several command lines, as the suite runs them: each gets its words and reaches the task
    (which refuses the stack it does not know) instead of a parse error."""
    for line in (
        ["fault", "kill", "x"],
        ["logs", "a", "b"],
        ["set", "nats.workerAuth=token", "workerCallbackProxy.enabled=true"],
        ["fault", "clear-links"],
    ):
        done = ncpsim(*line, "--stack", "nosuch", home=tmp_path)
        assert "stack 'nosuch'" in one_line_usage_error(done.returncode, done.stderr), line


def test_a_tasks_help_names_every_option_each_time() -> None:
    """invoke pops an option's help as it reads it, and ncpsim reads the options twice per parse: `ncpsim up
    --help` listed bare options. Twice in one process, as the in-process tests run it."""
    for _ in range(2):
        code, out, _ = run("up", "--help")
        assert code == 0 and "a customer's values file" in out, out


def test_a_stack_that_does_not_exist_is_refused_and_not_created(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for task in (["certs"], ["status"], ["logs"], ["status", "--json"]):
        done = ncpsim(*task, "--stack", "nosuch", home=home)
        assert done.returncode == 2 and done.stderr.startswith("ncpsim: no stack 'nosuch'"), (task, done)
    assert not (home / "nosuch").exists()


def test_ls_lists_replay_stacks_and_down_all_purge_removes_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert ncpsim("ls", home=home).stdout.startswith("no stacks here")
    replayed = ncpsim("replay", "http-callback", home=home)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    listed = ncpsim("ls", "--json", home=home)
    assert json.loads(listed.stdout) == [
        {
            "name": "replay-http-callback",
            "state": "stopped",
            "scenario": "",
            "stateDir": str(home / "replay-http-callback"),
        }
    ]
    gone = ncpsim("down", "--all", "--purge", home=home)
    assert gone.returncode == 0 and "replay-http-callback: stopped 0 processes and removed" in gone.stdout
    assert (
        not (home / "replay-http-callback").exists()
        and ncpsim("ls", "--json", home=home).stdout.strip() == "[]"
    )
