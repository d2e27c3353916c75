"""The runbook report: what a rehearsal did, where it ended, and, when it went wrong, why and how to fix it.

Every runbook runner returns one. A "done wrong" rehearsal is a report with ``ok`` false whose ``mistake``
names what the operator did and whose ``fix_step`` names the runbook step that repairs it, so a scenario
can expect both without parsing prose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sim.model.values import KeyPath

RIGHT = "right"
WRONG = "wrong"
VARIANTS = (RIGHT, WRONG)


@dataclass(frozen=True)
class RunbookReport:
    name: str
    variant: str
    steps: tuple[str, ...]  # the steps performed, in order, as the operator would tick them off
    end_state: Mapping[str, Any]
    ok: bool  # the end state is the one the runbook is meant to reach
    mistake: str | None = None
    fix_step: str | None = None
    log_lines: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what the rehearsal could not use of the values it was given, and why

    def __post_init__(self) -> None:
        # A failed rehearsal that cannot say what went wrong is useless to the operator.
        if not self.ok and not (self.mistake and self.fix_step):
            raise ValueError(f"runbook {self.name}: a failed report needs a mistake and a fix step")

    @property
    def outcome(self) -> str:
        return "success" if self.ok else "failure"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "variant": self.variant,
            "outcome": self.outcome,
            "ok": self.ok,
            "steps": list(self.steps),
            "end_state": dict(self.end_state),
            "mistake": self.mistake,
            "fix_step": self.fix_step,
            "log_lines": list(self.log_lines),
            "notes": list(self.notes),
        }

    def noting(self, *notes: str) -> RunbookReport:
        return replace(self, notes=(*self.notes, *notes))

    def summary(self) -> str:
        lines = [f"runbook {self.name} ({self.variant}): {self.outcome}"]
        lines += [f"  step: {step}" for step in self.steps]
        lines += [f"  note: {note}" for note in self.notes]
        if not self.ok:
            lines += [f"  mistake: {self.mistake}", f"  fix: {self.fix_step}"]
        return "\n".join(lines)


@dataclass(frozen=True)
class Reads:
    """The values a runbook rehearses with (key prefixes; whether a fresh install differs), and why it
    cannot use the others: the one line a report carries when the customer's file sets them."""

    keys: tuple[KeyPath, ...] = ()
    install: bool = False
    why: str = "this runbook reads no values"


class Steps:
    """Collects step descriptions while a runner works, so each runner reads as the runbook does."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def __call__(self, text: str) -> None:
        self.done.append(text)

    def as_tuple(self) -> tuple[str, ...]:
        return tuple(self.done)
