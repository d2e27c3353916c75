"""What ncpsim assumes where the customer's world leaves a gap, as values (pure).

No silent green (DESIGN.md section 4): a passing run must mean the field would pass, so whatever ncpsim
fills in is said, with how to bring the real thing. `assumptions()` is the one place that computes the
list from a Topology and the backend that runs it; `ncpsim status` (clusters.stack.build_status), the
report (scenarios.report) and `ncpsim diagnose` read it, and clusters.certificates mints a stand-in
certificate for exactly the Secret `frontend_stand_in` names.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sim.model.topology import Topology
from sim.model.values import EXISTING_SECRET, ISSUER_REF, lookup, proxy_settings

SECRET, ISSUER, WORKER_UTILS, STAND_IN = "secret", "issuer", "worker-utils", "stand-in"
# What a customer's files leave open (`ncpsim diagnose`, `up/replay --bundle`): a certificate read without
# its key (served as a stand-in with its names, issuer kind and dates), a DNS answer a bundle cannot show
# (a name forwarded to another resolver), where the NVCF API runs.
KEYLESS, DNS, API = "keyless", "dns", "api"
# The worker-utils ncpsim has a profile for: CONNECT tunnels before 1.3.2 (seed, "Callback path and
# CONNECT"), forward-proxy requests from 1.3.2; 1.4.x is the newest it knows (the default, 1.4.0).
MODELLED_WORKER_UTILS = ((1, 0, 0), (1, 5, 0))  # [from, to)
FORWARD_PROXY_FROM = (1, 3, 2)


@dataclass(frozen=True)
class Assumption:
    """One gap ncpsim filled: what it did, and how to bring the real thing."""

    kind: str  # SECRET | ISSUER | WORKER_UTILS | STAND_IN
    what: str
    bring: str

    @property
    def from_input(self) -> bool:
        """Filled because of what the customer's values or topology asked for (not a standing stand-in):
        these are printed on stderr too, before anything starts."""
        return self.kind != STAND_IN

    def __str__(self) -> str:
        return f"assumed: {self.what}; {self.bring}"

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "what": self.what, "bring": self.bring}


def frontend_stand_in(topology: Topology) -> str | None:
    """The Secret `tls.frontend.existingSecret` names when nobody brought it (`--secret NAME=DIR`) and the
    scenario does not declare it (`topology.secrets`): ncpsim serves a certificate of its own there."""
    secret = lookup(topology.values, EXISTING_SECRET)
    if not isinstance(secret, str) or not secret or secret in {s.name for s in topology.secrets}:
        return None
    return secret


def assumptions(topology: Topology, backend: str = "local") -> tuple[Assumption, ...]:
    """Every assumption a stack of `topology` on `backend` makes, those the input caused first."""
    found = [*_frontend(topology), *_worker_utils(topology)]
    if backend == "local" and proxy_settings(topology.values).enabled:
        found.append(
            Assumption(
                STAND_IN,
                "the worker callback proxy is ncpsim's Envoy-faithful stand-in, not Envoy "
                "(workerCallbackProxy.image is not run)",
                "`--backend k3d` runs envoyproxy/envoy from workerCallbackProxy.image",
            )
        )
    found.append(
        Assumption(
            STAND_IN,
            "invocation-service, grpc-proxy and the NVCF API are ncpsim's stand-ins, written from the "
            "public NVCF source (DESIGN.md section 2)",
            "only a real stack (helmfile sync) runs NVIDIA's images: compare with its logs",
        )
    )
    return tuple(found)


def _frontend(topology: Topology) -> list[Assumption]:
    if not proxy_settings(topology.values).enabled:
        return []  # no proxy, no frontend certificate served to anyone
    domain = topology.worker_domain
    secret = frontend_stand_in(topology)
    if secret is not None:
        return [
            Assumption(
                SECRET,
                f"Secret {secret} (workerCallbackProxy.tls.frontend.existingSecret) was not brought: "
                f"a stand-in certificate for *.{domain} from the public-style CA is served",
                f"bring the real one with --secret {secret}=DIR (tls.crt, tls.key[, ca.crt]) "
                f"or declare topology.secrets.{secret} (issuer, names)",
            )
        ]
    ref = lookup(topology.values, ISSUER_REF)
    if isinstance(ref, dict) and lookup(topology.values, EXISTING_SECRET) in (None, ""):
        return [
            Assumption(
                ISSUER,
                f"{_issuer(ref)} (workerCallbackProxy.tls.frontend.certificate.issuerRef) is played by the "
                f"public-style CA, which simulated workers trust as system roots: *.{domain} from it is served",
                "if that issuer is not a public CA, bring what it issued: existingSecret NAME with "
                "--secret NAME=DIR, or declare topology.secrets.NAME with issuer: private",
            )
        ]
    return []


def _issuer(ref: dict[str, Any]) -> str:
    return f"{ref.get('kind') or 'issuer'}/{ref.get('name') or '?'}"


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _worker_utils(topology: Topology) -> list[Assumption]:
    low, high = MODELLED_WORKER_UTILS
    counts = Counter(w.worker_utils for w in topology.workers)
    found = []
    for name, count in sorted(counts.items(), key=lambda item: version(item[0])):
        if low <= version(name) < high:
            continue
        played = "forward-proxy requests" if version(name) >= FORWARD_PROXY_FROM else "CONNECT tunnels"
        found.append(
            Assumption(
                WORKER_UTILS,
                f"worker-utils {name} ({count} worker(s)) is a version ncpsim has no profile for: "
                f"played as {played}, as the nearest version it models",
                "name the version whose behaviour it has (1.0.0 to 1.4.x; CONNECT before 1.3.2) in "
                "workerUtils, or `ncpsim diagnose --workers VERSION:TRUST`",
            )
        )
    return found
