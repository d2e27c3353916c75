"""bench.as_filed and what the bench does with it: a commit exported beside the checkout (nothing added to the
repository), start-up timed in turns against it, and the verdicts on the same-run ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_bench_harness import SAMPLE

from bench import startup
from bench.as_filed import ExportFailed, Tree, exported
from bench.targets import judge


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with two commits of one module: `first` says 1, the tip says 2."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    git(repo, "init", "-q")
    for value in (1, 2):
        (repo / "pkg" / "mod.py").write_text(f"VALUE = {value}\n")
        git(repo, "add", "pkg/mod.py")
        git(repo, "commit", "-q", "-m", f"value {value}")
        if value == 1:
            git(repo, "tag", "first")
    return repo


def test_a_commit_is_exported_byte_compiled_and_removed_after(repo: Path, tmp_path: Path) -> None:
    into = tmp_path / "as-filed"
    state = git(repo, "status", "--porcelain"), git(repo, "worktree", "list"), git(repo, "show-ref")
    with exported(repo, into, "first") as tree:
        assert (into / "pkg" / "mod.py").read_text() == "VALUE = 1\n"  # the commit's, not the tip's
        assert list((into / "pkg" / "__pycache__").glob("mod.*.pyc"))
        env = tree.env(tmp_path / "home")
        assert env["PYTHONPATH"] == str(into) and env["NCPSIM_HOME"] == str(tmp_path / "home")
        assert tree.cwd == into and tree.argv == (sys.executable, "-m", "invoke")
        imported = subprocess.run(
            [sys.executable, "-c", "import pkg.mod; print(pkg.mod.VALUE, pkg.mod.__file__)"],
            env=env,
            cwd=tree.cwd,
            capture_output=True,
            text=True,
            check=True,
        )
        assert imported.stdout.split() == ["1", str(into / "pkg" / "mod.py")]
    assert not into.exists()
    assert (git(repo, "status", "--porcelain"), git(repo, "worktree", "list"), git(repo, "show-ref")) == state


def test_a_clone_without_the_commit_says_so_in_one_line(repo: Path, tmp_path: Path) -> None:
    into = tmp_path / "as-filed"
    failed = r"^git archive 0badc0de failed: [^\n]*0badc0de$"  # git's one line, which names it
    with pytest.raises(ExportFailed, match=failed), exported(repo, into, "0badc0de"):
        pass
    assert not into.exists()


def test_start_up_against_a_tree_takes_turns_and_is_judged_on_the_rounds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cold run each, then rounds whose order flips; the figure is the median of the rounds' ratios."""
    other = Tree("as_filed", ("python", "-m", "invoke"), tmp_path, tmp_path)
    seconds = {"current": [9.0, 0.5, 0.6, 0.5], "as_filed": [9.0, 1.0, 0.5, 0.6]}
    order: list[str] = []

    def up_once(scenario: str, stack: str, root: Path, logs: Path, tree: Tree) -> dict[str, Any]:
        order.append(tree.key)
        return {"seconds": seconds[tree.key].pop(0)}

    class Stack:
        def __init__(self, name: str, root: Path) -> None:
            pass

        def down(self, purge: bool = False) -> None:
            assert purge

    monkeypatch.setattr(startup, "up_once", up_once)
    monkeypatch.setattr(startup, "LocalStack", Stack)
    r = startup.against(other, "http-callback", 3, tmp_path, tmp_path)
    c, a = "current", "as_filed"
    assert order == [c, a, c, a, a, c, c, a]
    assert r["round_ratio_median"] == 0.833 and r["round_ratio_range"] == [
        0.5,
        1.2,
    ]  # 0.5/1, 0.6/0.5, 0.5/0.6
    assert r["median"] == {c: 0.5, a: 0.6} and r["failed_runs"] == {c: 0, a: 0}

    def row(result: dict[str, Any]) -> Any:
        rows = judge({**SAMPLE, "as_filed": {"startup": {"http": result}}})
        return next(x for x in rows if "first HTTP callback, this checkout / the tree as filed" in x.figure)

    assert row(r).met is True and row(r).measured.startswith("0.83 (rounds 0.50-1.20")
    assert row({**r, "round_ratio_median": 1.01}).met is False
    mine = row({**r, "failed_runs": {c: 1, a: 0}})
    assert mine.met is False and "this checkout had 1 runs without a callback" in mine.measured
    theirs = row({**r, "failed_runs": {c: 0, a: 2}})  # says nothing of this checkout: no verdict
    assert theirs.met is None and "the tree as filed had 2 runs without a callback" in theirs.measured


def test_a_tree_not_timed_is_not_measured_and_says_why() -> None:
    results = {
        **SAMPLE,
        "as_filed": {"skipped": "the tree as filed (3bc23ba) was not timed: git is not installed"},
    }
    rows = [x for x in judge(results) if "the tree as filed" in x.figure]
    assert len(rows) == 2
    assert all(x.met is None and x.measured.endswith("git is not installed") for x in rows)


def test_the_catalogue_as_filed_is_judged_against_the_tree_when_it_replayed_whole() -> None:
    def row(tree: dict[str, Any] | None, seconds: float = 10.0) -> Any:
        results: dict[str, Any] = json.loads(json.dumps(SAMPLE))
        results["catalogue"]["as_filed"] = {"seconds": seconds, "exit": 0, "passed": 60, "total": 60}
        if tree is not None:
            results["as_filed"] = {"catalogue": tree}
        return next(x for x in judge(results) if x.figure.startswith("catalogue as filed"))

    whole = {"seconds": 20.0, "exit": 0, "passed": 60, "total": 60}
    assert row(whole).met is True and "0.50 of it" in row(whole).measured
    assert row(whole, seconds=21.0).met is False and row(whole).target.startswith("<= 1.0 of the tree")
    # The tree's own replay failed: no ratio to judge on, so the loops are (10 s of SAMPLE's 0.5 s loop).
    broken = row({**whole, "exit": 1, "passed": 59})
    assert broken.met is True and "loops" in broken.target and "59/60 passed" in broken.measured
    assert row(None).target.startswith("<= 54 loops")
