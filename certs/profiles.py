"""Certificate profiles: which Secret holds which names, signed by which CA.

Pure data, no I/O. The names come from the worker-callback-proxy seed: the pod certificates always come
from the stack CA (OpenBao PKI); only the proxy frontend may come from a public CA, or from whatever CA
signed a Secret the customer brings (`existingSecret`), e.g. their corporate CA (PRIVATE here).
"""

from __future__ import annotations

from dataclasses import dataclass

STACK = "stack"  # plays the stack's OpenBao PKI (ClusterIssuer/nvcf-openbao-pki)
PUBLIC = "public"  # plays a public CA such as Let's Encrypt; simulated workers trust it as system roots
PRIVATE = "private"  # plays a customer's corporate CA: no simulated worker trusts it unless handed its PEM
ISSUERS = (STACK, PUBLIC, PRIVATE)

FRONTEND_SECRET = "worker-callback-proxy-frontend-tls"
PUBLIC_FRONTEND_SECRET = "worker-public-tls"
INVOCATION_SECRET = "invocation-service-worker-tls"
GRPC_SECRET = "grpc-proxy-worker-tls"
# Where the simulation keeps each issuer's frontend certificate, so both can exist side by side.
FRONTEND_SECRETS = {STACK: FRONTEND_SECRET, PUBLIC: PUBLIC_FRONTEND_SECRET}

# Pod certificates are wildcards because each pod is addressed by its dashed IP under the service name.
INVOCATION_WILDCARD = "*.invocation.nvcf.svc.cluster.local"
GRPC_WILDCARD = "*.grpc-headless.nvcf.svc.cluster.local"


@dataclass(frozen=True)
class Profile:
    """One certificate to issue: Secret name (= folder name), SANs and issuing CA."""

    secret: str
    identities: tuple[str, ...]
    issuer: str

    def __post_init__(self) -> None:
        # Catch a typo'd issuer at construction rather than as a missing CA file later.
        if self.issuer not in ISSUERS:
            raise ValueError(f"issuer must be one of {ISSUERS}, got {self.issuer!r}")
        if not self.identities:
            raise ValueError(f"profile {self.secret!r} needs at least one identity")


def frontend_profile(worker_domain: str, issuer: str = STACK, *, secret: str | None = None) -> Profile:
    """The proxy frontend certificate for ``*.<workerDomain>``.

    With the public issuer the default Secret is the one the seed's ``existingSecret`` example names;
    ``secret`` overrides it (e.g. with ``ProxySettings.frontend_secret``).
    """
    domain = worker_domain.strip().rstrip(".").lower()
    if not domain:
        raise ValueError("worker_domain must not be empty")
    if issuer not in FRONTEND_SECRETS:
        raise ValueError(f"issuer must be one of {ISSUERS}, got {issuer!r}")
    return Profile(secret=secret or FRONTEND_SECRETS[issuer], identities=(f"*.{domain}",), issuer=issuer)


def secret_profile(
    secret: str, worker_domain: str, issuer: str = PUBLIC, names: tuple[str, ...] = ()
) -> Profile:
    """A frontend Secret a scenario declares (`topology.secrets.NAME`): ``*.<workerDomain>`` unless named."""
    return Profile(
        secret=secret, identities=names or frontend_profile(worker_domain, PUBLIC).identities, issuer=issuer
    )


def invocation_profile() -> Profile:
    """The invocation-service pods' worker TLS listener (TCP 8443)."""
    return Profile(secret=INVOCATION_SECRET, identities=(INVOCATION_WILDCARD,), issuer=STACK)


def grpc_profile() -> Profile:
    """The grpc-proxy pods' HTTP/3 worker listener (UDP 10084)."""
    return Profile(secret=GRPC_SECRET, identities=(GRPC_WILDCARD,), issuer=STACK)


def stack_profiles(worker_domain: str) -> list[Profile]:
    """Everything a stack issues at start-up.

    The public frontend is issued too, so a scenario can switch the frontend issuer without a new CA.
    """
    return [
        frontend_profile(worker_domain, STACK),
        invocation_profile(),
        grpc_profile(),
        frontend_profile(worker_domain, PUBLIC),
    ]
