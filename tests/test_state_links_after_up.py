"""Links planted in a stack folder after `up` checked it: the later writes refuse them too (issue 16, 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.engine import write_artifacts
from scenarios.load import load_scenario
from scenarios.result import ScenarioResult
from sim.errors import ConfigError
from sim.model.netmap import NetMap


def test_a_planted_netmap_tmp_link_is_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    state = tmp_path / "stack"
    state.mkdir()
    (state / "netmap.tmp").symlink_to(victim)
    NetMap(bindings={"10.42.0.11:8443/tcp": 4000}).save(state / "netmap.json")
    assert victim.read_text() == "precious"
    assert not (state / "netmap.json").is_symlink() and "4000" in (state / "netmap.json").read_text()


@pytest.mark.parametrize("planted", ["reports", "reports/report.json", "reports/sequence.html"])
def test_a_planted_report_link_is_refused(tmp_path: Path, planted: str) -> None:
    victim = tmp_path / "victim"
    victim.mkdir() if planted == "reports" else victim.write_text("precious")
    state = tmp_path / "stack"
    (state / "reports").mkdir(parents=True) if planted != "reports" else state.mkdir()
    (state / planted).symlink_to(victim)
    result = ScenarioResult(load_scenario("http-callback"))
    with pytest.raises(ConfigError, match="symbolic link"):
        write_artifacts(result, state)
    assert (victim.is_dir() and not list(victim.iterdir())) or victim.read_text() == "precious"
