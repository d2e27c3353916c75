"""What a replay found: per step, its call traces and failures; per scenario, the verdict and timings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scenarios.spec import Scenario, Step
from scenarios.trace import CallTrace
from sim.model.assumptions import Assumption


@dataclass
class StepResult:
    step: Step
    traces: list[CallTrace] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass(repr=False)
class ScenarioResult:
    scenario: Scenario
    steps: list[StepResult] = field(default_factory=list)
    up_seconds: float = 0.0
    elapsed: float = 0.0
    first_callback_seconds: float | None = None  # from the start of `up` to the first successful callback
    error: str | None = None
    status: dict[str, Any] | None = None
    refused: str | None = None  # error scenarios: the config error the values got, as expected
    artifacts: dict[str, str] = field(default_factory=dict)  # report.json, sequence.mmd, sequence.html
    assumptions: list[Assumption] = field(default_factory=list)  # what the stack filled in (no silent green)

    @property
    def ok(self) -> bool:
        return self.error is None and all(s.ok for s in self.steps)

    @property
    def failures(self) -> list[str]:
        return ([self.error] if self.error else []) + [f for s in self.steps for f in s.failures]

    def __repr__(self) -> str:
        """What a failed `assert result.ok` shows: the verdict and each failure, not the whole dataclass."""
        verdict = "PASS" if self.ok else "FAIL"
        listed = "".join(f"\n  - {failure}" for failure in self.failures)
        return f"<{verdict} {self.scenario.name}{':' if listed else ''}{listed}>"


def to_json(result: ScenarioResult) -> dict[str, Any]:
    layering = result.scenario.layering
    return {
        "scenario": result.scenario.name,
        "summary": result.scenario.summary,
        "ok": result.ok,
        "upSeconds": round(result.up_seconds, 3),
        "elapsedSeconds": round(result.elapsed, 3),
        "firstCallbackSeconds": None
        if result.first_callback_seconds is None
        else round(result.first_callback_seconds, 3),
        "error": result.error,
        "expectError": result.scenario.expect_error,
        "refused": result.refused,
        "artifacts": result.artifacts,
        "overrides": [o.to_json() for o in layering.overrides] if layering else [],
        "warnings": [str(u) for u in layering.unknown] if layering else [],
        "notModelled": [a.to_json() for a in layering.accepted] if layering else [],
        "assumptions": [a.to_json() for a in result.assumptions],
        "steps": [
            {
                "index": s.step.index,
                "name": s.step.name,
                "ok": s.ok,
                "note": s.note,
                "failures": s.failures,
                "calls": [t.to_dict() for t in s.traces],
            }
            for s in result.steps
        ],
    }
