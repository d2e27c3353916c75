"""Which upstream certificates the proxy accepts by name: Envoy's DNS SAN matching, in one place.

The proxy checks two upstream names (seed `worker-callback-proxy.md`, "Certificates and CAs"):
- an invocation-service pod: the pod name it dials (auto_san_validation: the SNI it sent is the SAN it
  expects, compared as DefaultCertValidator::verifySubjectAltName does);
- a grpc-proxy pod: the fixed name `*.grpc-headless.nvcf.svc.cluster.local`, a `match_typed_subject_alt_names`
  DNS matcher of type `exact` (san_matcher.cc: an exact matcher on a DNS SAN compares as dnsNameMatch).

Both come down to Envoy's Utility::dnsNameMatch(expected, san): the SAN may be a wildcard pattern, the
expected string is taken as it is. So the exact matcher `*.grpc-headless...` accepts only a certificate whose
SAN is literally `*.grpc-headless...`: a grpc-proxy pod certificate issued for the pod's own name
(`10-42-0-21.grpc-headless...`) is refused, where a hostname check (Python's, aioquic's) would take it.
The local fronts decide with `accepts`, the k3d renderer writes what `envoy_validation` gives: one rule.
Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from certs.profiles import GRPC_WILDCARD

ACE_PREFIX = "xn--"  # an A-label (RFC 5890) never holds a wildcard


def label_wildcard_match(label: str, pattern: str) -> bool:
    """Utility::labelWildcardMatch: one `*` in the pattern label stands for any run of characters."""
    if pattern == "*":
        return True
    if pattern.count("*") != 1:
        return False
    prefix, suffix = pattern.split("*")
    return len(pattern) <= len(label) + 1 and label.startswith(prefix) and label.endswith(suffix)


def dns_name_match(name: str, pattern: str) -> bool:
    """Utility::dnsNameMatch: does the certificate's DNS SAN `pattern` cover `name`? Case-insensitive; a
    wildcard only in the left-most label of the pattern, matching exactly one label of the name."""
    name, pattern = name.lower(), pattern.lower()
    if name == pattern:
        return True
    name_first, _, name_rest = name.partition(".")
    first, dot, rest = pattern.partition(".")
    if not dot or "." not in name or "*" not in first or "*" in rest or first.startswith(ACE_PREFIX):
        return False
    return name_rest == rest and label_wildcard_match(name_first, first)


@dataclass(frozen=True)
class SanRule:
    """How the proxy checks an upstream certificate's DNS SANs.

    `exact`: a typed DNS matcher of type exact, compared to every DNS SAN as dnsNameMatch(exact, san).
    None: auto SAN validation, the upstream host the proxy dialed (and sent as SNI) is what it expects."""

    exact: str | None = None

    def expected(self, host: str) -> str:
        return host if self.exact is None else self.exact

    def accepts(self, dns_sans: Iterable[str], host: str) -> bool:
        """Envoy's verdict on a certificate with these DNS SANs, from a proxy that dialed `host`."""
        want = self.expected(host)
        return any(dns_name_match(want, san) for san in dns_sans)

    @property
    def refusal(self) -> str:
        """The validator's words for a refused certificate, as Envoy puts them in the transport failure
        reason (DefaultCertValidator::verifyCertificate; the newest releases append the SANs compared,
        not modelled)."""
        return (
            "verify cert failed: verify SAN list" if self.exact is None else "verify cert failed: SAN matcher"
        )

    def envoy_validation(self) -> dict[str, Any]:
        """What the rendered cluster's default_validation_context holds for this rule (auto SAN validation
        lives in the cluster's upstream_http_protocol_options instead: nothing here)."""
        if self.exact is None:
            return {}
        return {"match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": self.exact}}]}

    @property
    def auto_san(self) -> bool:
        return self.exact is None


def peercert_dns_sans(peercert: dict[str, Any] | None) -> tuple[str, ...]:
    """The DNS SANs of a certificate as Python's ssl getpeercert() gives it."""
    return tuple(value for kind, value in (peercert or {}).get("subjectAltName", ()) if kind == "DNS")


def x509_dns_sans(certificate: x509.Certificate) -> tuple[str, ...]:
    """The DNS SANs of a cryptography x509.Certificate (aioquic's view of the peer)."""
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return tuple(san.get_values_for_type(x509.DNSName))


INVOCATION_UPSTREAM = SanRule()  # the pod name the proxy dials (auto_sni + auto_san_validation)
GRPC_UPSTREAM = SanRule(GRPC_WILDCARD)  # the seed's fixed name, whatever pod is dialed
