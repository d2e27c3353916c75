"""Stand-in certificates: what ncpsim serves in place of a customer's, whose private key it never has.

A stand-in has the customer's names and dates, from a CA of the same kind: a Secret from a public issuer
or the stack's is declared in the scenario (`topology.secrets.NAME: {issuer, names, expired}`) and the
replaying stack issues it from its own public-style or stack CA, which its workers trust exactly as the
customer's trust theirs; a Secret from the customer's own CA is minted here, with a stand-in CA, into a
folder (`source`), and the workerCallbackCaPem that named their CA names the stand-in CA instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import trustme

from scenarios.bundle.certificate import Certificate
from sim.errors import ConfigError


@dataclass(frozen=True)
class StandIn:
    crt: bytes  # the leaf, then any intermediates
    key: bytes
    ca: bytes  # the stand-in CA workers must be given, as the customer gives theirs


def issuer_kind(cert: Certificate, frontend_issuer: str, pem: str | None) -> str:
    """stack | public | private: the stack's issuer; a CA the values' workerCallbackCaPem names (the customer
    hands workers their own CA, so no public root holds it); else public, the seed's reason to bring one."""
    if frontend_issuer == "stack":
        return "stack"
    if pem and "-----BEGIN" in pem and cert.signed_by(pem):
        return "private"
    return "public"


class StandInCa:
    """A fresh CA named like the customer's, for one Secret's stand-ins (the leaf as found, and a renewed
    one for a ticket's fix, which workers given this CA trust alike)."""

    def __init__(self, cert: Certificate):
        self.cert = cert
        self.ca = trustme.CA(
            organization_name=f"{cert.issuer_organization or 'customer CA'} (ncpsim stand-in)"
        )

    def leaf(
        self,
        names: tuple[str, ...] = (),
        not_before: datetime | None = None,
        not_after: datetime | None = None,
    ) -> StandIn:
        """A leaf for `names` (default: the certificate's) and dates (default: the certificate's)."""
        cert = self.cert
        if not (names or cert.names):
            raise ConfigError(
                f"{cert.source}: Secret {cert.secret}'s certificate has no names to stand in for"
            )
        try:
            leaf = self.ca.issue_cert(
                *(names or cert.names),
                organization_name="ncpsim stand-in",
                not_before=not_before or (None if names else cert.not_before),
                not_after=not_after or (None if names else cert.not_after),
            )
        except ValueError as exc:
            raise ConfigError(f"{cert.source}: cannot mint a stand-in for {cert.secret}: {exc}") from None
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
        return StandIn(chain, leaf.private_key_pem.bytes(), self.ca.cert_pem.bytes())


def write_standin(folder: Path, standin: StandIn, cert: Certificate) -> Path:
    """A Secret-shaped folder (tls.crt, tls.key, ca.crt), and the customer's own certificate beside it for
    reference (customer-tls.crt: public; ncpsim reads only the first three). New files only, no links."""
    folder.mkdir(mode=0o700)
    for name, data, mode in (
        ("tls.crt", standin.crt, 0o644),
        ("tls.key", standin.key, 0o600),
        ("ca.crt", standin.ca, 0o644),
        ("customer-tls.crt", cert.pem.encode(), 0o644),
    ):
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    return folder
