"""The DNS each simulated cluster answers with, as customers write it: pure data in, an `Answer` out.

A cluster's DNS is its own names (`View.hosts`: the pods and Services Kubernetes publishes) and the
records a customer adds (`DnsRecord`), matched the way CoreDNS's rewrite plugin matches names
(``rewrite name exact|suffix|regex FROM TO``). A compute cluster normally holds one, ``*.<workerDomain>``
-> the proxy's load-balancer address, so every ``<dashed-pod-ip>.<workerDomain>`` and
``invocation.<workerDomain>`` reaches the worker callback proxy; the make target writes it as a rewrite to
the name ``worker-callback-proxy.nvcf.svc.cluster.local``, which must then resolve in that same cluster.
Nothing here forwards: a name a view does not know is NXDOMAIN, so a missing record fails loudly instead of
leaking to a real resolver (where CoreDNS would ask its upstream, which knows no cluster-local name either).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from functools import cached_property

__all__ = [
    "EXACT",
    "KINDS",
    "PROXY",
    "REGEX",
    "SUFFIX",
    "Answer",
    "DnsRecord",
    "View",
    "answer",
    "dashed_ip",
    "normalize_name",
    "undash",
    "wildcard",
]

EXACT, SUFFIX, REGEX = "exact", "suffix", "regex"
KINDS = (EXACT, SUFFIX, REGEX)
PROXY = "proxy"  # a record target meaning "the proxy Service's address", filled in by `DnsRecord.pointing_at`

# Only LDH and underscore in configured names: the CoreDNS renderer escapes nothing but dots.
_HOSTNAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?)*")
_DASHED = re.compile(r"[0-9]{1,3}(?:-[0-9]{1,3}){3}", re.ASCII)
_GROUP = re.compile(r"\{(\d+)\}")  # {N} in a regex rewrite's target: the pattern's group N
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
# Go's RE2 has no lookaround and no backreferences, so CoreDNS would refuse such a pattern at start-up; a
# group that repeats a repetition can take Python's backtracking matcher exponential time on one name.
_NOT_RE2 = re.compile(r"\(\?<?[=!]|\(\?P=|\\[1-9]")
_NESTED_REPEAT = re.compile(r"\([^()]*[*+}][^()]*\)[*+{]")
MAX_LABEL, MAX_NAME = 63, 253  # RFC 1035 section 2.3.4, the name without its trailing dot


def normalize_name(qname: str) -> str | None:
    """Lower-case `qname` and drop one trailing dot; None when it is not a usable name.

    Empty labels ("a..b", ".a", the root) and whitespace or control characters cannot come off
    the wire as one name, so they match nothing. `dns.coredns` reads rendered text back through the
    same normalisation, which keeps the local records and the rendered CoreDNS config in agreement.
    """
    name = qname.removesuffix(".").lower()
    if not name or any(not label for label in name.split(".")):
        return None
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name):
        return None
    return name


def _require_hostname(what: str, value: str) -> str:
    name = normalize_name(value)
    shown = value if len(value) <= 80 else value[:77] + "..."
    if name is None or not _HOSTNAME.fullmatch(name):
        raise ValueError(f"{what} must be a DNS name such as grpc-worker.example.com, got {shown!r}")
    _require_length(what, name)
    return name


def _require_length(what: str, name: str) -> None:
    """RFC 1035: what a query can carry; CoreDNS could not answer for a longer name, nor a client ask it."""
    if len(name) > MAX_NAME or any(len(label) > MAX_LABEL for label in name.split(".")):
        shown = name if len(name) <= 80 else name[:77] + "..."
        raise ValueError(
            f"{what} {shown!r} is longer than DNS allows ({MAX_LABEL} characters a label, {MAX_NAME} in all)"
        )


def _require_ipv4(what: str, value: str) -> None:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ValueError(f"{what} must be an IPv4 address such as 10.100.0.10, got {value!r}") from None


def _is_ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _require_pattern(pattern: str) -> re.Pattern[str]:
    where = f"regex record {pattern!r}"
    if _NOT_RE2.search(pattern):
        raise ValueError(f"{where}: lookaround and backreferences are not RE2, which CoreDNS uses; drop them")
    if _NESTED_REPEAT.search(pattern):
        raise ValueError(f"{where}: a repeated group of repeats, e.g. (a+)+, is refused; write (a+) once")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{where} does not compile: {exc}") from None


@dataclass(frozen=True)
class DnsRecord:
    """One rule of a cluster's DNS as a customer writes it: names that `name` matches (as `kind` says)
    answer `target`. Refused at construction, with an example, when it could not be written in a Corefile.

    Build one from code as a Corefile reads::

        DnsRecord("exact", "invocation.grpc-worker.example.com", "10.100.0.10")  # one A record (hosts)
        DnsRecord("suffix", ".grpc-worker.example.com", "10.100.0.10")           # *.grpc-worker.example.com
        DnsRecord("regex", r"^(.+)\\.grpc-worker\\.example\\.com\\.$",              # rewrite name regex ...
                  "worker-callback-proxy.nvcf.svc.cluster.local")                #   ... answer auto
        DnsRecord("exact", "invocation.grpc-worker.example.com", "proxy")        # the proxy's address

    `kind` matches as CoreDNS's rewrite plugin does: ``exact`` the whole name; ``suffix`` names that end
    with `name` compared as strings (a leading dot keeps it to names under a domain, the wildcard's
    meaning; without one, ``example.com`` also matches ``xexample.com``); ``regex`` a pattern searched in the
    lower-cased name with its trailing dot (anchor it: ``^...\\.$``). CoreDNS's ``prefix`` and ``substring``
    are not modelled.

    `target` is an IPv4 address (the record's A answer: a hosts or template entry, a zone's A record),
    ``proxy`` (the proxy Service's address, filled in when the topology is built), or a DNS name: then the
    record is a rewrite (``rewrite stop name KIND FROM TO answer auto``): the name asked is replaced (exact:
    by `target`; suffix: its suffix by `target`; regex: by `target` with each ``{N}`` the pattern's group N)
    and looked up again in the same view, and the answer keeps the name asked.
    """

    kind: str  # EXACT | SUFFIX | REGEX
    name: str  # the name, the suffix or the pattern
    target: str  # an IPv4 address, "proxy", or a DNS name (a rewrite)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"DNS record kind must be exact, suffix or regex (CoreDNS's rewrite name match types; "
                f"prefix and substring are not modelled), got {self.kind!r}"
            )
        if self.kind == REGEX:
            _require_pattern(self.name)
        elif self.kind == SUFFIX:
            _require_hostname(f"suffix record {self.name!r}: the suffix", self.name.removeprefix("."))
        else:
            _require_hostname("exact record name", self.name)
        self._check_target()

    def _check_target(self) -> None:
        if self.target == PROXY:
            return
        if _DOTTED_NUMBERS.fullmatch(self.target):
            _require_ipv4(f"target of record {self.name!r}", self.target)
            return
        # A regex rewrite may build its name from the pattern's groups ({1}.b.test), and a suffix rewrite's
        # replacement may start with its dot (.b.test): check each as the name it becomes.
        filled = _GROUP.sub("x", self.target) if self.kind == REGEX else self.target
        filled = "x" + filled if self.kind == SUFFIX and filled.startswith(".") else filled
        name = normalize_name(filled)
        if name is None or not _HOSTNAME.fullmatch(name) or "." not in name:
            raise ValueError(
                f"target of record {self.name!r} must be proxy, an IPv4 address such as 10.100.0.10 or a "
                f"DNS name such as worker-callback-proxy.nvcf.svc.cluster.local, got {self.target[:80]!r}"
            )
        _require_length(f"target of record {self.name[:80]!r}", name)

    @property
    def is_rewrite(self) -> bool:
        """The target is a name, looked up instead of the name asked (CoreDNS's rewrite plugin)."""
        return self.target != PROXY and not _is_ipv4(self.target)

    def pointing_at(self, proxy_ip: str) -> DnsRecord:
        """This record with a ``proxy`` target replaced by `proxy_ip` (the Service's address when written)."""
        return replace(self, target=proxy_ip) if self.target == PROXY else self

    def describe(self) -> str:
        """How people say it: ``*.grpc-worker.example.com -> 10.100.0.10``."""
        shown = {EXACT: self.name, SUFFIX: f"*{self.name}", REGEX: f"/{self.name}/"}[self.kind]
        return f"{shown} -> {self.target}"

    # -- matching (on a normalised name; each record compiles what it needs once) -------------------
    @cached_property
    def fqdn(self) -> str:
        """An exact name or a suffix as CoreDNS compares it: lower case, with its trailing dot."""
        return self.name.lower().removesuffix(".") + "."

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        return _require_pattern(self.name)

    @cached_property
    def target_fqdn(self) -> str:
        """A name target as CoreDNS normalises it: lower case, with its trailing dot."""
        return self.target.lower().removesuffix(".") + "."

    def matches(self, name: str) -> bool:
        """`name` (normalised: lower case, no trailing dot) is one this record answers or rewrites."""
        fqdn = name + "."
        if self.kind == EXACT:
            return fqdn == self.fqdn
        if self.kind == SUFFIX:
            return fqdn.endswith(self.fqdn)
        return self._pattern.search(fqdn) is not None

    def rewrite(self, name: str) -> str | None:
        """The name looked up instead of `name` (normalised), or None when this rewrite does not apply.
        An empty string means the result is not a usable name (CoreDNS answers that with an error)."""
        fqdn = name + "."
        if self.kind == EXACT:
            result = self.target_fqdn if fqdn == self.fqdn else None
        elif self.kind == SUFFIX:
            result = fqdn[: -len(self.fqdn)] + self.target_fqdn if fqdn.endswith(self.fqdn) else None
        else:
            found = self._pattern.search(fqdn)
            result = None if found is None else _substitute(self.target_fqdn, [found[0], *found.groups()])
        if result is None:
            return None
        return normalize_name(result) or ""


def _substitute(template: str, groups: list[str | None]) -> str:
    """CoreDNS replaces each {N} with group N; a {N} past the last group is left as written."""

    def group(match: re.Match[str]) -> str:
        index = int(match[1])
        return (groups[index] or "") if index < len(groups) else match[0]

    return _GROUP.sub(group, template)


def wildcard(domain: str, target: str) -> DnsRecord:
    """Every name under `domain` answers `target` (``dnsRewrite: {domain, target}``): for an address the
    ``*.<domain>`` record of the seed's step 2; for a name the make target's rewrite,
    ``rewrite name regex ^(.+)\\.<domain>\\.$ <target>``."""
    apex = _require_hostname("workerDomain", domain)
    if target == PROXY or _DOTTED_NUMBERS.fullmatch(target):
        return DnsRecord(SUFFIX, "." + apex, target)
    return DnsRecord(REGEX, "^(.+)\\." + apex.replace(".", "\\.") + "\\.$", target)


@dataclass(frozen=True)
class View:
    """What one cluster's DNS answers: the customer's records (rewrites first), then its own names."""

    cluster: str  # e.g. "ncpsim-cp", "ncpsim-compute-1"
    hosts: tuple[tuple[str, str], ...] = ()  # the cluster's own (fqdn, ipv4) names: pods, Services
    records: tuple[DnsRecord, ...] = ()  # in the order written; no record at all = no rewrite
    ttl: int = 5

    def __post_init__(self) -> None:
        for fqdn, ip in self.hosts:
            _require_hostname(f"host record name in view {self.cluster}", fqdn)
            _require_ipv4(f"host record {fqdn} in view {self.cluster}", ip)
        for record in self.records:
            if record.target == PROXY:
                raise ValueError(
                    f"record {record.describe()} in view {self.cluster}: give it the proxy's address "
                    "first (DnsRecord.pointing_at)"
                )
        if not 0 <= self.ttl <= 2**31 - 1:
            raise ValueError(f"ttl of view {self.cluster} must be 0..2147483647, got {self.ttl}")

    @cached_property
    def _hosts(self) -> dict[str, tuple[str, ...]]:
        """The cluster's own names -> addresses, in order; built once per view (lookups are dict hits)."""
        hosts: dict[str, tuple[str, ...]] = {}
        for fqdn, ip in self.hosts:
            name = normalize_name(fqdn) or ""
            hosts[name] = (*hosts.get(name, ()), ip)
        return hosts

    @cached_property
    def _rewrites(self) -> tuple[DnsRecord, ...]:
        return tuple(r for r in self.records if r.is_rewrite)

    @cached_property
    def _addresses(self) -> tuple[DnsRecord, ...]:
        return tuple(r for r in self.records if not r.is_rewrite)

    def rewritten(self, name: str) -> str | None:
        """The name the first matching rewrite looks up instead (``rewrite stop``: one rewrite per query)."""
        for record in self._rewrites:
            result = record.rewrite(name)
            if result is not None:
                return result
        return None

    def lookup(self, name: str) -> tuple[tuple[str, ...], str] | None:
        """(addresses, "record" | "host") for a normalised name, without rewrites; None: no such name.

        The first address record that matches answers, in the order written (CoreDNS's template plugin
        runs before the kubernetes plugin and tries its templates in order); then the cluster's own names."""
        for record in self._addresses:
            if record.matches(name):
                return (record.target,), "record"
        addresses = self._hosts.get(name)
        return (addresses, "host") if addresses else None


@dataclass(frozen=True)
class Answer:
    rcode: str  # "NOERROR" | "NXDOMAIN" | "SERVFAIL"
    addresses: tuple[str, ...]  # A records (empty for AAAA/other types of a known name)
    matched: str  # "host" | "record" | "rewrite" | "none"  (for traces)


_NXDOMAIN = Answer("NXDOMAIN", (), "none")


def answer(view: View, qname: str, qtype: str) -> Answer:
    """Answer `qname`/`qtype` from `view` alone, as CoreDNS orders its plugins: the first rewrite whose
    name matches replaces the name; then the first address record that matches, then the cluster's own
    names (its pods and Services); else NXDOMAIN.

    A rewritten name is looked up in this same view and answered under the name asked (``answer auto``),
    so a rewrite to a name the cluster lacks is NXDOMAIN. A known name asked for anything but A (or ANY)
    is NOERROR with no addresses (NODATA): the name exists, it has no record of that type. Workers ask
    AAAA too, and NXDOMAIN there would make some stub resolvers give up on the A answer.
    """
    name = normalize_name(qname)
    if name is None:
        return _NXDOMAIN
    matched = "none"
    rewritten = view.rewritten(name)
    if rewritten == "":
        return Answer("SERVFAIL", (), "rewrite")
    if rewritten is not None:
        name, matched = rewritten, "rewrite"
    found = view.lookup(name)
    if found is None:
        return Answer("NXDOMAIN", (), matched)
    addresses, how = found
    wants_a = qtype.upper() in ("A", "ANY")
    return Answer("NOERROR", addresses if wants_a else (), "rewrite" if matched == "rewrite" else how)


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
