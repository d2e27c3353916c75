"""The compute cluster's CoreDNS rewrite for the k3d backend, rendered from the same `WildcardRule`
the local resolver answers with, plus a tiny evaluator of the rendered text.

Where it lands: k3s's packaged CoreDNS (manifests/coredns.yaml) mounts the optional ConfigMap
``kube-system/coredns-custom`` at ``/etc/coredns/custom`` and its Corefile has
``import /etc/coredns/custom/*.override`` inside the main ``.:53 { ... }`` server block (and
``import /etc/coredns/custom/*.server`` after it). So a ``*.override`` key holds plugin directives
for the block that serves pod DNS, which is where the rewrite must sit to see workers' queries.

What it says (CoreDNS rewrite plugin, documented since 1.8.4; k3s ships 1.11+)::

    rewrite stop {
        name regex ^(.+)\\.grpc-worker\\.example\\.com\\.$ worker-callback-proxy.nvcf.svc.cluster.local.
        answer auto
    }

The name rule makes CoreDNS look up the proxy Service instead of the asked name. `answer auto`
maps the answer's owner name back to the name asked; the explicit `answer name FROM TO` form
cannot, because the per-pod label is gone from the Service name it would have to match.
CoreDNS matches the regex against the lower-cased, fully qualified name (trailing dot), hence
the anchors and the escaped final dot.
"""

from __future__ import annotations

import re
from typing import Any

from dns.rule import WildcardRule, _require_hostname, normalize_name

__all__ = ["CONFIGMAP_KEY", "evaluate_rewrite", "render_coredns_custom"]

CONFIGMAP_KEY = "worker-callback.override"
_GROUP = re.compile(r"\{(\d+)\}")


def render_coredns_custom(rule: WildcardRule, proxy_service_fqdn: str) -> dict[str, Any]:
    """The ``kube-system/coredns-custom`` ConfigMap that makes ``*.<workerDomain>`` resolve to
    `proxy_service_fqdn` (e.g. "worker-callback-proxy.nvcf.svc.cluster.local") in the cluster
    it is applied to, with answers that keep the name asked."""
    target = _require_hostname("proxy Service name", proxy_service_fqdn)
    pattern = "^(.+)\\." + rule.domain.replace(".", "\\.") + "\\.$"
    stanza = (
        f"# ncpsim: *.{rule.domain} -> {target} (the local backend answers {rule.target_ip})\n"
        "rewrite stop {\n"
        f"    name regex {pattern} {target}.\n"
        "    answer auto\n"
        "}\n"
    )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "coredns-custom",
            "namespace": "kube-system",
            "labels": {"app.kubernetes.io/managed-by": "ncpsim"},
        },
        "data": {CONFIGMAP_KEY: stanza},
    }


def evaluate_rewrite(rendered: dict[str, Any], qname: str) -> str | None:
    """The name CoreDNS would look up instead of `qname` under the rendered ConfigMap, without the
    trailing dot; None when no rewrite applies.

    Reads the rules back out of the ConfigMap text (every ``*.override`` key, in the sorted order
    CoreDNS's import glob uses) rather than from the `WildcardRule`, so a test comparing this with
    `WildcardRule.matches` checks what was rendered. Only the ``name`` forms the renderer could
    emit are understood (regex, exact, suffix); anything else raises ValueError.
    """
    name = normalize_name(qname)
    if name is None:
        return None
    current, rewritten = name + ".", False  # CoreDNS matches the FQDN, lower-cased
    for mode, args in _rewrite_rules(rendered):
        result = _apply_name_rule(args, current)
        if result is None:
            continue
        current, rewritten = result, True
        if mode == "stop":
            break
    return current.rstrip(".") if rewritten else None


def _rewrite_rules(rendered: dict[str, Any]) -> list[tuple[str, list[str]]]:
    data = rendered.get("data") or {}
    text = "\n".join(data[key] for key in sorted(data) if key.endswith(".override"))
    rules = []
    for directive in _directives(text):
        if directive[0] != "rewrite":
            continue
        args = directive[1:]
        mode = args.pop(0) if args and args[0] in ("stop", "continue") else "stop"
        rules.append((mode, args))
    return rules


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
    # Corefile tokens are whitespace separated, `#` starts a comment, and a backslash outside
    # quotes is an ordinary character (so regexes need no extra escaping). The renderer never
    # quotes, so quoted tokens are refused rather than half understood.
    code = line.split("#", 1)[0]
    if '"' in code:
        raise ValueError(f"quoted Corefile tokens are not supported: {line.strip()}")
    return code.split()


def _apply_name_rule(args: list[str], name: str) -> str | None:
    if not args or args[0] != "name":
        raise ValueError(f"unsupported rewrite rule: {' '.join(args)}")
    kind, rest = (args[1], args[2:]) if len(args) > 3 else ("exact", args[1:])
    if len(rest) < 2 or rest[2:] not in ([], ["answer", "auto"]):
        raise ValueError(f"unsupported rewrite name rule: {' '.join(args)}")
    source, target = rest[0], rest[1]
    if kind == "regex":
        # Go's FindStringSubmatch: an unanchored search; {N} takes group N ("" if unmatched).
        match = re.search(source, name)
        if match is None:
            return None
        result = _substitute(target, [match.group(0), *match.groups()])
    elif kind == "exact":
        result = target if name == _fqdn(source) else None
    elif kind == "suffix":
        suffix = _fqdn(source)
        result = name[: -len(suffix)] + _fqdn(target) if name.endswith(suffix) else None
    else:
        raise ValueError(f"unsupported rewrite name match type: {kind}")
    return None if result is None else _fqdn(result)


def _substitute(template: str, groups: list[str | None]) -> str:
    """CoreDNS replaces each {N} with group N; a {N} past the last group is left as written."""

    def group(match: re.Match[str]) -> str:
        index = int(match[1])
        return (groups[index] or "") if index < len(groups) else match[0]

    return _GROUP.sub(group, template)


def _fqdn(name: str) -> str:
    # CoreDNS normalises rule targets: lower case, trailing dot.
    name = name.lower()
    return name if name.endswith(".") else name + "."
