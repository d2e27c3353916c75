"""Read facts out of PEM certificates, and the wildcard rule. Pure: bytes in, values out."""

from __future__ import annotations

import ipaddress
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes


def _first_cert(pem: bytes | str) -> x509.Certificate:
    # A tls.crt holds the leaf first; every question here is about the leaf.
    data = pem.encode() if isinstance(pem, str) else bytes(pem)
    return x509.load_pem_x509_certificate(data)


def fingerprint_sha256(pem: bytes | str) -> str:
    """SHA-256 of the DER certificate as ``AB:CD:...``, the form ``openssl x509 -fingerprint`` prints."""
    digest = _first_cert(pem).fingerprint(hashes.SHA256())
    return ":".join(f"{b:02X}" for b in digest)


def not_after(pem: bytes | str) -> datetime:
    """Expiry as an aware UTC datetime."""
    return _first_cert(pem).not_valid_after_utc


def issued_by(pem: bytes | str, ca_pem: bytes | str) -> bool:
    """True when the leaf names that CA as its issuer (by subject; the signature is the TLS stack's job)."""
    return _first_cert(pem).issuer == _first_cert(ca_pem).subject


def sans(pem: bytes | str) -> list[str]:
    """DNS names and IP addresses from subjectAltName, in certificate order."""
    try:
        ext = _first_cert(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    out: list[str] = []
    for name in ext.value:
        if isinstance(name, (x509.DNSName, x509.IPAddress)):
            out.append(str(name.value))
    return out


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def covers(pattern_or_san: str, hostname: str) -> bool:
    """Whether a certificate name matches a hostname (RFC 6125 section 6.4, as OpenSSL applies it).

    ``*`` must be the whole left-most label and matches exactly one non-empty label, so
    ``*.example.com`` covers ``a.example.com`` but neither ``example.com`` nor ``a.b.example.com``.
    Partial wildcards (``f*.example.com``) and wildcards directly over a single label (``*.com``) never
    match, and IP addresses only match themselves, because the TLS clients ncpsim uses refuse them too.
    Comparison ignores case and one trailing dot.
    """
    pattern = pattern_or_san.strip().rstrip(".").lower()
    host = hostname.strip().rstrip(".").lower()
    if not pattern or not host:
        return False
    if is_ip(host) or is_ip(pattern):
        both = is_ip(host) and is_ip(pattern)
        return both and ipaddress.ip_address(host) == ipaddress.ip_address(pattern)
    host_labels = host.split(".")
    pattern_labels = pattern.split(".")
    if "" in host_labels or "" in pattern_labels or "*" in host:
        return False
    if "*" not in pattern:
        return host_labels == pattern_labels
    first, rest = pattern_labels[0], pattern_labels[1:]
    if first != "*" or "*" in ".".join(rest) or len(rest) < 2:
        return False
    return len(host_labels) == len(pattern_labels) and host_labels[1:] == rest


def summary(pem: bytes | str) -> str:
    """One line for a PEM a person reads past: the leaf's subject and SHA-256 (never the whole block)."""
    try:
        cert = _first_cert(pem)
    except ValueError:
        return f"<PEM, not a certificate, {len(pem)} bytes>"
    short = fingerprint_sha256(pem).replace(":", "")[:16].lower()
    return f"<PEM certificate {cert.subject.rfc4514_string() or '(no subject)'}, sha256 {short}…>"


def issuer_name(pem: bytes | str) -> str:
    """The leaf's issuer as RFC 4514 text (a customer's CA the stack does not hold)."""
    return _first_cert(pem).issuer.rfc4514_string()
