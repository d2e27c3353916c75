"""mypy over the whole source in one run, as pyproject.toml's [tool.mypy] says: every module at mypy's default
level, and the seams (clusters.stack's Stack and Backend, the fault target, the events the engine reads), the
engine, replay, trace, both backends' stacks and the pure cores strict. A type error anywhere fails the suite.

tests/test_seams.py is in that run, strict: it assigns each backend to `Backend` and each stack to `Stack`;
the negative control shows that such an assignment fails for a class off the seam."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from sim.model.events import ENGINE_KINDS, PROXY_DECISION

REPO = Path(__file__).resolve().parents[1]
# seconds: about 5 s with a warm cache (.mypy_cache), 25 s cold on 2 busy cores
MYPY_TIMEOUT = 180.0


def mypy(*files: str) -> subprocess.CompletedProcess[str]:
    """mypy with the repository's configuration; `files` instead of its own list, when given."""
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), *files],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=MYPY_TIMEOUT,
    )


PACKAGES = ("tasks", "bench", "scenarios", "clusters", "sim", "dns", "certs")


def test_the_whole_tree_type_checks() -> None:
    done = mypy()
    assert done.returncode == 0, done.stdout + done.stderr
    # every module of every package, and the two test modules: a package left out of `files` fails here
    modules = sum(len(list((REPO / package).rglob("*.py"))) for package in PACKAGES) + 2
    assert f"no issues found in {modules} source files" in done.stdout, done.stdout


OFF_SEAM = '''
from clusters.local import LocalBackend, LocalStack
from clusters.stack import Backend, Stack
from sim.model.topology import Topology


class UpOnly:
    """A backend that can bring a stack up, but not attach to one, nor stop it on Ctrl-C."""

    name = "up-only"

    def up(self, topology: Topology, scenario: str) -> LocalStack:
        raise NotImplementedError


backend: Backend = LocalBackend()  # on the seam
stray: Backend = UpOnly()  # off it
stack: Stack = LocalBackend()  # a backend is no stack
'''


def test_a_backend_off_the_seam_fails(tmp_path: Path) -> None:
    module = tmp_path / "off_seam.py"
    module.write_text(OFF_SEAM)
    done = mypy(str(module))
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert done.returncode == 1, done.stdout + done.stderr
    source = OFF_SEAM.splitlines()
    assert [source[int(line.split(":")[1]) - 1].split(":")[0] for line in errors] == ["stray", "stack"]
    assert 'variable has type "Backend"' in errors[0] and 'variable has type "Stack"' in errors[1]


def bare_kinds(path: Path) -> set[str]:
    """The catalogued event kinds a module spells out as string literals instead of naming them."""
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in ENGINE_KINDS}


def test_the_engine_s_event_kinds_are_named_once(tmp_path: Path) -> None:
    """Every emitter and reader of a kind the engine reads uses sim.model.events' name for it. The negative
    control: a module spelling one out is found."""
    stray = tmp_path / "stray.py"
    stray.write_text(f"events.emit({PROXY_DECISION!r}, reason='x')\n")
    assert bare_kinds(stray) == {PROXY_DECISION}
    found = {
        str(path.relative_to(REPO)): kinds
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        if path != REPO / "sim" / "model" / "events.py" and (kinds := bare_kinds(path))
    }
    assert found == {}
