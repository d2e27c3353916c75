"""The DNS rule each simulated cluster answers with: pure data in, an `Answer` out.

A compute cluster's CoreDNS carries one rewrite, ``*.<workerDomain>`` -> the proxy's
load-balancer address, so every ``<dashed-pod-ip>.<workerDomain>`` and
``invocation.<workerDomain>`` reaches the worker callback proxy. The control-plane cluster
answers its pods' names (``<dashed-pod-ip>.invocation.nvcf.svc.cluster.local``, ...) from exact
host records. Nothing here forwards: a name a view does not know is NXDOMAIN, so a missing
rewrite fails loudly instead of leaking to a real resolver.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = ["Answer", "View", "WildcardRule", "answer", "dashed_ip", "normalize_name", "undash"]

# Only LDH and underscore in configured domains: the CoreDNS renderer escapes nothing but dots.
_HOSTNAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
_DASHED = re.compile(r"[0-9]{1,3}(?:-[0-9]{1,3}){3}", re.ASCII)


def normalize_name(qname: str) -> str | None:
    """Lower-case `qname` and drop one trailing dot; None when it is not a usable name.

    Empty labels ("a..b", ".a", the root) and whitespace or control characters cannot come off
    the wire as one name, so they match nothing. `dns.coredns.evaluate_rewrite` uses the same
    normalisation, which keeps the local rule and the rendered CoreDNS rewrite in agreement.
    """
    name = qname.removesuffix(".").lower()
    if not name or any(not label for label in name.split(".")):
        return None
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        return None
    return name


def _require_hostname(what: str, value: str) -> str:
    name = normalize_name(value)
    if name is None or not _HOSTNAME.fullmatch(name):
        raise ValueError(f"{what} must be a DNS name such as grpc-worker.example.com, got {value!r}")
    return name


def _require_ipv4(what: str, value: str) -> None:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{what} must be an IPv4 address such as 10.100.0.10, got {value!r}") from None


@dataclass(frozen=True)
class WildcardRule:
    """The compute cluster's CoreDNS rewrite: ``*.<worker_domain>`` -> `target_ip`."""

    worker_domain: str  # e.g. "grpc-worker.example.com"
    target_ip: str  # the proxy's load-balancer address, e.g. "10.100.0.10"

    def __post_init__(self) -> None:
        # Fail at construction, where the values file is read, not at the first query.
        _require_hostname("workerDomain", self.worker_domain)
        _require_ipv4("proxy load-balancer address", self.target_ip)

    @property
    def domain(self) -> str:
        """`worker_domain` lower-cased, without a trailing dot."""
        return normalize_name(self.worker_domain) or ""

    def matches(self, qname: str) -> bool:
        """True for any name strictly under the worker domain (one or more labels), not the apex."""
        name = normalize_name(qname)
        suffix = "." + self.domain
        return name is not None and name.endswith(suffix) and len(name) > len(suffix)


@dataclass(frozen=True)
class View:
    """What one cluster's DNS answers."""

    cluster: str  # e.g. "ncpsim-cp", "ncpsim-compute-1"
    hosts: tuple[tuple[str, str], ...] = ()  # exact (fqdn, ipv4) records
    wildcard: WildcardRule | None = None  # None = the compute cluster lacks the rewrite
    ttl: int = 5

    def __post_init__(self) -> None:
        for fqdn, ip in self.hosts:
            _require_hostname(f"host record name in view {self.cluster}", fqdn)
            _require_ipv4(f"host record {fqdn} in view {self.cluster}", ip)
        if not 0 <= self.ttl <= 2**31 - 1:
            raise ValueError(f"ttl of view {self.cluster} must be 0..2147483647, got {self.ttl}")


@dataclass(frozen=True)
class Answer:
    rcode: str  # "NOERROR" | "NXDOMAIN"
    addresses: tuple[str, ...]  # A records (empty for AAAA/other types of a known name)
    matched: str  # "host" | "wildcard" | "none"  (for traces)


_NXDOMAIN = Answer("NXDOMAIN", (), "none")


def answer(view: View, qname: str, qtype: str) -> Answer:
    """Answer `qname`/`qtype` from `view` alone: exact hosts first, then the wildcard, else NXDOMAIN.

    A known name asked for anything but A (or ANY) is NOERROR with no addresses (NODATA): the
    name exists, it has no record of that type. Workers ask AAAA too, and NXDOMAIN there would
    make some stub resolvers give up on the A answer.
    """
    name = normalize_name(qname)
    if name is None:
        return _NXDOMAIN
    addresses = tuple(ip for fqdn, ip in view.hosts if normalize_name(fqdn) == name)
    if addresses:
        matched = "host"
    elif view.wildcard is not None and view.wildcard.matches(name):
        matched, addresses = "wildcard", (view.wildcard.target_ip,)
    else:
        return _NXDOMAIN
    wants_a = qtype.upper() in ("A", "ANY")
    return Answer("NOERROR", addresses if wants_a else (), matched)


def dashed_ip(ip: str) -> str:
    """ "10.42.0.17" -> "10-42-0-17", the first label of a pod's DNS name."""
    _require_ipv4("pod IP", ip)
    return ip.replace(".", "-")


def undash(label: str) -> str | None:
    """ "10-42-0-17" -> "10.42.0.17"; None when `label` is not a dashed IPv4 address."""
    if not _DASHED.fullmatch(label):
        return None
    dotted = label.replace("-", ".")
    try:
        # ipaddress also rejects octets over 255 and leading zeros ("010"), which would be ambiguous.
        return str(ipaddress.IPv4Address(dotted))
    except ValueError:
        return None
