"""A compute cluster's CoreDNS as the DNS model replays it (pure): the directives that answer callback
names (resolve.py's neutral `Rule`s) written as dns.rule records, so a replay answers what CoreDNS answers.

Exact where the model holds the form, which is the forms customers write for callbacks: `rewrite name
exact|suffix|regex FROM TO` (a rewrite record: the name looked up instead must then resolve in the same
cluster, so a rewrite to a Service the compute cluster lacks is NXDOMAIN there too), `template IN A` and
`hosts` (address records; the proxy Service's load-balancer address is replayed as the proxy's, its
ClusterIP as the one compute clusters cannot route to). A record alone for `invocation.<workerDomain>`
stays that one record: HTTP callbacks resolve, gRPC's `<dashed-pod-ip>.<workerDomain>` do not.

What a bundle cannot show is an assumption, said: a callback name forwarded to another resolver (whose
answer is not in the bundle) is taken for the proxy's address when the customer wrote nothing for
callbacks that answers otherwise, or when their rewrite points at a name outside the cluster; an address
with no services.yaml to compare with is taken for the load balancer's. Forms the model does not hold
(prefix and substring rewrites, `rewrite continue`, a template with no A answer) are said as replayed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from dns.rule import EXACT, PROXY, REGEX, SUFFIX, DnsRecord, wildcard
from scenarios.bundle.resolve import Resolution, Rule, block_rules, rule_domain, serving_block
from scenarios.bundle.world import ComputeDns, ProxyService
from sim.model.assumptions import DNS, Assumption
from sim.model.parts import PROXY_CLUSTER_IP

GRPC_EXAMPLE = "10-42-0-41"  # a dashed pod IP: gRPC callbacks resolve <dashed-pod-ip>.<workerDomain>
# Names no customer writes a rule for: a template regex that matches both matches every name.
_ANY_NAMES = ("a.", "ncpsim-never-written-7f3c.example.")
_WILDCARD_REGEX = re.compile(r"\^\(\.\+\)\\\.(?P<domain>.+)\\\.\$")


def callback_names(domain: str) -> tuple[tuple[str, str], ...]:
    """(name, what): HTTP's invocation.<workerDomain> and one gRPC pod's <dashed-pod-ip>.<workerDomain>."""
    return ((f"invocation.{domain}", "HTTP"), (f"{GRPC_EXAMPLE}.{domain}", "gRPC"))


@dataclass(frozen=True)
class Callback:
    """How one callback name fares in a compute cluster's CoreDNS, as a replay takes it."""

    resolution: Resolution
    what: str  # HTTP | gRPC
    # answered: a rule of the customer's decides it (an address, a cluster name, no answer);
    # assumed: forwarded to a resolver the bundle cannot see, taken to answer the proxy's address;
    # other-domain: forwarded while the customer's callback rules are written for another domain;
    # missing: forwarded while a rule answers the other callback name (no wildcard), or no block serves it
    fate: str

    @property
    def rewritten(self) -> bool:
        return any(rule.kind == "rewrite" for rule in self.resolution.via)


def proxy_names(service: ProxyService | None) -> tuple[str, ...]:
    """What a customer's rule answering the proxy names: its load-balancer address or its Service."""
    return (*(service.addresses if service else ()), "worker-callback-proxy")


def callbacks(dns: ComputeDns, domain: str, service: ProxyService | None) -> list[Callback]:
    """The callback names as CoreDNS answers them, each with its fate in a replay."""
    found = [(dns.resolve(name), what) for name, what in callback_names(domain)]
    by_rule = any(rule.kind != "forward" for r, _ in found for rule in r.via)
    other = bool(dns.meant_for_callbacks(domain, proxy_names(service)))
    out = []
    for r, what in found:
        rewritten = any(rule.kind == "rewrite" for rule in r.via)
        if r.outcome in ("address", "cluster-name"):
            fate = "answered"
        elif r.outcome != "forwarded":
            fate = "answered" if r.via else "missing"  # a template with no A answer decides it too
        elif rewritten or not (other or by_rule):
            fate = "assumed"
        else:
            fate = "other-domain" if other else "missing"
        out.append(Callback(r, what, fate))
    return out


@dataclass(frozen=True)
class ReplayedDns:
    """A compute cluster's DNS for a scenario, and what ncpsim assumed to write it."""

    records: tuple[DnsRecord, ...]
    assumed: tuple[Assumption, ...]

    def cluster(self, domain: str) -> dict[str, Any]:
        """The compute cluster's scenario entry: `dnsRewrite` for one wildcard (the seed's record, the
        make target's rewrite), `dnsRecords` for anything else, `dnsRewrite: {target: none}` for nothing."""
        if not self.records:
            return {"dnsRewrite": {"target": "none"}}
        if len(self.records) == 1 and (under := wildcard_domain(self.records[0])) is not None:
            target = self.records[0].target
            return {"dnsRewrite": {"target": target, **({"domain": under} if under != domain else {})}}
        return {"dnsRecords": [{"kind": r.kind, "name": r.name, "target": r.target} for r in self.records]}


def wildcard_domain(record: DnsRecord) -> str | None:
    """The domain `record` is `dns.rule.wildcard` of, written exactly so; None when it is not one."""
    if record.kind == SUFFIX and record.name.startswith("."):
        domain = record.name[1:]
    elif record.kind == REGEX and (m := _WILDCARD_REGEX.fullmatch(record.name)):
        domain = m["domain"].replace("\\.", ".")
    else:
        return None
    try:
        return domain if wildcard(domain, record.target) == record else None
    except ValueError:
        return None


def replayed_dns(dns: ComputeDns, domain: str, service: ProxyService | None) -> ReplayedDns:
    """`dns` as records, in CoreDNS's order (rewrites, templates, hosts), with what it had to assume."""
    fates = callbacks(dns, domain, service)
    records: list[DnsRecord] = []
    assumed: list[Assumption] = []
    for rule in _relevant(dns, domain, service, fates):
        made, said = _record(rule, service, fates)
        records += [r for r in made if r not in records]
        if said:
            written = f"{rule.kind} {rule.match} {rule.name} -> {rule.target or '(no A answer)'}"
            what = f"compute cluster {dns.context}, {dns.cite(rule.origin)}: {written}: {said}"
            assumed.append(Assumption(DNS, what, _check(dns, "a name it answers")))
    for c in (c for c in fates if c.fate == "assumed"):
        r = c.resolution
        record = DnsRecord(EXACT, r.looked_up, PROXY) if c.rewritten else wildcard(domain, PROXY)
        asked = r.looked_up if c.rewritten else f"*.{domain}"
        if record not in records:
            records.append(record)
            assumed.append(
                Assumption(
                    DNS,
                    f"compute cluster {dns.context} forwards {asked} to {r.value}, whose answer a bundle "
                    "cannot show: replayed as the proxy's load-balancer address",
                    _check(dns, r.name),
                )
            )
    return ReplayedDns(tuple(records), tuple(assumed))


def _check(dns: ComputeDns, name: str) -> str:
    return f"check from a pod: kubectl --context {dns.context} run -it --rm dig --image=busybox -- nslookup {name}"


def _relevant(
    dns: ComputeDns, domain: str, service: ProxyService | None, fates: list[Callback]
) -> list[Rule]:
    """The rules that decide callback names, in CoreDNS's order within the block serving them: those a
    callback name went through, those written for names under the workerDomain (hosts per pod name), and
    the customer's callback rules for another domain (which cannot answer the workerDomain's names)."""
    used = {rule for c in fates for rule in c.resolution.via if rule.kind != "forward"}
    out: list[Rule] = []
    for name, _ in callback_names(domain):
        block = serving_block(list(dns.blocks), name)
        for rule in block_rules(block, dns.files) if block is not None else []:
            if rule.kind != "forward" and (rule in used or _under(rule_domain(rule), domain)):
                out += [rule] if rule not in out else []
    for rule in dns.meant_for_callbacks(domain, proxy_names(service)):
        out += [rule] if rule not in out else []
    return out


def _under(name: str, domain: str) -> bool:
    return name == domain or name.endswith("." + domain)


def _record(rule: Rule, service: ProxyService | None, fates: list[Callback]) -> tuple[list[DnsRecord], str]:
    """The records `rule` is, and what replaying it so assumes ("" for nothing)."""
    try:
        if rule.kind == "rewrite":
            return _rewrite(rule, fates)
        address, said = _address(rule.target, service)
        if rule.kind == "hosts":
            return [DnsRecord(EXACT, rule.name, address)], said
        if not rule.target:
            return [], "a template with no A answer; replayed as no record (NXDOMAIN)"
        if all(re.search(rule.name, name) for name in _ANY_NAMES) and rule.zone != ".":
            return [DnsRecord(SUFFIX, "." + rule.zone, address)], said
        if not _under(rule_domain(rule), rule.zone) and rule.zone != ".":
            said = "; ".join(
                filter(None, (said, f"the template's zone {rule.zone} is not replayed, only its match"))
            )
        return [DnsRecord(REGEX, rule.name, address)], said
    except ValueError as exc:
        return [], f"not replayed ({exc})"


def _rewrite(rule: Rule, fates: list[Callback]) -> tuple[list[DnsRecord], str]:
    """A rewrite as a rewrite record; one the model does not hold (prefix, substring) as exact rewrites of
    the callback names it rewrites."""
    said = "" if rule.stop else "`rewrite continue` replayed as stop (one rewrite per query)"
    if rule.match in (EXACT, SUFFIX, REGEX):
        return [DnsRecord(rule.match, rule.name, rule.target)], said
    made = []
    for c in fates:
        new = rule.rewrites(c.resolution.name + ".")
        if rule in c.resolution.via and new:
            made.append(DnsRecord(EXACT, c.resolution.name, new.rstrip(".")))
    return made, f"a {rule.match} rewrite (not modelled) replayed as exact rewrites of the callback names"


def _address(ip: str, service: ProxyService | None) -> tuple[str, str]:
    """An answered address as the replaying stack has it: the load balancer's is the proxy's, the Service's
    ClusterIP the one only the control plane routes to; with no services.yaml, taken for the proxy's."""
    if service is None:
        return PROXY, f"{ip} taken for the proxy's load-balancer address (no services.yaml to compare with)"
    if ip in service.addresses:
        return PROXY, ""
    if ip == service.cluster_ip:
        return PROXY_CLUSTER_IP, ""
    return ip, ""
