"""What a diagnosis assumes: the probe stacks' assumptions, so an unseen certificate reads as unknown.

Callbacks that arrive through a stand-in frontend certificate say nothing of the customer's own: its
names, issuer and expiry were never seen. The probes' topology is rebuilt here, as the probe stacks are
built, and sim.model.assumptions (the one place) says what each fills in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scenarios.secrets import parse_secret_arg
from sim.model.assumptions import ISSUER, SECRET, Assumption, assumptions
from sim.model.topology import ComputeSpec, SecretSpec, WorkerSpec, build

UNSEEN = (
    "the frontend certificate is unknown: the probes met a stand-in, not the customer's own, so its names, "
    "issuer and expiry were never checked"
)


def probe_assumptions(
    values: dict[str, Any], versions: Sequence[str], secrets: Sequence[str] = ()
) -> list[Assumption]:
    """The assumptions of probe stacks of these merged `values`, probe worker-utils `versions` and brought
    `--secret NAME=DIR`s, each once."""
    brought = tuple(SecretSpec(name, source=str(path)) for name, path in map(parse_secret_arg, secrets))
    workers = tuple(WorkerSpec(f"probe-{n}", "", version) for n, version in enumerate(versions))
    topology = build("diagnose", values, compute=(ComputeSpec(workers),), secrets=brought)
    return list(assumptions(topology))


def unseen_certificate(found: Sequence[Assumption]) -> bool:
    return any(a.kind in (SECRET, ISSUER) for a in found)
