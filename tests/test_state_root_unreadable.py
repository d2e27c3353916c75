"""A state root or stack folder ncpsim may not read (issue 31, round three): one line and exit 2, never a
traceback from whichever command touched it first; `ls` still lists the stacks beside a foreign folder.

An unreadable folder is a chmod-000 folder for a user, `/proc/1/fdinfo` for root (which chmod cannot stop);
the readable home in the same rows is the negative control: the refusal is the folder's, not the command's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cli_support import NCPSIM, ncpsim

from clusters.state import create_stack_dir


def _cannot_list(folder: Path) -> bool:
    try:
        os.listdir(folder)
    except PermissionError:
        return True
    return False


@pytest.fixture
def locked(tmp_path: Path) -> Path:
    """A folder named like a stack that this user cannot list, and its parent readable."""
    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir(mode=0)
        yield folder
        folder.chmod(0o700)
        return
    folder = Path("/proc/1/fdinfo")
    if not _cannot_list(folder):
        pytest.skip("running as root where /proc/1/fdinfo is readable: no folder here refuses root")
    yield folder


COMMANDS = [
    ("ls",),
    ("ls", "--json"),
    ("status",),
    ("events",),
    ("logs",),
    ("values",),
    ("down", "--all"),
    ("up",),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_an_unreadable_ncpsim_home_is_one_line(locked: Path, command: tuple[str, ...]) -> None:
    result = ncpsim(*command, home=locked)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert f"NCPSIM_HOME={locked}" in result.stderr and "Permission denied" in result.stderr


@pytest.mark.parametrize("command", [("ls",), ("ls", "--json"), ("down", "--all")], ids=" ".join)
def test_a_readable_home_is_the_control(tmp_path: Path, command: tuple[str, ...]) -> None:
    assert ncpsim(*command, home=tmp_path).returncode == 0


def test_ls_lists_the_stacks_beside_a_foreign_folder_it_cannot_read(locked: Path, tmp_path: Path) -> None:
    parent = locked.parent
    if parent != tmp_path:  # root: /proc/1 holds the locked folder; a stack cannot be made beside it
        result = ncpsim("ls", home=parent)
        assert (result.returncode, result.stderr) == (0, "")
        return
    create_stack_dir(tmp_path / "mine")
    result = ncpsim("ls", "--json", home=parent)
    assert result.returncode == 0, result.stderr
    assert '"name": "mine"' in result.stdout and "locked" not in result.stdout


@pytest.mark.parametrize("command", [("status",), ("down", "--purge"), ("certs",), ("up",)], ids=" ".join)
def test_a_stack_folder_it_cannot_read_is_one_line(locked: Path, command: tuple[str, ...]) -> None:
    # up's early zygote too is the shared one's fork: in-process, nothing is left a child of the test
    result = ncpsim(*command, "--stack", locked.name, home=locked.parent)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert str(locked) in result.stderr


def test_a_current_folder_deleted_under_the_shell_is_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "NCPSIM_HOME"}
    script = f'cd "{gone}" && rmdir "{gone}" && exec "{NCPSIM}" ls'
    result = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 2 and "the current folder" in result.stderr, result.stderr
