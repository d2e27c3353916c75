"""A ticket file: a scenario that reproduces a finding with the customer's values and ends with its fix.

`invoke diagnose --write-ticket FILE` writes it, and the customer's values beside it; `invoke replay
scenario=FILE` then shows the failure as the customer saw it, the fix step, and callbacks that arrive.
Render refusals become an `expectError` scenario: in the field nothing deploys, so there is nothing to fix
on a running stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scenarios.diagnose.judge import Finding
from sim.errors import ConfigError

PEM = ("global", "nvcaOperator", "agent", "workerCallbackCaPem")


@dataclass(frozen=True)
class Fix:
    values: dict[str, Any]
    redeploy: str  # what the fix needs rolled out: workers (new function pods) or the proxy
    error: str | None  # what the worker reports before the fix
    timeout: float | None = None  # seconds the failing calls wait, when no worker ever takes them


def _nested(parts: tuple[str, ...], value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    return dict(out)


FIXES: dict[str, Fix] = {
    "worker-ca-missing": Fix(
        _nested(PEM, "@stack-ca"), "workers", "x509: certificate signed by unknown authority"
    ),
    "worker-ca-stale": Fix(
        _nested(PEM, "@stack-ca"), "workers", "x509: certificate signed by unknown authority"
    ),
    "legacy-worker-connect-off": Fix(
        {"workerCallbackProxy": {"invocation": {"connect": {"enabled": True}}}},
        "proxy",
        'request-attach": Not Found',
    ),
    # the listener on again, as the stack would have it with upstream TLS
    "upstream-tls-mismatch": Fix({"invocation": {"workerTls": {"enabled": True}}}, "pods", "503"),
    # the values are right already: new function pods get NVCF_PROXY_CA_PEM
    "pem-not-redeployed": Fix({}, "workers", "x509: certificate signed by unknown authority"),
    # back to the shared NKey, which an older worker-utils can use, until the images are upgraded
    "nats-account-not-read": Fix({"nats": {"workerAuth": "nkey"}}, "workers", None, timeout=3.0),
}


def ticket(
    finding: Finding, values: dict[str, Any], workers: dict[str, Any], message: str | None = None
) -> dict[str, Any]:
    """The scenario for `finding`, seen by the worker group `workers` (the probe worker's profile)."""
    cause = finding.cause
    head = {
        "name": f"ticket-{cause.id}",
        "summary": f"{cause.title} (written by invoke diagnose)",
        "ticket": f"seed {cause.section}; fix: {cause.fix}",
        "seed": 1,
        "values": values,
    }
    if finding.evidence and finding.evidence[0].startswith("render refused: "):
        return {**head, "expectError": message or cause.title}
    fix = FIXES.get(cause.id)
    if fix is None:
        raise ConfigError(
            f"no ticket template for {cause.id} yet; write the scenario by hand from the finding"
        )
    steps: list[dict[str, Any]] = [
        {
            "name": "as the customer has it",
            "invoke": {
                "function": "http-echo",
                "count": 2,
                **({"timeout": fix.timeout} if fix.timeout else {}),
            },
            "expect": {"outcome": "failure", **({"error": fix.error} if fix.error else {})},
        },
        # Work waits in the function's JetStream stream until the new pods pull it: no wait step needed.
        {
            "name": f"the fix: {cause.fix}"[:120],
            **({"setValues": fix.values} if fix.values else {}),
            "redeploy": fix.redeploy,
        },
        {
            "name": "after the fix",
            "invoke": {"function": "http-echo", "count": 2},
            "expect": {"outcome": "success", "via": "proxy", "samePod": True},
        },
    ]
    return {
        **head,
        "topology": {
            "invocationReplicas": 2,
            "grpcProxyReplicas": 0,
            "computeClusters": [{"workers": [workers]}],
        },
        "steps": steps,
    }


def write(path: Path, scenario: dict[str, Any], values: dict[str, Any]) -> list[Path]:
    """The scenario at `path` and the customer's values beside it (`<stem>.values.yaml`)."""
    beside = path.with_name(f"{path.stem}.values.yaml")
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    beside.write_text(yaml.safe_dump(values, sort_keys=False))
    return [path, beside]
