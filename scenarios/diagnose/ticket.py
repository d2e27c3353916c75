"""A ticket: a self-contained scenario folder that replays a diagnosis as the customer saw it, then fixes it.

`ncpsim diagnose --write-ticket FILE [--ticket-id ID]` writes FILE (the scenario), `<stem>.values.yaml`
(the customer's values as they set them) and `<stem>.secrets/` (each frontend Secret as ncpsim replays
it: a stand-in key and certificate minted for the customer's names and dates, their own public
certificate beside it; never their key). `ncpsim replay scenario=FILE` shows the failure as the customer
saw it (the calls that failed for them: HTTP, or gRPC alone when HTTP works), then a last step that
applies the fix of every finding the diagnosis names and passes. A render refusal replays as refused,
then the fixed values' callbacks pass (scenarios/diagnose/refusal.py says why that is one scenario). A
cause whose fix is not in what the customer sent (the pods' own state and certificates) is said in one
line. Nothing is overwritten and no link is followed: every file and folder is created anew.
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
from scenarios.diagnose.refusal import RenderFix
from sim.errors import ConfigError
from sim.model.values import CA_PEM, deep_merge, nested, proxy_settings

PEM = CA_PEM  # global.nvcaOperator.agent.workerCallbackCaPem
STEP_NAME = 120  # characters: a step name is a line of the report
GRPC_GIVES_UP = 2.0  # seconds a failing gRPC call waits: the worker cannot call back, the client gives up
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


STACK_PEM = nested(PEM, "@stack-ca")
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
    # the shared NKey, which every worker-utils signs in with, until the callout's webhook answers
    "nats-auth-rejected": Fix({"nats": {"workerAuth": "nkey"}}, "workers", timeout=3.0),
}
# Causes whose fix is not in what a customer sends (values, a bundle): the ticket says so, in one line.
NO_FIX = {
    "pod-cert-untrusted": "the pod certificates come from the control plane's PKI (the pods' Secrets), which "
    "neither the values nor a bundle carry, and a replay issues them from its own stack CA",
    "pod-unreachable": "whether a pod runs, is ready and listens is the cluster's state, not in the values "
    "or a bundle, and a replay's pods run",
    "wrong-path": "the path a worker calls is worker-utils' own, and every version ncpsim models calls "
    "/v2/nvcf/worker/request-attach",
    "callback-wrong-pod": "callbacks land on another pod through a shared Service address with the proxy "
    "off, which compute-cluster workers cannot use at all: replay the catalogue's callback-wrong-pod with "
    "the customer's values (-f)",
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
    refusal: str | None = None  # the first render refusal's message
    render: RenderFix | str | None = None  # a refused render's fix, or why there is none
    ticket_id: str | None = None
    fails: str = "http-echo"  # the function whose callbacks failed for the customer
    works: tuple[str, ...] = ()  # the functions whose callbacks arrived (shown first, as they do)


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
        if _render_refused(finding):
            continue  # fixed as values before anything runs (refusal.py)
        fix = FIXES.get(finding.cause.id)
        if fix is None:
            left.append(finding.cause.id)
            continue
        values = deep_merge(values, fix.values)
        if finding.cause.id == "frontend-private-ca" and ticket.private_ca_pem:
            values = deep_merge(values, nested(PEM, ticket.private_ca_pem))
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
    if _render_refused(ticket.findings[0]):
        return _refused(ticket, fix, left)
    if top.id not in FIXES and top.id not in NO_FIX:
        raise ConfigError(f"no ticket template for {top.id} yet; write the scenario by hand from the finding")
    head = _head(ticket, [f"not fixed by this ticket: {c}" for c in left])
    steps = [*_as_found(ticket), _failing(ticket, FIXES.get(top.id, Fix()))]
    if top.id in NO_FIX:  # the failure as the customer saw it, and no fix step
        head["ticket"] += f"; no fix step: {NO_FIX[top.id]}"
    else:
        steps.append(
            {
                "name": step_name(f"the fix: {top.fix}"),
                **_fix_actions(fix, ticket),
                "invoke": {"function": ticket.fails, "count": 2},
                "expect": _arrived(ticket.fails),
            }
        )
    switched = ticket.renewed if fix.renew and not ticket.rotate_renews else {}
    topology = _topology(ticket, {**ticket.secrets, **switched}, compute=True)
    return {**head, "topology": topology, "steps": steps}


def _render_refused(finding: Finding) -> bool:
    return bool(finding.evidence) and finding.evidence[0].startswith("render refused: ")


def _head(ticket: Ticket, more: Sequence[str] = ()) -> dict[str, Any]:
    top = ticket.findings[0].cause
    return {
        "name": scenario_name(ticket),
        "summary": f"{top.title} (written by ncpsim diagnose)",
        "ticket": "; ".join(
            [
                *([ticket.ticket_id] if ticket.ticket_id else []),
                f"seed {top.section}",
                f"fix: {top.fix}",
                *more,
            ]
        ),
        "seed": 1,
        "values": ticket.values,
    }


def _kind(function: str) -> str:
    return "HTTP" if function == "http-echo" else "gRPC"


def _arrived(function: str) -> dict[str, Any]:
    """Callbacks that arrive through the proxy; an HTTP one on the pod that holds the request."""
    return {"outcome": "success", "via": "proxy", **({"samePod": True} if function == "http-echo" else {})}


def _as_found(ticket: Ticket) -> list[dict[str, Any]]:
    """The callbacks that arrived for the customer (gRPC's fail while HTTP's arrive: a record for
    invocation.<workerDomain> alone)."""
    return [
        {
            "name": f"{_kind(f)} callbacks as the customer has them",
            "invoke": {"function": f, "count": 2},
            "expect": _arrived(f),
        }
        for f in ticket.works
    ]


def _failing(ticket: Ticket, before: Fix) -> dict[str, Any]:
    """The calls that failed for the customer, failing as theirs did."""
    wait = before.timeout or (GRPC_GIVES_UP if ticket.fails == "grpc-echo" else None)
    return {
        "name": "as the customer has it"
        + (f": {_kind(ticket.fails)} callbacks fail" if ticket.works else ""),
        "invoke": {"function": ticket.fails, "count": 2, **({"timeout": wait} if wait else {})},
        "expect": {
            "outcome": "failure",
            **({"error": before.error} if before.error else {}),
            **({"dnsRcode": before.rcode} if before.rcode else {}),
        },
    }


def _topology(ticket: Ticket, secrets: Mapping[str, Any], compute: bool) -> dict[str, Any]:
    """One compute cluster with the customer's DNS (or, with the proxy off, workers beside the pods)."""
    grpc = "grpc-echo" in (ticket.fails, *ticket.works)
    workers = (
        {"computeClusters": [{"workers": [ticket.workers], **ticket.cluster}]}
        if compute
        else {"controlWorkers": [ticket.workers]}
    )
    return {
        "invocationReplicas": 2,
        "grpcProxyReplicas": 1 if grpc else 0,
        **workers,
        **({"secrets": dict(secrets)} if secrets else {}),
    }


def _refused(ticket: Ticket, fix: Fix, left: Sequence[str]) -> dict[str, Any]:
    """A refused render: refused as the customer's was, then the fixed values (and the fix of every other
    finding, as its step) deploy and callbacks arrive; or, with no fix as values, the refusal alone
    (`expectError`), saying why."""
    render = ticket.render
    if not isinstance(render, RenderFix):
        why = render or "no refusal to fix"
        return {**_head(ticket, [f"no fix step: {why}"]), "expectError": ticket.refusal or why}
    proxy = proxy_settings(render.values).enabled
    others = [f.cause.id for f in ticket.findings if not _render_refused(f) and f.cause.id not in left]
    head = {**_head(ticket, [f"not fixed by this ticket: {c}" for c in left]), "values": render.values}
    steps = [
        {
            "name": "as the customer has it: helmfile sync refuses the render",
            "setValues": render.refused,
            "expect": {"refused": render.message},
        },
        {
            "name": step_name(f"the fix: {'; '.join([*render.done, *others])}"),
            **_fix_actions(fix, ticket),
            "invoke": {"function": "http-echo", "count": 2},
            "expect": {**_arrived("http-echo"), "via": "proxy" if proxy else "direct"},
        },
    ]
    return {**head, "topology": _topology(ticket, ticket.secrets, compute=proxy), "steps": steps}


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
        if "dnsRecords" in ticket.cluster:  # the customer's rules for callbacks give way to the seed's record
            actions["dnsRecords"] = []
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
