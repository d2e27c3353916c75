"""A ticket: a self-contained scenario folder that replays a diagnosis as the customer saw it, then fixes it.

`ncpsim diagnose --write-ticket FILE [--ticket-id ID]` writes FILE (the scenario), `<stem>.values.yaml`
(the customer's values as they set them) and `<stem>.secrets/` (each frontend Secret as ncpsim replays
it: a stand-in key and certificate minted for the customer's names and dates, their own public
certificate beside it; never their key). `ncpsim replay scenario=FILE` shows the failure as the customer
saw it, then a last step that applies the fix of every finding the diagnosis names and passes. Render
refusals become an `expectError` scenario: in the field nothing deploys, so there is nothing to fix on a
running stack. Nothing is overwritten and no link is followed: every file and folder is created anew.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scenarios.diagnose.judge import Finding
from sim.errors import ConfigError
from sim.model.values import deep_merge

PEM = ("global", "nvcaOperator", "agent", "workerCallbackCaPem")
STEP_NAME = 120  # characters: a step name is a line of the report
LB = {"workerCallbackProxy": {"service": {"type": "LoadBalancer"}}}
TO_PROXY = {"target": "proxy"}


@dataclass(frozen=True)
class Fix:
    """What a cause's fix does to the running stack, and what the worker reports before it."""

    values: dict[str, Any] = field(default_factory=dict)  # setValues
    redeploy: str | None = None  # workers | proxy | pods | all
    dns: dict[str, str] | None = None  # the compute clusters' rewrite (a dnsRewrite step)
    renew: bool = False  # the frontend Secret renewed (its -renewed stand-in, or rotate: frontend)
    error: str | None = None  # a substring of what the worker reports before the fix
    rcode: str | None = None  # the DNS answer before the fix
    timeout: float | None = None  # seconds the failing calls wait, when no worker ever takes them


def _nested(parts: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    return dict(out)


STACK_PEM = _nested(PEM, "@stack-ca")
FIXES: dict[str, Fix] = {
    "worker-ca-missing": Fix(STACK_PEM, "workers", error="x509: certificate signed by unknown authority"),
    "worker-ca-stale": Fix(STACK_PEM, "workers", error="x509: certificate signed by unknown authority"),
    # the values are right already: new function pods get NVCF_PROXY_CA_PEM
    "pem-not-redeployed": Fix({}, "workers", error="x509: certificate signed by unknown authority"),
    "legacy-worker-connect-off": Fix(
        {"workerCallbackProxy": {"invocation": {"connect": {"enabled": True}}}},
        "proxy",
        error='request-attach": Not Found',
    ),
    # the listener on again, as the stack would have it with upstream TLS
    "upstream-tls-mismatch": Fix({"invocation": {"workerTls": {"enabled": True}}}, "pods", error="503"),
    # back to the shared NKey, which an older worker-utils can use, until the images are upgraded
    "nats-account-not-read": Fix({"nats": {"workerAuth": "nkey"}}, "workers", timeout=3.0),
    "rewrite-missing": Fix(dns=TO_PROXY, rcode="NXDOMAIN"),
    "rewrite-wrong-domain": Fix(dns=TO_PROXY, rcode="NXDOMAIN"),
    "rewrite-target-unresolved": Fix(dns=TO_PROXY, rcode="NXDOMAIN"),
    "rewrite-wrong-address": Fix(dns=TO_PROXY, rcode="NOERROR"),
    # the Service exposed: a new address, which the compute cluster's record must then name
    "proxy-unreachable": Fix(LB, "proxy", dns=TO_PROXY, error="no route to host"),
    "proxy-lb-pending": Fix(dns=TO_PROXY),
    "proxy-disabled": Fix(
        {"workerCallbackProxy": {"enabled": True, **LB["workerCallbackProxy"]}}, "all", dns=TO_PROXY
    ),
    "frontend-expired": Fix(renew=True, error="expired"),
    "frontend-certificate-names": Fix(renew=True, error="certificate"),
    "frontend-private-ca": Fix(
        redeploy="workers", error="x509: certificate signed by unknown authority"
    ),  # PEM: the stand-in CA
}
REDEPLOYS = ("workers", "proxy", "pods", "all")


@dataclass(frozen=True)
class Ticket:
    """What the diagnosis hands the ticket: the findings, the customer's world as replayed, and its id."""

    findings: Sequence[Finding]
    values: dict[str, Any]  # what the customer set, with stand-in CAs in place of theirs
    workers: dict[str, Any]  # the worker group (the probe worker's profile)
    cluster: dict[str, Any] = field(default_factory=dict)  # the compute cluster's DNS as found
    secrets: dict[str, Any] = field(default_factory=dict)  # topology.secrets, sources relative to the ticket
    renewed: dict[str, Any] = field(default_factory=dict)  # each frontend Secret's renewed stand-in
    frontend_secret: str = ""
    rotate_renews: bool = False  # the frontend Secret is one the stack renews itself (rotate: frontend)
    private_ca_pem: str | None = None  # the stand-in CA workers must be given for a private frontend
    refusal: str | None = None
    ticket_id: str | None = None


def step_name(text: str) -> str:
    """At most STEP_NAME characters, cut at a word, never inside one."""
    if len(text) <= STEP_NAME:
        return text
    return text[: STEP_NAME - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def scenario_name(ticket: Ticket) -> str:
    raw = ticket.ticket_id or ticket.findings[0].cause.id
    slug = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")
    return f"ticket-{slug}" if slug else "ticket"


def combined_fix(ticket: Ticket) -> tuple[Fix, list[str]]:
    """One fix for every finding that has a template, most blocking first; and the causes it leaves."""
    values: dict[str, Any] = {}
    redeploy, dns, renew, left = None, None, False, []
    for finding in ticket.findings:
        fix = FIXES.get(finding.cause.id)
        if fix is None:
            left.append(finding.cause.id)
            continue
        values = deep_merge(values, fix.values)
        if finding.cause.id == "frontend-private-ca" and ticket.private_ca_pem:
            values = deep_merge(values, _nested(PEM, ticket.private_ca_pem))
        if finding.cause.id == "proxy-disabled" and not _pem_given(ticket.values):
            values = deep_merge(
                values, STACK_PEM
            )  # then workers meet the stack-CA frontend: give them the CA
        redeploy = _wider(redeploy, fix.redeploy)
        dns, renew = fix.dns or dns, renew or fix.renew
    return Fix(values, redeploy, dns, renew), left


def _pem_given(values: Mapping[str, Any]) -> bool:
    node: Any = values
    for part in PEM:
        node = node.get(part) if isinstance(node, Mapping) else None
    return isinstance(node, str) and bool(node.strip())


def _wider(a: str | None, b: str | None) -> str | None:
    if a is None or a == b:
        return b
    return a if b is None else "all"


def scenario(ticket: Ticket) -> dict[str, Any]:
    """The ticket's scenario: the failure as the customer saw it, then one step with every fix."""
    top = ticket.findings[0].cause
    fix, left = combined_fix(ticket)
    head: dict[str, Any] = {
        "name": scenario_name(ticket),
        "summary": f"{top.title} (written by ncpsim diagnose)",
        "ticket": "; ".join(
            [
                *([ticket.ticket_id] if ticket.ticket_id else []),
                f"seed {top.section}",
                f"fix: {top.fix}",
                *(f"not fixed by this ticket: {c}" for c in left),
            ]
        ),
        "seed": 1,
        "values": ticket.values,
    }
    if ticket.findings[0].evidence and ticket.findings[0].evidence[0].startswith("render refused: "):
        return {**head, "expectError": ticket.refusal or top.title}
    if top.id not in FIXES:
        raise ConfigError(f"no ticket template for {top.id} yet; write the scenario by hand from the finding")
    before = FIXES[top.id]
    invoke = {"function": "http-echo", "count": 2}
    steps = [
        {
            "name": "as the customer has it",
            "invoke": {**invoke, **({"timeout": before.timeout} if before.timeout else {})},
            "expect": {
                "outcome": "failure",
                **({"error": before.error} if before.error else {}),
                **({"dnsRcode": before.rcode} if before.rcode else {}),
            },
        },
        {
            "name": step_name(f"the fix: {top.fix}"),
            **_fix_actions(fix, ticket),
            "invoke": invoke,
            "expect": {"outcome": "success", "via": "proxy", "samePod": True},
        },
    ]
    topology = {
        "invocationReplicas": 2,
        "grpcProxyReplicas": 0,
        "computeClusters": [{"workers": [ticket.workers], **ticket.cluster}],
    }
    switched = ticket.renewed if fix.renew and not ticket.rotate_renews else {}
    if ticket.secrets or switched:
        topology["secrets"] = {**ticket.secrets, **switched}
    return {**head, "topology": topology, "steps": steps}


def _fix_actions(fix: Fix, ticket: Ticket) -> dict[str, Any]:
    values, redeploy = fix.values, fix.redeploy
    actions: dict[str, Any] = {}
    if fix.renew and not ticket.rotate_renews:
        renewed = next(iter(ticket.renewed), None)
        if renewed is None:
            raise ConfigError(
                "no renewed stand-in of the frontend Secret to switch to; give --secret or a bundle"
            )
        existing = {"workerCallbackProxy": {"tls": {"frontend": {"existingSecret": renewed}}}}
        values, redeploy = (
            deep_merge(values, existing),
            _wider(redeploy, "proxy"),
        )  # a new Secret name: a rollout
    elif fix.renew:
        actions["rotate"] = "frontend"
    if values:
        actions["setValues"] = values
    if redeploy:
        actions["redeploy"] = redeploy
    if fix.dns:
        actions["dnsRewrite"] = fix.dns
    return actions


# -- writing: PEM as a | block, new files only --------------------------------------------------------
class _Dumper(yaml.SafeDumper):
    """Multi-line text (a PEM) as a literal block, as a customer pastes it into the environment file."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.split("\n")) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110)


def create_file(path: Path, text: str) -> None:
    """A new file: never over an existing one (an input), never through a link planted at its name."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise ConfigError(
            f"{path}: exists (or is a link); a ticket never overwrites a file: name a new one"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write the ticket ({exc.strerror or exc})") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def ticket_paths(path: Path) -> tuple[Path, Path, Path]:
    """(the scenario, the values beside it, the Secrets folder beside it)."""
    return path, path.with_name(f"{path.stem}.values.yaml"), path.with_name(f"{path.stem}.secrets")


def check_new(path: Path) -> None:
    """Refuse before anything runs: every path the ticket would write must be new."""
    for target in ticket_paths(path):
        if target.exists() or target.is_symlink():
            raise ConfigError(
                f"{target}: exists; a ticket never overwrites a file: name a new --write-ticket FILE"
            )


def write(path: Path, data: dict[str, Any], values: dict[str, Any], header: Sequence[str] = ()) -> list[Path]:
    """The scenario at `path` (after `header`'s comment lines) and the customer's values beside it."""
    scenario_file, values_file, _ = ticket_paths(path)
    comments = "".join(f"# {line}\n" for line in header)
    create_file(scenario_file, comments + dump(data))
    create_file(values_file, dump(values))
    return [scenario_file, values_file]


__all__ = ["FIXES", "REDEPLOYS", "Fix", "Ticket", "check_new", "dump", "scenario", "step_name", "write"]
