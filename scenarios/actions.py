"""Steps that act on the stack rather than call through it: faults, certificate rotation, runbooks."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from certs.rotate import rotate
from certs.store import CertStore
from scenarios.faults import FaultInjector
from scenarios.spec import Step

if TYPE_CHECKING:
    from sim.model.layering import Layered
    from sim.runbooks.report import RunbookReport


async def rotate_step(state_dir: Any, kind: str, worker_domain: str) -> str:
    """Rotate in a thread: the stack keeps serving calls during the rotation's propagation grace."""
    done = await asyncio.to_thread(rotate, CertStore(state_dir / "certs"), kind, worker_domain)
    return f"rotated {kind}: {done}"


async def fault_later(faults: FaultInjector, spec: dict[str, Any], after_ms: int, notes: list[str]) -> None:
    """Fire a fault while the step's calls are in flight (e.g. SIGKILL a pod mid-callback)."""
    await asyncio.sleep(after_ms / 1000)  # the scenario's chosen moment, not a readiness wait
    # In a thread: a fault that takes a while (a rolling restart) must not hold up the calls it runs under.
    notes.append(await asyncio.to_thread(faults.apply, spec) + f" ({after_ms} ms into the calls)")


def judge_runbook(step: Step, report: RunbookReport) -> list[str]:
    """Each broken expectation of a runbook step, naming the step and what the run reported instead."""
    failures = []
    for expect in step.expects:
        if expect.outcome and expect.outcome != report.outcome:
            why = f": {report.mistake} (fix: {report.fix_step})" if report.mistake else ""
            failures.append(
                f"{step.label}: expected outcome {expect.outcome}, but the run ended {report.outcome}{why}"
            )
        if expect.error and expect.error.lower() not in (report.mistake or "").lower():
            failures.append(
                f"{step.label}: expected the mistake to mention {expect.error!r}, "
                f"but it was {report.mistake!r}"
            )
        if expect.fix and expect.fix.lower() not in (report.fix_step or "").lower():
            failures.append(
                f"{step.label}: expected the fix {expect.fix!r}, but the report names {report.fix_step!r}"
            )
    return failures


def runbook_step(step: Step, state_dir: Any, layered: Layered | None = None) -> tuple[str, list[str]]:
    """Rehearse the step's runbook on the values as the step sees them (`Scenario.layered_at`), and the
    install it names (fresh or existing; the runbook's own when unnamed)."""
    # Imported when a runbook step runs: the rehearsals (NATS client, OpenBao and ESS models) are a fifth
    # of what `ncpsim up` imports before it can start a single component, and most scenarios have none.
    from sim.runbooks import Given
    from sim.runbooks import run as run_runbook

    spec = step.runbook or {}
    report = run_runbook(spec["name"], spec["variant"], state_dir, Given.of(layered, spec.get("install")))
    return report.summary(), judge_runbook(step, report)
