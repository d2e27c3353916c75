"""`ncpsim diagnose`: what the customer sent judged first (facts.py), their world probed (probe.py), and
every finding ranked, with what ncpsim assumed on the way (one list: what the probe stacks played in the
customer's place, and what the customer's files could not show)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from clusters.interrupts import InterruptGuard
from scenarios.bundle.archive import read_bundle
from scenarios.bundle.world import BundleWorld, read_world
from scenarios.diagnose.causes import BLOCKING
from scenarios.diagnose.customer import Rewrite, customer_only, customer_values, parse_rewrite, world_of
from scenarios.diagnose.facts import Customer, judge_facts
from scenarios.diagnose.judge import Finding, RenderIssue, World, cause_of, judge
from scenarios.diagnose.plan import Probe, brought_certificates, bundle_probes
from scenarios.diagnose.probe import Probed, observe
from scenarios.diagnose.profiles import Profile, default_profiles, parse_label, parse_workers
from scenarios.diagnose.refusal import RenderFix, render_fix
from scenarios.diagnose.symptoms import rank
from sim.model.assumptions import Assumption
from sim.model.values_check import validate


@dataclass
class Diagnosis:
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)
    symptom: str | None = None
    symptom_causes: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    what_ifs: list[Finding] = field(default_factory=list)  # what only the default what-if probes hit
    probe_of: dict[str, str] = field(default_factory=dict)  # cause id -> the first probe worker that hit it
    # probe worker -> (function, every call of it arrived): a ticket replays the calls that failed
    arrived: dict[str, tuple[tuple[str, bool], ...]] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)  # what the customer set (no chart defaults)
    refused: list[RenderIssue] = field(default_factory=list)  # what the render refused, first the first
    # Everything ncpsim filled in, each with how to bring the real thing: the probe stacks' stand-ins
    # (sim.model.assumptions) and what the customer's files leave open (a forwarded DNS answer, a Secret's
    # key, where the NVCF API runs). One list: both are gaps ncpsim filled, and a user reads them alike.
    assumed: list[Assumption] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the files show beside the findings
    not_modelled: list[str] = field(default_factory=list)  # values keys accepted, not modelled
    seconds: float = 0.0
    bundle: str | None = None
    world: BundleWorld | None = None  # the bundle's facts (a ticket replays them)
    rewrite: Rewrite | None = None
    secrets: tuple[str, ...] = ()  # --secret NAME=DIR

    @property
    def refusal(self) -> str | None:
        """The first render refusal's message."""
        return self.refused[0].message if self.refused else None

    def ranked(self) -> list[Finding]:
        """Findings whose cause the symptom names come first, in the symptom table's order; then the most
        blocking (causes.BLOCKING: the order a callback meets them), errors before warnings."""
        order = {c: i for i, c in enumerate(self.symptom_causes)}
        blocking = {c: i for i, c in enumerate(BLOCKING)}
        return sorted(
            self.findings,
            key=lambda f: (
                order.get(f.cause.id, len(order)),
                f.cause.severity != "error",
                blocking.get(f.cause.id, len(blocking)),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_json() for f in self.ranked()],
            "warnings": self.warnings,
            "symptom": self.symptom,
            "symptomCauses": self.symptom_causes,
            "probes": self.probes,
            "whatIfs": [f.to_json() for f in self.what_ifs],
            "assumed": [a.to_json() for a in self.assumed],
            "notes": self.notes,
            "notModelled": self.not_modelled,
            "bundle": self.bundle,
            "seconds": round(self.seconds, 2),
        }


def diagnose(
    files: Sequence[Path],
    sets: Sequence[str] = (),
    symptom: str | None = None,
    workers: str | None = None,
    root: Path | None = None,
    rewrite: str | None = None,
    secrets: Sequence[str] = (),
    bundle: Path | None = None,
    now: datetime | None = None,
    progress: TextIO | None = None,
    guard: InterruptGuard | None = None,
) -> Diagnosis:
    """The customer's files judged, their world probed on the local backend, every finding ranked. A
    `progress` terminal shows which probe runs (nothing is written to it when it is a pipe)."""
    started, now = time.monotonic(), now or datetime.now(UTC)
    bundled = read_world(read_bundle(bundle)) if bundle is not None else None
    layered = customer_values(files, sets, bundled)
    issues = [
        RenderIssue(i.path, i.message, f"{i.file}:{i.line}" if i.file else "")
        for i in validate(layered.values, layered.locations())
    ]
    dns = parse_rewrite(rewrite) if rewrite else None
    certificates = {**(bundled.certificates if bundled else {}), **brought_certificates(secrets)}
    # A refused render deploys nothing, yet its values' other facts hold: judged on the values as the
    # render's fix would make them, so two problems give two findings, the refusal first.
    fixed = render_fix(layered.values, issues) if issues else None
    judged = fixed.values if isinstance(fixed, RenderFix) else None if issues else layered.values
    customer = Customer(judged or {}, layered.locations(), now, certificates, bundled, symptom)
    facts, notes, assumed = judge_facts(customer) if judged is not None else ([], [], [])
    world = world_of(layered.values, dns, facts) if not issues else World(proxy_enabled=False)
    with tempfile.TemporaryDirectory(prefix="ncpsim-diagnose-") as scratch:  # stand-in Secrets, probe stacks
        probes: list[Probe] = []
        profiles: list[Profile] = []
        if bundled is not None and not issues:
            labels = [p.label for p in parse_workers(workers)] if workers else []
            args = (customer_only(layered), layered.values, Path(scratch), now, labels)
            probes, said = bundle_probes(bundled, *args)
            assumed += said
            profiles = [parse_label(p.label) for p in probes]
        elif not issues:
            profiles = parse_workers(workers) if workers else default_profiles(world)
            compute = {"dnsRewrite": dns.to_topology()} if dns else {}
            probes = [Probe(p.label, layered.values, compute, brought=tuple(secrets)) for p in profiles]
        probed = observe(probes, root, Path(scratch), progress, guard) if probes else []
    result = _ranked(facts, issues, probed, world, symptom, profiles)
    result.warnings = [str(u) for u in layered.unknown]
    result.values, result.refused = customer_only(layered), issues
    result.not_modelled = [str(a) for a in layered.accepted]
    ran = [a for p in probed for a in p.assumed]
    result.assumed = list(dict.fromkeys([*assumed, *sorted(ran, key=lambda a: not a.from_input)]))
    result.notes, result.bundle, result.world = notes, str(bundle) if bundle else None, bundled
    result.rewrite, result.secrets = dns, tuple(secrets)
    result.arrived = {p.label: done.arrived for p, done in zip(profiles, probed, strict=True)}
    result.seconds = time.monotonic() - started
    return result


def _ranked(
    facts: list[Finding],
    issues: list[RenderIssue],
    probed: list[Probed],
    world: World,
    symptom: str | None,
    profiles: list[Profile],
) -> Diagnosis:
    """The findings, less what only a what-if probe hit ("what if some workers are old, or predate the
    PEM?"): that is a what-if, unless the symptom points at it (with --workers, the user said they run)."""
    observations = [o for p in probed for o in p.observations]
    findings = merge(facts, judge(issues, observations, world))
    named = [c.id for c in rank(symptom)] if symptom else []
    what_if = {p.label for p in profiles if p.what_if}
    hit_by: dict[str, list[str]] = {}  # cause id -> the probe workers that hit it, in probe order
    for obs in observations:
        cause = cause_of(obs, world)
        if cause is not None:
            hit_by.setdefault(cause, []).append(obs.probe)
    what_ifs = [
        f
        for f in findings
        if f.cause.id not in named and f.cause.id in hit_by and set(hit_by[f.cause.id]) <= what_if
    ]
    return Diagnosis(
        [f for f in findings if f not in what_ifs],
        symptom=symptom,
        symptom_causes=named,
        probes=[p.label for p in profiles],
        what_ifs=what_ifs,
        probe_of={cause: labels[0] for cause, labels in hit_by.items()},
    )


def merge(facts: list[Finding], observed: list[Finding]) -> list[Finding]:
    """One finding per cause: what the files show, then what the probes saw."""
    evidence: dict[str, list[str]] = {}
    causes = {}
    for finding in (*facts, *observed):
        causes[finding.cause.id] = finding.cause
        evidence.setdefault(finding.cause.id, []).extend(
            e for e in finding.evidence if e not in evidence.get(finding.cause.id, [])
        )
    return [Finding(causes[c], tuple(ev)) for c, ev in evidence.items()]
