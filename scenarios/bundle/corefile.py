"""CoreDNS configuration as the customer wrote it: the Corefile and coredns-custom, parsed (pure).

CoreDNS reads a Corefile of server blocks (`ZONE[:PORT]... { directive args... }`), a directive's own
block in braces, `#` comments and quoted tokens. k3s's and AKS's Corefiles import the optional ConfigMap
`kube-system/coredns-custom`, mounted at /etc/coredns/custom: `import /etc/coredns/custom/*.override`
inside the main block adds directives there, `import /etc/coredns/custom/*.server` adds server blocks.
`parse_cluster` follows those imports (glob over the ConfigMap's keys, sorted, as CoreDNS's glob is) and
keeps, for every directive, the ConfigMap key and line it came from, so a finding can cite it.
Anything it cannot read is a CorefileError with that line, never a guess.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass

CUSTOM_DIR = "/etc/coredns/custom/"


class CorefileError(ValueError):
    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True)
class Origin:
    """Where a directive was written: the ConfigMap, its key and the line in that key's text."""

    configmap: str  # coredns | coredns-custom
    key: str  # Corefile, callbacks.override, ...
    line: int

    def __str__(self) -> str:
        return f"{self.configmap} {self.key}:{self.line}"


@dataclass(frozen=True)
class Directive:
    name: str
    args: tuple[str, ...]
    block: tuple[Directive, ...]
    origin: Origin


@dataclass(frozen=True)
class ServerBlock:
    zones: tuple[str, ...]  # lower case, no trailing dot, port dropped; "." is the root
    directives: tuple[Directive, ...]
    origin: Origin

    def serves(self, name: str) -> int:
        """How specifically this block serves `name`: the longest zone that covers it (-1: none)."""
        best = -1
        for zone in self.zones:
            if zone == "." or name == zone or name.endswith("." + zone):
                best = max(best, 0 if zone == "." else len(zone))
        return best


@dataclass(frozen=True)
class _Token:
    text: str
    line: int
    quoted: bool = False


def tokens(text: str) -> list[_Token]:
    """Corefile tokens: whitespace separated, `{` and `}` on their own, "quoted" (with \\" inside),
    `#` to the end of the line outside quotes."""
    out: list[_Token] = []
    for number, line in enumerate(text.splitlines(), start=1):
        i, n = 0, len(line)
        while i < n:
            ch = line[i]
            if ch.isspace():
                i += 1
            elif ch == "#":
                break
            elif ch in "{}":
                out.append(_Token(ch, number))
                i += 1
            elif ch == '"':
                end, word = i + 1, []
                while end < n and line[end] != '"':
                    if line[end] == "\\" and end + 1 < n and line[end + 1] == '"':
                        end += 1
                    word.append(line[end])
                    end += 1
                if end >= n:
                    raise CorefileError(f"line {number}", "a quoted token is not closed")
                out.append(_Token("".join(word), number, quoted=True))
                i = end + 1
            else:
                end = i
                while end < n and not line[end].isspace() and line[end] not in '{}"' and line[end] != "#":
                    end += 1
                out.append(_Token(line[i:end], number))
                i = end
    return out


def _lines(found: list[_Token]) -> list[list[_Token]]:
    """Tokens grouped by line, with `{` and `}` as separate groups in order."""
    groups: list[list[_Token]] = []
    for token in found:
        if not token.quoted and token.text in "{}":
            groups.append([token])
        elif groups and groups[-1][-1].line == token.line and groups[-1][0].text not in "{}":
            groups[-1].append(token)
        else:
            groups.append([token])
    return groups


def _directives(groups: list[list[_Token]], start: int, at: tuple[str, str]) -> tuple[list[Directive], int]:
    """Directives from groups[start] to the matching `}` (or the end); (directives, next index)."""
    out: list[Directive] = []
    i = start
    while i < len(groups):
        group = groups[i]
        if group[0].text == "}" and not group[0].quoted:
            return out, i + 1
        if group[0].text == "{" and not group[0].quoted:
            raise CorefileError(f"{at[1]}:{group[0].line}", "a { without a directive before it")
        block: list[Directive] = []
        i += 1
        if i < len(groups) and groups[i][0].text == "{" and not groups[i][0].quoted:
            block, i = _directives(groups, i + 1, at)
        origin = Origin(at[0], at[1], group[0].line)
        out.append(Directive(group[0].text, tuple(t.text for t in group[1:]), tuple(block), origin))
    if start > 0:
        raise CorefileError(f"{at[1]}:{groups[start - 1][0].line}", "a { block is not closed")
    return out, i


def _zone(key: str) -> str:
    zone = key.lower()
    for scheme in ("dns://", "tls://", "grpc://", "https://"):
        zone = zone.removeprefix(scheme)
    zone = zone.rsplit(":", 1)[0] if ":" in zone else zone
    zone = zone.rstrip(".")
    return zone or "."


def parse_corefile(text: str, configmap: str, key: str) -> tuple[list[ServerBlock], list[Directive]]:
    """(server blocks, top-level imports) of one Corefile text."""
    groups = _lines(tokens(text))
    blocks: list[ServerBlock] = []
    imports: list[Directive] = []
    i = 0
    while i < len(groups):
        group = groups[i]
        origin = Origin(configmap, key, group[0].line)
        if group[0].text == "import" and not (i + 1 < len(groups) and groups[i + 1][0].text == "{"):
            imports.append(Directive("import", tuple(t.text for t in group[1:]), (), origin))
            i += 1
            continue
        if i + 1 >= len(groups) or groups[i + 1][0].text != "{":
            raise CorefileError(f"{key}:{group[0].line}", f"{group[0].text!r} is not followed by a {{ block")
        directives, i = _directives(groups, i + 2, (configmap, key))
        zones = tuple(_zone(t.text) for t in group)
        blocks.append(ServerBlock(zones, tuple(directives), origin))
    return blocks, imports


def _custom_keys(pattern: str, custom: Mapping[str, str]) -> list[str]:
    if not pattern.startswith(CUSTOM_DIR):
        return []
    return sorted(k for k in custom if fnmatch.fnmatchcase(k, pattern[len(CUSTOM_DIR) :]))


def _expand(directives: tuple[Directive, ...], custom: Mapping[str, str]) -> tuple[Directive, ...]:
    """A block's directives with `import /etc/coredns/custom/*.override` replaced by those keys'."""
    out: list[Directive] = []
    for d in directives:
        if d.name != "import":
            out.append(d)
            continue
        for key in _custom_keys(d.args[0] if d.args else "", custom):
            groups = _lines(tokens(custom[key]))
            found, _ = _directives(groups, 0, ("coredns-custom", key))
            out += found
    return tuple(out)


def parse_cluster(corefile: str, custom: Mapping[str, str] | None) -> tuple[list[ServerBlock], list[str]]:
    """A compute cluster's DNS configuration: every server block with coredns-custom imported where the
    Corefile imports it; and notes (coredns-custom keys no import reaches: CoreDNS ignores them)."""
    custom = custom or {}
    blocks, imports = parse_corefile(corefile, "coredns", "Corefile")
    used: set[str] = set()
    expanded: list[ServerBlock] = []
    for block in blocks:
        for d in block.directives:
            if d.name == "import" and d.args:
                used.update(_custom_keys(d.args[0], custom))
        expanded.append(ServerBlock(block.zones, _expand(block.directives, custom), block.origin))
    for d in imports:
        for key in _custom_keys(d.args[0] if d.args else "", custom):
            used.add(key)
            servers, _ = parse_corefile(custom[key], "coredns-custom", key)
            expanded += [ServerBlock(s.zones, _expand(s.directives, custom), s.origin) for s in servers]
    notes = [
        f"coredns-custom {key}: no import in the Corefile reaches it, so CoreDNS ignores it"
        for key in sorted(set(custom) - used)
    ]
    return expanded, notes
