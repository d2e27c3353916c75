"""What the customer told, as the diagnosis reads it: their values layered as Helm layers them (keeping
what they set apart from the chart's defaults), what their compute cluster's DNS holds (`--rewrite`),
and the World the judge weighs observations against (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scenarios.bundle.world import BundleWorld
from scenarios.diagnose.judge import Finding, World
from sim.errors import ConfigError
from sim.model.layering import DEFAULT, Layered, defaults_layer, layer, parse_set
from sim.model.values import key_path, lookup, proxy_settings
from sim.model.values_file import file_layer


@dataclass(frozen=True)
class Rewrite:
    """What the customer's compute-cluster DNS holds for callbacks: `--rewrite DOMAIN=TARGET`, where TARGET
    is `proxy` (the proxy Service's address), an IPv4 address, a DNS name looked up instead, or `none`."""

    domain: str | None  # None: the values' workerDomain
    target: str

    @property
    def to_name(self) -> bool:
        """A rewrite to a name (the make target's), which the compute cluster must resolve itself."""
        return self.target not in ("proxy", "none") and not all(p.isdigit() for p in self.target.split("."))

    def to_topology(self) -> dict[str, Any]:
        return {"target": self.target, **({"domain": self.domain} if self.domain else {})}


def parse_rewrite(spec: str) -> Rewrite:
    domain, sep, target = spec.partition("=")
    if spec.strip() == "none":
        return Rewrite(None, "none")
    if not sep or not domain or not target:
        raise ConfigError(
            f"--rewrite {spec!r}: write DOMAIN=TARGET (TARGET: proxy, none, an IPv4 address or a DNS name), or none"
        )
    return Rewrite(domain.strip().lstrip("*.").rstrip("."), target.strip())


def customer_values(files: Sequence[Path], sets: Sequence[str], world: BundleWorld | None = None) -> Layered:
    """Defaults < the bundle's environment.yaml < each -f file < --set, as Helm layers them."""
    bundled = [world.values] if world is not None and world.values is not None else []
    return layer([defaults_layer(), *bundled, *(file_layer(f) for f in files), *(parse_set(s) for s in sets)])


def customer_only(layered: Layered) -> dict[str, Any]:
    """The keys the customer's files and --set gave, with their merged values (for a ticket). Walked as key
    parts, never split on dots: `service.annotations."service.beta.kubernetes.io/aws-load-balancer-internal"`
    is one key under annotations, as the customer wrote it."""
    return _given(layered.values, (), layered)


def _given(values: dict[str, Any], parts: tuple[str, ...], layered: Layered) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        here = (*parts, str(key))
        origin = layered.origins.get(key_path(here))
        if isinstance(value, dict) and value:
            below = _given(value, here, layered)
            if below:
                out[key] = below
            elif origin is not None and origin.kind != DEFAULT and not _defaults_under(here, layered):
                out[key] = value  # a mapping set whole, its keys the customer's own
        elif origin is not None and origin.kind != DEFAULT:
            out[key] = value
    return out


def _defaults_under(parts: tuple[str, ...], layered: Layered) -> bool:
    prefix = key_path(parts)
    return any(p.startswith(prefix) and o.kind == DEFAULT for p, o in layered.origins.items() if p != prefix)


def world_of(values: dict[str, Any], dns: Rewrite | None = None, facts: Sequence[Finding] = ()) -> World:
    settings = proxy_settings(values)
    other_domain = bool(dns and dns.domain and dns.domain != settings.worker_domain) or any(
        f.cause.id == "rewrite-wrong-domain" for f in facts
    )
    said = {f.cause.id for f in facts}
    return World(
        proxy_enabled=settings.enabled,
        rewrite_other_domain=other_domain,
        lb_pending="proxy-lb-pending" in said,
        rewrite_to_name=(dns is not None and dns.to_name) or "rewrite-target-unresolved" in said,
        service_type=str(lookup(values, ("workerCallbackProxy", "service", "type"), "LoadBalancer")),
        frontend="stack" if settings.frontend_issuer == "stack" else "brought",
        pem_set=settings.worker_ca_pem_set,
        connect_enabled=settings.connect_enabled,
        worker_auth=str(lookup(values, ("nats", "workerAuth"), "nkey")),
        upstream_tls=settings.upstream_tls,
        pod_worker_tls=settings.pod_worker_tls,
    )
