"""A cluster's DNS records as CoreDNS config for the k3d backend, rendered from the same `DnsRecord`s the
local resolver answers with, plus a reader of the rendered text (`read_override`) that turns it back into
records, so tests can answer names from what was rendered and compare.

Where it lands: k3s's packaged CoreDNS (manifests/coredns.yaml) mounts the optional ConfigMap
``kube-system/coredns-custom`` at ``/etc/coredns/custom`` and its Corefile has
``import /etc/coredns/custom/*.override`` inside the main ``.:53 { ... }`` server block (and
``import /etc/coredns/custom/*.server`` after it). So a ``*.override`` key holds plugin directives
for the block that serves pod DNS, which is where the records must sit to see workers' queries.

What each record becomes (CoreDNS rewrite plugin, documented since 1.8.4; template plugin; k3s ships 1.11+):

- a name target: a rewrite, as the make target writes it::

      rewrite stop {
          name regex ^(.+)\\.grpc-worker\\.example\\.com\\.$ worker-callback-proxy.nvcf.svc.cluster.local.
          answer auto
      }

  CoreDNS then looks the new name up in the same server; `answer auto` maps the answer's owner name back
  to the name asked. CoreDNS matches the lower-cased, fully qualified name (trailing dot), hence the
  anchors and the escaped final dot.
- an address the cluster has a Service of its own at (the control plane's proxy Service): a rewrite to
  that Service's name, whose ClusterIP k3s picks.
- any other address (the proxy's load balancer, the seed's step 2): a ``template`` answering A with it, and
  NOERROR without records for other types (what a zone holding that A record answers); both fall through
  for every other name. Templates are tried in the order written, after every rewrite and before the
  cluster's own Services, which is the order `dns.rule.answer` follows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dns.rule import EXACT, PROXY, REGEX, SUFFIX, DnsRecord, View, normalize_name

__all__ = [
    "CONFIGMAP_KEY",
    "evaluate_rewrite",
    "pattern_of",
    "read_override",
    "render_coredns_custom",
    "view_of",
]

CONFIGMAP_KEY = "worker-callback.override"
TTL = 5  # seconds, as the local resolver's views answer
_TOKEN = re.compile(r'"(?P<quoted>[^"\\]*)"|(?P<bare>[^\s"#]+)|(?P<comment>#.*)|\s+')
_ANSWER = re.compile(r"\{\{ \.Name \}\} \d+ IN A (?P<ip>[0-9.]+)")


def render_coredns_custom(
    records: Sequence[DnsRecord], services: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The ``kube-system/coredns-custom`` ConfigMap holding `records` (targets resolved: no ``proxy``) in
    the main server block of the cluster it is applied to, in the order given.

    `services` maps an address to the FQDN of a Service the cluster itself has at it (the control plane's
    proxy Service, whose ClusterIP k3s picks): a record for that address is rendered as a rewrite to the
    Service's name. A rewrite runs before every template, so keep such a record clear of the others."""
    for record in records:
        if record.target == PROXY:
            raise ValueError(f"record {record.describe()}: render it with the proxy's address (pointing_at)")
    named = {ip: _require_service(fqdn) for ip, fqdn in (services or {}).items()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "coredns-custom",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/managed-by": "ncpsim"},
        },
        "data": {CONFIGMAP_KEY: "".join(_stanza(record, named) for record in records)},
    }


def _require_service(fqdn: str) -> str:
    name = normalize_name(fqdn)
    if name is None or "." not in name or not re.fullmatch(r"[a-z0-9_.-]+", name):
        raise ValueError(
            f"Service name must be a DNS name such as proxy.nvcf.svc.cluster.local, got {fqdn!r}"
        )
    return name


def _stanza(record: DnsRecord, services: Mapping[str, str]) -> str:
    comment = f"# ncpsim: {record.describe()}\n"
    service = services.get(record.target)
    if record.is_rewrite or service is not None:
        kind, source, target = (
            record.kind,
            record.name if record.kind == REGEX else record.fqdn,
            record.target_fqdn,
        )
        if service is not None:  # the same names, rewritten to the Service's own name
            kind, source, target = (
                (EXACT, record.fqdn, service + ".")
                if record.kind == EXACT
                else (REGEX, pattern_of(record), service + ".")
            )
            comment = f"# ncpsim: {record.describe()}, the address of {service}\n"
        return f"{comment}rewrite stop {{\n    name {kind} {source} {target}\n    answer auto\n}}\n"
    match = pattern_of(record)
    return (
        f"{comment}template IN A {{\n    match {match}\n"
        f'    answer "{{{{ .Name }}}} {TTL} IN A {record.target}"\n    fallthrough\n}}\n'
        f"template IN ANY {{\n    match {match}\n    rcode NOERROR\n    fallthrough\n}}\n"
    )


def pattern_of(record: DnsRecord) -> str:
    """The record's names as one anchored RE2 pattern over the FQDN (only dots need escaping: names are LDH)."""
    if record.kind == REGEX:
        return record.name
    escaped = record.fqdn.replace(".", "\\.")
    if record.kind == EXACT:
        return f"^{escaped}$"
    # A leading dot means "under the domain": at least one label before it, as the wildcard has.
    return f"^(.+){escaped}$" if record.fqdn.startswith(".") else f"^(.*){escaped}$"


# -- reading the rendered text back -----------------------------------------------------------------
def read_override(rendered: dict[str, Any]) -> tuple[tuple[str, DnsRecord], ...]:
    """The records the rendered ConfigMap holds, in the order CoreDNS applies them, each with its rewrite
    mode ("stop" | "continue"; "" for a template): every ``*.override`` key in the sorted order of
    CoreDNS's import glob. Only the forms the renderer emits are understood; anything else raises ValueError.
    """
    data = rendered.get("data") or {}
    text = "\n".join(data[key] for key in sorted(data) if key.endswith(".override"))
    found: list[tuple[str, DnsRecord]] = []
    for directive in _directives(text):
        if directive[0] == "rewrite":
            args = directive[1:]
            mode = args.pop(0) if args and args[0] in ("stop", "continue") else "stop"
            found.append((mode, _name_rule(args)))
        elif directive[0] == "template":
            record = _template(directive[1:])
            if record is not None:
                found.append(("", record))
    return tuple(found)


def view_of(rendered: dict[str, Any], cluster: str, hosts: tuple[tuple[str, str], ...] = ()) -> View:
    """What the cluster would answer under the rendered ConfigMap, as a `View` of what was read back (with
    the cluster's own names as `hosts`): answer names from it and from the local view, and compare."""
    records = []
    for mode, record in read_override(rendered):
        if mode == "continue":
            raise ValueError(f"rewrite continue is not modelled by a view: {record.describe()}")
        records.append(record)
    return View(cluster, hosts, tuple(records))


def evaluate_rewrite(rendered: dict[str, Any], qname: str) -> str | None:
    """The name CoreDNS would look up instead of `qname` under the rendered ConfigMap, without the
    trailing dot; None when no rewrite applies (``rewrite continue`` rules chain, ``stop`` ends)."""
    name = normalize_name(qname)
    if name is None:
        return None
    current, rewritten = name, False
    for mode, record in read_override(rendered):
        result = record.rewrite(current) if mode else None
        if not result:
            continue
        current, rewritten = result, True
        if mode == "stop":
            break
    return current if rewritten else None


def _name_rule(args: list[str]) -> DnsRecord:
    if not args or args[0] != "name":
        raise ValueError(f"unsupported rewrite rule: {' '.join(args)}")
    kind, rest = (args[1], args[2:]) if len(args) > 3 else (EXACT, args[1:])
    if len(rest) < 2 or rest[2:] not in ([], ["answer", "auto"]):
        raise ValueError(f"unsupported rewrite name rule: {' '.join(args)}")
    if kind not in (EXACT, SUFFIX, REGEX):
        raise ValueError(f"unsupported rewrite name match type: {kind}")
    source, target = rest[0], rest[1]
    return DnsRecord(kind, source if kind == REGEX else source.lower().removesuffix("."), target)


def _template(args: list[str]) -> DnsRecord | None:
    """``template IN A { match P; answer "..."; fallthrough }`` -> DnsRecord(regex, P, ip); its NODATA
    companion (``template IN ANY { match P; rcode NOERROR; fallthrough }``) says nothing more."""
    head, body, settings = args[:2], list(args[2:]), {}
    while body:
        key = body.pop(0)
        if key != "fallthrough" and (key not in ("match", "answer", "rcode") or not body):
            raise ValueError(f"unsupported template: {' '.join(args)}")
        settings[key] = body.pop(0) if key != "fallthrough" else ""
    if "fallthrough" not in settings or "match" not in settings:
        # Without fallthrough a template answers every other name of the server block too: a broken render.
        raise ValueError(f"a template needs match and fallthrough: {' '.join(args)}")
    if head == ["IN", "ANY"] and settings.get("rcode") == "NOERROR" and "answer" not in settings:
        return None
    answer = _ANSWER.fullmatch(settings.get("answer", ""))
    if head != ["IN", "A"] or answer is None:
        raise ValueError(f"unsupported template: {' '.join(args)}")
    return DnsRecord(REGEX, settings["match"], answer["ip"])


def _directives(text: str) -> list[list[str]]:
    """Split Corefile text into directives: a line's tokens plus, for a ``{`` block, the block's
    tokens (CoreDNS's rewrite setup reads a block's lines as one argument list)."""
    directives: list[list[str]] = []
    block: list[str] | None = None
    for line in text.splitlines():
        tokens = _tokens(line)
        if block is not None:
            if tokens and tokens[-1] == "}":
                block.extend(tokens[:-1])
                block = None
            else:
                block.extend(tokens)
        elif tokens and tokens[-1] == "{":
            block = tokens[:-1]
            directives.append(block)
        elif tokens:
            directives.append(tokens)
    if block is not None:
        raise ValueError("unterminated { block in the rendered Corefile snippet")
    return directives


def _tokens(line: str) -> list[str]:
    # Corefile tokens are whitespace separated, `#` starts a comment, and a backslash outside quotes is an
    # ordinary character (so regexes need no extra escaping). A quoted token keeps its spaces; the renderer
    # quotes only a template's answer, with no quote or backslash inside, so nothing more is understood.
    tokens, pos = [], 0
    while pos < len(line):
        found = _TOKEN.match(line, pos)
        if found is None:
            raise ValueError(f"unsupported quoting in Corefile line: {line.strip()}")
        if found["comment"] is not None:
            break
        token = found["quoted"] if found["quoted"] is not None else found["bare"]
        if token is not None:
            tokens.append(token)
        pos = found.end()
    return tokens
