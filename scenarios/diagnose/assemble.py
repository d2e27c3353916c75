"""A diagnosis written as a ticket folder (scenarios/diagnose/ticket.py holds its shape): the customer's
world as the diagnosis replayed it, their Secrets as stand-ins minted into the folder, and the fix."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path

from scenarios.bundle.scenario import default_frontend, dns_rewrite, replay_secrets
from scenarios.bundle.standin import STANDIN_NOTE
from scenarios.diagnose.plan import brought_certificates
from scenarios.diagnose.probe import CURRENT, Diagnosis, parse_label
from scenarios.diagnose.ticket import PEM, Ticket, check_new, scenario, ticket_paths, write
from sim.errors import ConfigError
from sim.model.values import deep_merge, proxy_settings


def _nested(value: str) -> dict:
    out: dict = {PEM[-1]: value}
    for part in reversed(PEM[:-1]):
        out = {part: out}
    return out


def write_ticket(
    d: Diagnosis, path: Path, ticket_id: str | None = None, now: datetime | None = None
) -> list[Path]:
    """The ticket folder for `d`'s findings: the scenario at `path`, the values and Secrets beside it."""
    if not d.findings:
        raise ConfigError("no finding to write a ticket for")
    check_new(path)
    ranked = d.ranked()
    probe = parse_label(d.probe_of.get(ranked[0].cause.id, f"{CURRENT}:system"))
    settings = proxy_settings(d.values)
    cluster, notes = {}, list(d.assumed)
    if d.rewrite is not None:
        cluster = {"dnsRewrite": d.rewrite.to_topology()}
    elif d.world is not None and d.world.compute:
        rewrite, said = dns_rewrite(d.world.compute[0], settings.worker_domain, d.world.service)
        cluster, notes = {"dnsRewrite": rewrite}, notes + said
    certificates = {**(d.world.certificates if d.world else {}), **brought_certificates(d.secrets)}
    folder = ticket_paths(path)[2]
    private = frozenset(
        {settings.frontend_secret} if any(f.cause.id == "frontend-private-ca" for f in ranked) else ()
    )
    values = d.values
    secrets = None
    if certificates and not d.refusal:
        folder.mkdir(mode=0o700)  # new: check_new refused an existing one, and mkdir follows no link
        secrets = replay_secrets(
            certificates, d.values, folder, now or datetime.now(UTC), path.parent, private
        )
        with contextlib.suppress(OSError):
            folder.rmdir()  # nothing minted into it: no folder
        if secrets.pem is not None:
            values = deep_merge(values, _nested(secrets.pem))
        notes += [*secrets.notes, STANDIN_NOTE] if secrets.declared else []
    standins = {n for n, s in (secrets.declared if secrets else {}).items() if "source" in s}
    ticket = Ticket(
        findings=ranked,
        values=values,
        workers=probe.worker_group(2),
        cluster=cluster,
        secrets=secrets.declared if secrets else {},
        renewed=secrets.renewed if secrets else {},
        frontend_secret=settings.frontend_secret,
        rotate_renews=default_frontend(settings.frontend_secret) and settings.frontend_secret not in standins,
        private_ca_pem=secrets.standin_ca if secrets else None,
        refusal=d.refusal,
        ticket_id=ticket_id,
    )
    header = [
        f"written by ncpsim diagnose{f' --bundle {d.bundle}' if d.bundle else ''}; replay: ncpsim replay scenario={path.name}"
    ]
    return write(path, scenario(ticket), d.values, header)
