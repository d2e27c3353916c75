"""What a worker or client logged, mapped to the causes that produce it, most likely first (pure data).

Each row is a pattern from the field (worker-utils, Envoy, NATS client messages) and the causes the
seeds give for it. `rank` returns the causes of every matching row, in row order, without repeats.
"""

from __future__ import annotations

import re

from scenarios.diagnose.causes import CAUSES, Cause

SYMPTOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # render failures name their key: the most specific rows first
    (r"nats\.workerAuth must be nkey or token", ("nats-auth-mode",)),
    (r"webhookUrl", ("callout-webhook-empty",)),
    (r"must be empty|split-plane", ("split-plane-url",)),
    (r"invocationProxyURL", ("invocation-proxy-url",)),
    (r"annotation", ("pod-annotations",)),
    # what workers, Envoy and NATS clients log
    (r"x509: certificate has expired|certificate has expired|certificate expired", ("frontend-expired",)),
    (
        r"x509: certificate signed by unknown authority|unknown authority|certificate verify failed",
        ("worker-ca-missing", "pem-not-redeployed", "worker-ca-stale", "frontend-private-ca"),
    ),
    (
        (
            r"x509: certificate is (valid for|not valid for any names)|certificate is not valid for"
            r"|hostname mismatch|relies on legacy Common Name"
        ),
        ("frontend-certificate-names", "invocation-proxy-url"),
    ),
    (r"ca: no valid PEM certs", ("worker-ca-stale", "worker-ca-missing")),
    (r"tls: unrecognized name|unrecognized name", ("invocation-proxy-url", "frontend-certificate-names")),
    # Envoy's transport failure reason when the pod's port is closed (before the generic refusal row)
    (r"delayed connect error", ("upstream-tls-mismatch", "pod-unreachable")),
    (
        r"no such host|nxdomain|cannot resolve|server misbehaving",
        ("rewrite-missing", "rewrite-wrong-domain", "rewrite-target-unresolved"),
    ),
    (
        (
            r"connection refused|i/o timeout|no route to host|network is unreachable|timed out|unreachable"
            r"|no recent network activity|context canceled"
        ),
        ("proxy-unreachable", "rewrite-wrong-address", "proxy-disabled"),
    ),
    (
        r"CONNECT .* 404|connect.*answered 404|proxytunnel|request-attach\": Not Found",
        ("legacy-worker-connect-off",),
    ),
    (r"\b404\b|route_not_found|\bNR\b", ("legacy-worker-connect-off", "wrong-path")),
    (
        r"status code 401|\b401\b|authorization token is invalid or has expired",
        ("callback-wrong-pod", "split-plane-url"),
    ),
    (
        r"\b503\b|upstream connect error|\bUF\b|CERTIFICATE_VERIFY_FAILED",
        ("pod-cert-untrusted", "pod-unreachable", "upstream-tls-mismatch"),
    ),
    (r"not found for account Worker|account Worker", ("nats-account-not-read",)),
    (
        r"authorization violation|nats: .*authori[sz]ation|authentication (failed|denied)|plugin .* not found",
        ("nats-auth-rejected", "nats-account-not-read", "callout-webhook-empty", "nats-auth-mode"),
    ),
)


def rank(symptom: str) -> list[Cause]:
    """The causes that produce `symptom`, most likely first; empty when no row matches."""
    seen: list[str] = []
    for pattern, causes in SYMPTOMS:
        if re.search(pattern, symptom, re.IGNORECASE):
            seen += [c for c in causes if c not in seen]
    return [CAUSES[c] for c in seen]
