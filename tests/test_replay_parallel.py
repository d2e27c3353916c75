"""`ncpsim replay --jobs N`: stacks side by side, each isolated, reports in catalogue order, none left."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from clusters.local.launcher import Launcher
from scenarios.load import load_scenario
from scenarios.replay import jobs_arg, replay_all
from sim.errors import ConfigError

NAMES = ["http-callback", "grpc-callback", "wrong-path"]


def test_parallel_replays_pass_in_order_and_leave_nothing_running(tmp_path: Path) -> None:
    out = io.StringIO()
    results, _ = replay_all([load_scenario(n) for n in NAMES], root=tmp_path, out=out, jobs=2)
    assert [r.scenario.name for r in results] == NAMES
    assert all(r.ok for r in results), [r.failures for r in results]
    text = out.getvalue()
    assert [text.index(f"PASS {n}") for n in NAMES] == sorted(text.index(f"PASS {n}") for n in NAMES)
    assert "3/3 scenarios passed" in text and "(2 at a time)" in text
    ports = set()
    for folder in tmp_path.iterdir():
        assert Launcher(folder).running() == {}, folder
        ports.add((folder / "netmap.json").read_text())
    assert len(ports) == len(NAMES)  # each stack had its own bindings


@pytest.mark.parametrize(("given", "jobs"), [(None, 1), ("1", 1), ("3", 3), (2, 2)])
def test_jobs_argument(given: object, jobs: int) -> None:
    assert jobs_arg(given) == jobs  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["0", "-1", "many"])
def test_bad_jobs_argument_is_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match="--jobs"):
        jobs_arg(bad)
