"""The engine hook: ``sim.runbooks.run(name, variant, state_dir)`` for every registered runbook."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import runbooks
from sim.errors import ScenarioError
from sim.model.events import of_kind, read_events


@pytest.mark.parametrize("name", sorted(runbooks.RUNBOOKS))
def test_every_runbook_right_passes_and_wrong_names_mistake_and_fix(name: str, tmp_path: Path) -> None:
    right = runbooks.run(name, "right", tmp_path)
    wrong = runbooks.run(name, "wrong", tmp_path)
    assert (right.ok, right.outcome, right.mistake, right.fix_step) == (True, "success", None, None)
    assert (wrong.ok, wrong.outcome) == (False, "failure")
    assert wrong.mistake and wrong.fix_step and wrong.name == name
    assert wrong.as_dict()["mistake"] == wrong.mistake and "mistake:" in wrong.summary()


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
