"""A diagnosis as its user reads it: the findings ranked, each with its evidence, seed section and fix;
what ncpsim assumed; the what-ifs; and, with no finding, what was still never checked."""

from __future__ import annotations

from collections.abc import Sequence

from scenarios.diagnose.causes import CAUSES
from scenarios.diagnose.diagnosis import Diagnosis
from sim.model.assumptions import ISSUER, SECRET, Assumption

UNSEEN = (
    "the frontend certificate is unknown: the probes met a stand-in, not the customer's own, so its names, "
    "issuer and expiry were never checked"
)


def unseen_certificate(assumed: Sequence[Assumption]) -> bool:
    """Callbacks that arrived through a stand-in frontend certificate say nothing of the customer's own."""
    return any(a.kind in (SECRET, ISSUER) for a in assumed)


def text(d: Diagnosis) -> str:
    probed = (
        f"probe workers: {', '.join(d.probes)}" if d.probes else "no probe: a refused render deploys nothing"
    )
    lines = [f"ncpsim diagnose: {len(d.findings)} finding(s) in {d.seconds:.1f}s ({probed})"]
    if d.bundle:
        lines.append(f"bundle: {d.bundle} (evidence cites its files and lines)")
    lines += [f"warning: {w}" for w in d.warnings]
    lines += d.not_modelled + [str(a) for a in d.assumed]
    if d.symptom:
        named = ", ".join(d.symptom_causes) or "no documented cause matches"
        lines.append(f"symptom {d.symptom!r}: {named}")
    for n, f in enumerate(d.ranked(), start=1):
        lines.append(f"{n}. [{f.cause.severity}] {f.cause.id}: {f.cause.title}")
        lines += [f"   observed: {e}" for e in f.evidence]
        lines.append(f"   seed: {f.cause.section}")
        lines.append(f"   fix: {f.cause.fix}")
    for f in d.what_ifs:
        lines.append(
            f"what if: {f.cause.title} ({f.cause.id}): {'; '.join(f.evidence)}; if such workers run: "
            f"{f.cause.fix}"
        )
    lines += [f"note: {n}" for n in d.notes]
    if not d.findings:
        lines.append("no findings: the current workers' callbacks arrived")
        if unseen_certificate(d.assumed):
            lines.append(f"but {UNSEEN}")
        if d.symptom_causes:
            lines.append("the symptom's documented causes, most likely first:")
            lines += [
                f"  - {CAUSES[c].id}: {CAUSES[c].title} (fix: {CAUSES[c].fix})" for c in d.symptom_causes
            ]
    return "\n".join(lines)
