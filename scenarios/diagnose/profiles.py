"""Probe workers: the worker-utils profiles a diagnosis calls back with, written VERSION:TRUST[:FLAG...]
(`--workers 1.2.9:system,1.4.0:stack:before-pem`), and the ones a customer's values make worth asking
about when the user names none (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scenarios.diagnose.judge import World
from sim.errors import ConfigError

CURRENT, LEGACY = "1.4.0", "1.2.9"  # worker-utils: forward-proxy callbacks from 1.3.2 on
BEFORE_PEM = "before-pem"  # the pod was created before workerCallbackCaPem was set (no NVCF_PROXY_CA_PEM)
NO_NATS_ACCOUNT = "no-nats-account"  # a worker-utils image that does not read NVCF_NATS_ACCOUNT
FLAGS = (BEFORE_PEM, NO_NATS_ACCOUNT)


@dataclass(frozen=True)
class Profile:
    worker_utils: str
    trust: str  # "system": system roots plus NVCF_PROXY_CA_PEM as the values give it; "stack": CA baked in
    flags: tuple[str, ...] = ()  # of FLAGS
    what_if: bool = False  # a default probe asking "what if such workers run?": its findings are notes

    @property
    def label(self) -> str:
        return ":".join((self.worker_utils, self.trust, *self.flags))

    def describe(self) -> str:
        """How a progress line names it: `worker-utils 1.4.0, system roots, before-pem`."""
        trust = "system roots" if self.trust == "system" else "the stack CA baked in"
        return ", ".join((f"worker-utils {self.worker_utils}", trust, *self.flags))

    def worker_group(self, count: int) -> dict[str, Any]:
        """The scenario file's worker group for this profile."""
        group: dict[str, Any] = {"count": count, "trust": self.trust, "workerUtils": self.worker_utils}
        if BEFORE_PEM in self.flags:
            group["createdBeforePem"] = True
        if NO_NATS_ACCOUNT in self.flags:
            group["readsNatsAccount"] = False
        return group


def parse_workers(spec: str) -> list[Profile]:
    """`1.2.9:system,1.4.0:stack:before-pem` -> profiles; a one-line error otherwise."""
    profiles = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        version, _, rest = item.partition(":")
        trust, *flags = rest.split(":")
        if (
            trust not in ("stack", "system")
            or not all(p.isdigit() for p in version.split("."))
            or any(f not in FLAGS for f in flags)
        ):
            raise ConfigError(
                f"--workers {item!r}: write VERSION:TRUST[:FLAG...], e.g. 1.2.9:system,1.4.0:stack "
                f"(trust is stack or system; flags: {', '.join(FLAGS)})"
            )
        profiles.append(Profile(version, trust, tuple(dict.fromkeys(flags))))
    return profiles


def parse_label(label: str) -> Profile:
    """A probe worker's label (VERSION:TRUST[:FLAG...]) back into its profile."""
    return parse_workers(label)[0]


def default_profiles(world: World) -> list[Profile]:
    """A function pod as NVCA starts it (system roots plus NVCF_PROXY_CA_PEM when the values give one),
    with current worker-utils; then the what-ifs the values make worth asking: a worker-utils older than
    1.3.2, a pod created before the PEM was set, an image that does not read NVCF_NATS_ACCOUNT."""
    profiles = [Profile(CURRENT, "system"), Profile(LEGACY, "system", what_if=True)]
    if world.pem_set:
        profiles.append(Profile(CURRENT, "system", (BEFORE_PEM,), what_if=True))
    if world.worker_auth == "token":
        profiles.append(Profile(CURRENT, "system", (NO_NATS_ACCOUNT,), what_if=True))
    return profiles
