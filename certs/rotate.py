"""Certificate rotation as an operator (or cert-manager) performs it on a running stack.

Every change is a Secret swap (certs.volume), so the proxy and the pods pick it up on their next
handshake without a restart, and connections already open keep the material they started with.
The kinds follow the order that loses no callback:

- `frontend`: renew the proxy's `*.<workerDomain>` certificates (stack and public variants) from the current
  CAs (after a `stack-ca` rotation, the new one: workers whose NVCF_PROXY_CA_PEM is older then fail).
- `pod-certs`: renew the invocation-service and grpc-proxy pod certificates, same CA.
- `stack-ca`: each pod Secret's `ca.crt` first becomes the bundle new + old CA; after a propagation
  grace (a proxy handshake that loaded its trust just before must still verify), the new CA signs new
  pod certificates, so the proxy verifies whichever one a pod serves. The frontend leaf stays on the old
  CA: workers hold the old CA in NVCF_PROXY_CA_PEM (fixed when their pod was created), so moving the
  frontend has to wait until workers are redeployed with the new CA (then `rotate: frontend`).
- `public-ca`: a new public-style root joins the simulated system roots beside the old one (as an OS
  trust-store update does); after the grace the public frontend certificate is reissued from it.
"""

from __future__ import annotations

import shutil
import time

from certs.profiles import PUBLIC, STACK, Profile, frontend_profile, grpc_profile, invocation_profile
from certs.store import CertStore
from certs.volume import load_secret, write_secret

KINDS = ("frontend", "pod-certs", "stack-ca", "public-ca")


# How long new trust is given to reach every reader before anything presents a certificate that needs
# it: a handshake whose client loaded its trust just before the change must still find its issuer.
PROPAGATION_GRACE = 1.0


def rotate(store: CertStore, kind: str, worker_domain: str, grace: float = PROPAGATION_GRACE) -> str:
    """Perform one rotation (blocking for `grace` between trust and leaves); returns a report line."""
    if kind == "frontend":
        store.issue(frontend_profile(worker_domain, STACK))
        store.issue(frontend_profile(worker_domain, PUBLIC))
        return "renewed the proxy frontend certificates (stack and public) from the current CAs"
    if kind == "pod-certs":
        store.issue(invocation_profile())
        store.issue(grpc_profile())
        return "renewed the invocation-service and grpc-proxy pod certificates"
    if kind == "stack-ca":
        store.rotate_ca(STACK)
        bundle = store.ca_path(STACK).read_bytes() + (store.ca_dir(STACK) / "ca.prev.crt").read_bytes()
        pods = (invocation_profile(), grpc_profile())
        for profile in pods:
            # Trust first: the proxy must accept the new CA before any pod serves a leaf from it, and
            # every later swap keeps the bundle, so no handshake ever meets a CA it does not know.
            crt, key, _ = load_secret(store.secret_dir(profile.secret))
            write_secret(store.secret_dir(profile.secret), crt, key, bundle)
        time.sleep(grace)  # let the new trust reach every reader (the simulated propagation delay)
        for profile in pods:
            scratch = Profile(f"rotate-{profile.secret}", profile.identities, STACK)
            crt, key, _ = load_secret(store.issue(scratch))
            write_secret(store.secret_dir(profile.secret), crt, key, bundle)
            shutil.rmtree(store.secret_dir(scratch.secret), ignore_errors=True)
        return (
            "new stack CA; pod certificates reissued from it, pod Secrets' ca.crt = new + old CA; "
            "the frontend stays on the old CA until workers are redeployed with the new one"
        )
    if kind == "public-ca":
        store.rotate_ca(PUBLIC)  # workers' system roots keep ca.prev.crt beside the new root
        time.sleep(grace)  # the trust-store update reaches workers before the frontend moves
        store.issue(frontend_profile(worker_domain, PUBLIC))
        return "new public-style root added to the system roots; public frontend reissued from it"
    raise ValueError(f"unknown rotation {kind!r}; choose one of {', '.join(KINDS)}")
