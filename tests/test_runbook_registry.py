"""The engine hook: ``sim.runbooks.run(name, variant, state_dir)`` for every registered runbook."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from sim import runbooks
from sim.errors import ScenarioError
from sim.model.events import of_kind, read_events

Rehearse = Callable[[str, str], runbooks.RunbookReport]


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory: pytest.TempPathFactory) -> Rehearse:
    """Each runbook's rehearsal, right and wrong, run once for the module's tests that read it (nats-log-sampling
    signs 300 workers in on a real nats-server, each way)."""

    @functools.cache
    def rehearse(name: str, variant: str) -> runbooks.RunbookReport:
        return runbooks.run(name, variant, tmp_path_factory.mktemp(f"{name}-{variant}"))

    return rehearse


@pytest.mark.parametrize("name", sorted(runbooks.RUNBOOKS))
def test_every_runbook_right_passes_and_wrong_names_mistake_and_fix(name: str, rehearsed: Rehearse) -> None:
    right, wrong = rehearsed(name, "right"), rehearsed(name, "wrong")
    assert (right.ok, right.outcome, right.mistake, right.fix_step) == (True, "success", None, None)
    assert (wrong.ok, wrong.outcome) == (False, "failure")
    assert wrong.mistake and wrong.fix_step and wrong.name == name
    assert wrong.as_dict()["mistake"] == wrong.mistake and "mistake:" in wrong.summary()


def test_log_sampling_logs_every_sign_in_only_once_sampling_is_off(rehearsed: Rehearse) -> None:
    wrong, right = rehearsed("nats-log-sampling", "wrong"), rehearsed("nats-log-sampling", "right")
    assert wrong.extra["logged"] == 102 and "198 of 300" in (wrong.mistake or "")
    assert right.ok and right.extra["logged"] == 300
    assert sum('"Sending webhook request"' in line for line in right.log_lines) == 300


def test_unknown_name_and_variant() -> None:
    with pytest.raises(ScenarioError, match="unknown name"):
        runbooks.run("nope", "right", None)
    with pytest.raises(ScenarioError, match="right or wrong"):
        runbooks.run("nats-values", "sideways", None)


def test_failed_report_must_explain_itself() -> None:
    with pytest.raises(ValueError, match="mistake and a fix step"):
        runbooks.RunbookReport("x", "wrong", (), {}, False)


def test_run_records_an_event(tmp_path: Path) -> None:
    report = runbooks.run("ess-mek-rotation", "wrong", tmp_path)
    [event] = of_kind(read_events(tmp_path), "runbook", name="ess-mek-rotation")
    assert event["outcome"] == "failure" and event["mistake"] == report.mistake
    assert event["fix_step"] == report.fix_step


CATALOGUE = Path(__file__).resolve().parents[1] / "scenarios" / "catalogue"


def runbook_scenarios() -> list[Path]:
    return sorted(p for p in CATALOGUE.glob("*.yaml") if "runbook:" in p.read_text())


def test_catalogue_has_a_right_and_a_wrong_scenario_per_runbook() -> None:
    names = {p.stem for p in runbook_scenarios()}
    pairs = {f"{n}-{v}" for n in runbooks.RUNBOOKS for v in runbooks.VARIANTS}
    assert pairs <= names
    for extra in sorted(names - pairs):  # the others replay a customer's values on a runbook
        assert "values:" in (CATALOGUE / f"{extra}.yaml").read_text(), extra


@pytest.mark.parametrize("path", runbook_scenarios(), ids=lambda p: p.stem)
def test_catalogue_scenarios_pass_through_the_replay_engine(path: Path, tmp_path: Path) -> None:
    """Each runbook scenario replays through the same engine as the callback scenarios, and passes."""
    from clusters.local import LocalBackend
    from scenarios.engine import run_scenario
    from scenarios.load import load_scenario

    scenario = load_scenario(str(path))
    assert scenario.name == path.stem and scenario.stackless
    result = run_scenario(scenario, LocalBackend(tmp_path), "runbook")
    assert result.ok, result.failures
    for step in result.steps:
        failed = step.step.expect is not None and step.step.expect.outcome == "failure"
        assert failed is path.stem.endswith("-wrong") or "values:" in path.read_text()
        assert ("fix:" in step.note) is failed, step.note  # a failed rehearsal names the fixing step
