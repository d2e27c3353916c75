"""`ncpsim`, invoke's Program over the tasks package (issue 29): help on every task, usage errors in one line.

The parse runs in-process (nothing of a task runs before its arguments parse); `--version` and a task from
a folder outside the repository run the installed console script, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tasks import ns
from tasks.cli import SHORT_FLAGS
from tasks.program import Ncpsim

NCPSIM = str(Path(sys.executable).with_name("ncpsim"))
COMMAND_TIMEOUT = 60.0  # seconds: one interpreter start and an import of the tasks
TASKS = sorted(ns.task_names)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        Ncpsim(name="ncpsim", binary="ncpsim", namespace=ns, version="test").run(["ncpsim", *argv])
    out, err = capsys.readouterr()
    return int(done.value.code or 0), out, err


def one_line_usage_error(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ncpsim: "), err
    return err.strip()


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_help_after_its_name(capsys: pytest.CaptureFixture[str], task: str) -> None:
    code, out, err = run(capsys, task, "--help")
    assert code == 0 and f"Usage: ncpsim [--core-opts] {task}" in out, err
    assert run(capsys, task, "-h")[0] == 0


@pytest.mark.parametrize("task", TASKS)
def test_an_unknown_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], task: str) -> None:
    code, _, err = run(capsys, task, "--no-such-flag")
    line = one_line_usage_error(code, err)
    assert f"ncpsim {task} --help" in line and "'--no-such-flag'" in line


@pytest.mark.parametrize("task", [t for t in TASKS if "file" not in ns[t].argspec(ns[t].body).parameters])
def test_dash_f_on_a_task_without_values_is_refused(capsys: pytest.CaptureFixture[str], task: str) -> None:
    """invoke read it as its own --config (the customer's file loaded as invoke's configuration)."""
    code, _, err = run(capsys, task, "-f", "customer.yaml")
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
def test_usage_errors_name_what_is_wrong(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, _, err = run(capsys, *argv)
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
    env = {"PATH": str(Path(sys.executable).parent), "NCPSIM_HOME": str(tmp_path / "home")}
    shown = subprocess.run(
        [NCPSIM, "--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert shown.returncode == 0 and shown.stdout.strip() == f"ncpsim {metadata.version('ncpsim')}"
    listed = subprocess.run(
        [NCPSIM, "scenarios"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    assert listed.returncode == 0 and "grpc-callback" in listed.stdout, listed.stderr


def ncpsim(*args: str, home: Path, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "NCPSIM_HOME": str(home)}
    return subprocess.run(
        [NCPSIM, *args],
        cwd=home.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_stack_that_does_not_exist_is_refused_and_not_created(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for task in (["certs"], ["status"], ["logs"], ["status", "--json"]):
        done = ncpsim(*task, "--stack", "nosuch", home=home)
        assert done.returncode == 2 and done.stderr.startswith("ncpsim: no stack 'nosuch'"), (task, done)
    assert not (home / "nosuch").exists()


def test_ls_lists_replay_stacks_and_down_all_purge_removes_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert ncpsim("ls", home=home).stdout.startswith("no stacks here")
    replayed = ncpsim("replay", "http-callback", home=home, timeout=120)
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
