"""A Secret's public certificate as a support bundle carries it: names, issuer, dates (pure).

The bundle has tls.crt and ca.crt (base64, as `kubectl get secret -o yaml` prints them), never tls.key,
so ncpsim can read what the customer's proxy serves but cannot serve it: it mints a stand-in with the
same names, issuer kind and dates (scenarios/bundle/standin.py) and says so.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from certs.inspect import covers


@dataclass(frozen=True)
class Certificate:
    secret: str
    names: tuple[str, ...]  # DNS names and addresses from subjectAltName, in order
    subject: str
    issuer: str  # the issuer's distinguished name, as openssl prints it
    issuer_organization: str
    not_before: datetime
    not_after: datetime
    pem: str  # the leaf (public), for the ticket
    ca_pem: str  # ca.crt, when the Secret has it
    issuer_ref: str  # cert-manager's issuer annotation (KIND/NAME), when present
    source: str  # bundle file:line of the Secret

    def expired(self, now: datetime) -> bool:
        return self.not_after <= now

    def covers(self, host: str) -> bool:
        return any(covers(name, host) for name in self.names)

    def signed_by(self, pem: str) -> bool:
        """Whether `pem` (workerCallbackCaPem, or ca.crt) holds a certificate named as this leaf's issuer."""
        wanted = self.issuer
        return any(_rfc4514(cert.subject) == wanted for cert in _certificates(pem))


def _rfc4514(name: x509.Name) -> str:
    return name.rfc4514_string()


def _certificates(pem: str) -> list[x509.Certificate]:
    try:
        return list(x509.load_pem_x509_certificates(pem.encode()))
    except ValueError:
        return []


def pem_sha256(pem: str) -> str:
    """The SHA-256 the collector keeps of NVCF_PROXY_CA_PEM's value."""
    return hashlib.sha256(pem.encode()).hexdigest()


def decode_pem(data: object) -> str | None:
    """A Secret data value (base64 text) as PEM text, or None when it is not base64 of text."""
    if not isinstance(data, str):
        return None
    try:
        return base64.b64decode(data, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def read_certificate(secret: str, crt: str, ca: str, issuer_ref: str, source: str) -> Certificate | None:
    """The leaf of `crt` (PEM), or None when it holds no certificate."""
    chain = _certificates(crt)
    if not chain:
        return None
    leaf = chain[0]
    try:
        alt = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple(str(n.value) for n in alt if isinstance(n, (x509.DNSName, x509.IPAddress)))
    except x509.ExtensionNotFound:
        names = ()
    organizations = leaf.issuer.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    return Certificate(
        secret=secret,
        names=names,
        subject=_rfc4514(leaf.subject),
        issuer=_rfc4514(leaf.issuer),
        issuer_organization=str(organizations[0].value) if organizations else "",
        not_before=leaf.not_valid_before_utc,
        not_after=leaf.not_valid_after_utc,
        pem=leaf.public_bytes(Encoding.PEM).decode(),
        ca_pem=ca,
        issuer_ref=issuer_ref,
        source=source,
    )
