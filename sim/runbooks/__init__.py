"""Control-plane runbooks as rehearsals: each named run performs a runbook "right" or "wrong" against a
simulated part of the stack and returns a ``RunbookReport`` (steps, end state, and for a wrong run the
mistake and the step that fixes it).

The scenario engine's hook is ``run(name, variant, state_dir, given)``: `given` holds the customer's layered
values and the install (sim.runbooks.given); a rehearsal uses the keys its runbook reads and the report
names, in one line, the ones it could not use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.errors import ScenarioError
from sim.model.events import EventLog
from sim.runbooks import admin_runs, ess_runs, nats_runs, service_runs
from sim.runbooks.given import NO_VALUES, Given
from sim.runbooks.report import RIGHT, VARIANTS, WRONG, Reads, RunbookReport

Runner = Callable[[str, Path | None, Given], RunbookReport]

RUNBOOKS: dict[str, Runner] = {
    **nats_runs.RUNS,
    **admin_runs.RUNS,
    **ess_runs.RUNS,
    **service_runs.RUNS,
}
READS: dict[str, Reads] = {**nats_runs.READS, **admin_runs.READS, **ess_runs.READS, **service_runs.READS}

__all__ = ["READS", "RIGHT", "RUNBOOKS", "VARIANTS", "WRONG", "Given", "RunbookReport", "run"]


def run(name: str, variant: str, state_dir: Path | None = None, given: Given = NO_VALUES) -> RunbookReport:
    """Rehearse runbook ``name`` done ``variant`` ("right" or "wrong") on the customer's values `given`.
    Files (certificates, the CLI's home) go under ``state_dir``/runbooks, or a temporary folder when it
    is None."""
    if name not in RUNBOOKS:
        raise ScenarioError(f"runbook: unknown name {name!r}; choose one of {', '.join(sorted(RUNBOOKS))}")
    if variant not in VARIANTS:
        raise ScenarioError(f"runbook {name}: variant must be right or wrong, found {variant!r}")
    reads = READS[name]
    report = RUNBOOKS[name](variant, state_dir, given)
    unused = given.unused_line(reads.keys, reads.why, reads.install)
    report = report.noting(unused) if unused else report
    if state_dir is not None:
        # One event per rehearsal, so `ncpsim logs` and the engine's event readers see it like any other.
        log = EventLog(Path(state_dir), "runbooks")
        try:
            log.emit("runbook", **report.as_dict())
        finally:
            log.close()
    return report
