"""What a compute cluster's CoreDNS answers for a callback name, read off its configuration (pure).

`rules` lists the directives a customer writes for callbacks as neutral, frozen `Rule`s (the DNS model
builds its records from these): `rewrite name exact|prefix|suffix|substring|regex FROM TO [answer auto]`
(inline or in a `rewrite { ... }` block), `template IN A ZONE { match ...; answer "... IN A IP" }`,
`hosts { IP NAME... }`, and `forward ZONE RESOLVER...`. `resolve` follows one name through them in
CoreDNS's plugin order (rewrite, template, hosts, kubernetes, forward) within the server block that
serves it (the longest zone). Matching is on the lower-cased fully qualified name with its trailing dot,
as CoreDNS's is; regexes are Python's, which agree with Go's RE2 on the forms customers write.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from scenarios.bundle.corefile import Directive, Origin, ServerBlock

MATCHES = ("exact", "prefix", "suffix", "substring", "regex")
_GROUP = re.compile(r"\{(\d+)\}")
_A_RECORD = re.compile(r"\bIN\s+A\s+(\S+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    """One directive that can answer callback names, as written."""

    kind: str  # rewrite | template | hosts | forward
    match: str  # exact | prefix | suffix | substring | regex (rewrite); regex (template); exact (hosts); zone
    name: str  # the name, affix, regex or zone it matches, as written (no trailing dot)
    target: str  # rewrite: the name looked up instead; template/hosts: the IPv4 answered; forward: resolvers
    zone: str  # the server block's (or the template's) zone
    origin: Origin
    answer_auto: bool = False
    stop: bool = True  # rewrite: later rewrite rules are not applied

    def rewrites(self, fqdn: str) -> str | None:
        """A rewrite's new name for `fqdn` (trailing dot), or None when it does not match."""
        source = self.name.lower()
        if self.match == "regex":
            found = re.search(self.name, fqdn)
            if found is None:
                return None
            groups = [found.group(0), *found.groups()]
            return _fqdn(
                _GROUP.sub(
                    lambda m: (groups[int(m[1])] or "") if int(m[1]) < len(groups) else m[0], self.target
                )
            )
        plain = _fqdn(source)
        if self.match == "exact":
            return _fqdn(self.target) if fqdn == plain else None
        if self.match == "suffix":
            affix = source if source.endswith(".") else source + "."
            return fqdn[: -len(affix)] + _fqdn(self.target) if fqdn.endswith(affix) else None
        if self.match == "prefix":
            return _fqdn(self.target + fqdn[len(source) :]) if fqdn.startswith(source) else None
        if self.match == "substring":
            return _fqdn(fqdn.replace(source, self.target.lower(), 1)) if source in fqdn else None
        return None

    def __str__(self) -> str:
        return f"{self.origin}: {self.kind} {self.match} {self.name} -> {self.target}"


@dataclass(frozen=True)
class Resolution:
    """How one name resolves: an address, a name of the cluster's own (its existence unknown to a
    bundle), a question forwarded to another resolver, or no answer at all."""

    name: str
    outcome: str  # address | cluster-name | forwarded | nxdomain
    value: str = ""  # the IPv4, the cluster name, or the resolvers
    looked_up: str = ""  # the name after any rewrite
    via: tuple[Rule, ...] = ()  # the directives that decided it, for citations


def _fqdn(name: str) -> str:
    name = name.lower()
    return name if name.endswith(".") else name + "."


def _in_zone(name: str, zone: str) -> bool:
    return zone == "." or name == zone or name.endswith("." + zone)


def _rewrite_rules(d: Directive, zone: str) -> list[Rule]:
    args = list(d.args)
    stop = not (args and args[0] == "continue")
    if args and args[0] in ("stop", "continue"):
        args = args[1:]
    lines = [([c.name, *c.args], c.origin) for c in d.block] if d.block else [(args, d.origin)]
    auto = any(line[:2] == ["answer", "auto"] for line, _ in lines)
    out = []
    for line, origin in lines:
        if not line or line[0] != "name":
            continue
        kind, rest = (line[1], line[2:]) if len(line) > 3 and line[1] in MATCHES else ("exact", line[1:])
        if len(rest) >= 2:
            found_auto = auto or rest[2:4] == ["answer", "auto"]
            name = rest[0].rstrip(".") if kind != "regex" else rest[0]
            out.append(Rule("rewrite", kind, name, rest[1].rstrip("."), zone, origin, found_auto, stop))
    return out


def _template_rules(d: Directive, zone: str) -> list[Rule]:
    if [a.upper() for a in d.args[:2]] != ["IN", "A"]:
        return []
    zones = [z.rstrip(".").lower() for z in d.args[2:]] or [zone]
    matches = [a for c in d.block if c.name == "match" for a in c.args] or [".*"]
    answers = [" ".join(c.args) for c in d.block if c.name == "answer"]
    found = [_A_RECORD.search(a) for a in answers]
    address = next((m[1] for m in found if m), "")
    return [Rule("template", "regex", pattern, address, z, d.origin) for z in zones for pattern in matches]


def _hosts_rules(d: Directive, zone: str, files: Mapping[str, str]) -> list[Rule]:
    entries = [([c.name, *c.args], c.origin) for c in d.block if _ipv4(c.name)]
    if d.args and d.args[0] in files:  # hosts FILE: k3s's NodeHosts, from the coredns ConfigMap
        entries += [
            (line.split(), d.origin)
            for line in files[d.args[0]].splitlines()
            if _ipv4(line.split()[0] if line.split() else "")
        ]
    return [
        Rule("hosts", "exact", name.rstrip(".").lower(), ip, zone, origin)
        for (ip, *names), origin in entries
        for name in names
    ]


def _ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def block_rules(block: ServerBlock, files: Mapping[str, str] | None = None) -> list[Rule]:
    """The block's callback-answering directives, in CoreDNS's plugin order."""
    zone = block.zones[0]
    out: list[Rule] = []
    for d in block.directives:
        if d.name == "rewrite":
            out += _rewrite_rules(d, zone)
    for d in block.directives:
        if d.name == "template":
            out += _template_rules(d, zone)
    for d in block.directives:
        if d.name == "hosts":
            out += _hosts_rules(d, zone, files or {})
    for d in block.directives:
        if d.name == "forward" and len(d.args) >= 2:
            out.append(Rule("forward", "zone", _zone(d.args[0], zone), " ".join(d.args[1:]), zone, d.origin))
    return out


def _zone(written: str, block_zone: str) -> str:
    zone = written.rstrip(".").lower()
    return block_zone if zone in ("", ".") else zone


_DOMAIN = re.compile(r"[a-z0-9_-]+(?:\\?\.[a-z0-9_-]+)+")


def rule_domain(rule: Rule) -> str:
    """The domain a rule is written for: a regex's longest literal name (`(.*)\\.a\\.example\\.com` ->
    a.example.com, less its first label when that is a pod name's), else the name or zone."""
    if rule.kind == "template":
        return rule.zone
    if rule.match != "regex" or rule.kind == "forward":
        return rule.name.lower()
    found = [m.replace("\\.", ".") for m in _DOMAIN.findall(rule.name.lower())]
    return max(found, key=len, default=rule.name.lower()).strip(".")


def rules(blocks: list[ServerBlock], files: Mapping[str, str] | None = None) -> list[Rule]:
    return [r for b in blocks for r in block_rules(b, files)]


def serving_block(blocks: list[ServerBlock], name: str) -> ServerBlock | None:
    """The server block CoreDNS hands `name` (lower case, no trailing dot) to: the longest zone serving it."""
    served = [b for b in blocks if b.serves(name) >= 0]
    return max(served, key=lambda b: b.serves(name)) if served else None


def resolve(blocks: list[ServerBlock], name: str, files: Mapping[str, str] | None = None) -> Resolution:
    """How `name` resolves in this configuration."""
    name = name.lower().rstrip(".")
    block = serving_block(blocks, name)
    if block is None:
        return Resolution(name, "nxdomain", looked_up=name)
    found = block_rules(block, files)
    fqdn, via = name + ".", []
    for rule in (r for r in found if r.kind == "rewrite"):
        new = rule.rewrites(fqdn)
        if new is not None:
            fqdn = new
            via.append(rule)
            if rule.stop:
                break
    looked_up = fqdn.rstrip(".")
    return _answer(block, found, looked_up, Resolution(name, "nxdomain", looked_up=looked_up, via=tuple(via)))


def _answer(block: ServerBlock, found: list[Rule], name: str, base: Resolution) -> Resolution:
    def done(outcome: str, value: str, rule: Rule | None = None) -> Resolution:
        return Resolution(base.name, outcome, value, name, base.via + ((rule,) if rule else ()))

    fqdn = name + "."
    for rule in (r for r in found if r.kind == "template"):
        if _in_zone(name, rule.zone) and re.search(rule.name, fqdn):
            return done("address" if rule.target else "nxdomain", rule.target, rule)
    for rule in (r for r in found if r.kind == "hosts"):
        if rule.name == name:
            return done("address", rule.target, rule)
    kubernetes = next((d for d in block.directives if d.name == "kubernetes"), None)
    if kubernetes is not None and any(
        _in_zone(name, z.rstrip(".").lower()) for z in kubernetes.args or ("cluster.local",)
    ):
        return done("cluster-name", name)
    forwards = sorted(
        (r for r in found if r.kind == "forward" and _in_zone(name, r.name)), key=lambda r: -len(r.name)
    )
    if forwards:
        return done("forwarded", forwards[0].target, forwards[0])
    return base
