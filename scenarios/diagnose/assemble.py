"""A diagnosis written as a ticket folder (scenarios/diagnose/ticket.py holds its shape): the customer's
world as the diagnosis replayed it (their DNS as their CoreDNS answers), their Secrets as stand-ins minted
into the folder, the calls that failed for them, and the fix."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scenarios.bundle.records import replayed_dns
from scenarios.bundle.scenario import Secrets, default_frontend, replay_secrets
from scenarios.diagnose.diagnosis import Diagnosis
from scenarios.diagnose.plan import brought_certificates
from scenarios.diagnose.profiles import CURRENT, parse_label
from scenarios.diagnose.refusal import RenderFix, render_fix
from scenarios.diagnose.ticket import PEM, Ticket, check_new, scenario, ticket_paths, write
from sim.errors import ConfigError
from sim.model.values import deep_merge, nested, proxy_settings


def write_ticket(
    d: Diagnosis, path: Path, ticket_id: str | None = None, now: datetime | None = None
) -> list[Path]:
    """The ticket folder for `d`'s findings: the scenario at `path`, the values and Secrets beside it."""
    if not d.findings:
        raise ConfigError("no finding to write a ticket for")
    check_new(path)
    ranked = d.ranked()
    label = d.probe_of.get(ranked[0].cause.id, f"{CURRENT}:system")
    render = render_fix(d.values, d.refused) if d.refused else None
    deployed = render.values if isinstance(render, RenderFix) else d.values  # what the ticket's stack runs
    settings = proxy_settings(deployed)
    secrets = None if d.refused and not isinstance(render, RenderFix) else _secrets(d, deployed, path, now)
    values = d.values
    if secrets is not None and secrets.pem is not None:
        values = deep_merge(values, nested(PEM, secrets.pem))
        if isinstance(render, RenderFix):
            render = replace(render, values=deep_merge(render.values, nested(PEM, secrets.pem)))
    standins = {n for n, s in (secrets.declared if secrets else {}).items() if "source" in s}
    fails, works = _failed(dict(d.arrived.get(label, ())))
    ticket = Ticket(
        findings=ranked,
        values=values,
        workers=parse_label(label).worker_group(2),
        cluster=_cluster(d, deployed),
        secrets=secrets.declared if secrets else {},
        renewed=secrets.renewed if secrets else {},
        frontend_secret=settings.frontend_secret,
        rotate_renews=default_frontend(settings.frontend_secret) and settings.frontend_secret not in standins,
        private_ca_pem=secrets.standin_ca if secrets else None,
        refusal=d.refusal,
        render=render,
        ticket_id=ticket_id,
        fails=fails,
        works=works,
    )
    bundle = f" --bundle {d.bundle}" if d.bundle else ""
    header = [f"written by ncpsim diagnose{bundle}; replay: ncpsim replay scenario={path.name}"]
    return write(path, scenario(ticket), d.values, header)


def _failed(arrived: dict[str, bool]) -> tuple[str, tuple[str, ...]]:
    """(the function whose callbacks failed, HTTP's first; HTTP when its callbacks arrived while gRPC's
    failed, as with a record for invocation.<workerDomain> alone: the ticket shows that first)."""
    failed = [f for f in ("http-echo", "grpc-echo") if arrived.get(f) is False]
    fails = (failed or ["http-echo"])[0]
    return fails, ("http-echo",) if fails == "grpc-echo" and arrived.get("http-echo") else ()


def _cluster(d: Diagnosis, values: dict[str, Any]) -> dict[str, Any]:
    """The compute cluster's DNS as the customer has it: `--rewrite`, or the bundle's first cluster."""
    if d.rewrite is not None:
        return {"dnsRewrite": d.rewrite.to_topology()}
    if d.world is not None and d.world.compute:
        domain = proxy_settings(values).worker_domain
        return dict(replayed_dns(d.world.compute[0], domain, d.world.service).cluster(domain))
    return {}


def _secrets(d: Diagnosis, values: dict[str, Any], path: Path, now: datetime | None) -> Secrets | None:
    """The frontend Secret as the customer holds it, its stand-ins minted into the ticket's folder."""
    certificates = {**(d.world.certificates if d.world else {}), **brought_certificates(d.secrets)}
    if not certificates:
        return None
    settings = proxy_settings(values)
    private = frozenset(
        {settings.frontend_secret} if any(f.cause.id == "frontend-private-ca" for f in d.findings) else ()
    )
    folder = ticket_paths(path)[2]
    folder.mkdir(mode=0o700)  # new: check_new refused an existing one, and mkdir follows no link
    secrets = replay_secrets(certificates, values, folder, now or datetime.now(UTC), path.parent, private)
    with contextlib.suppress(OSError):
        folder.rmdir()  # nothing minted into it: no folder
    return secrets
