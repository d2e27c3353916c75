"""A customer's clusters for the support-bundle collector's tests: `kubectl` and `helm` that answer from
$NCPSIM_FAKE_CLUSTER (JSON), read-only, in the real tools' output formats.

The JSON: {"contexts": {CONTEXT: {"objects": [Kubernetes objects], "logs": {KEY: text}}},
"releases": [helm list items]}. Log KEYs are `NAMESPACE/deploy/NAME` or `NAMESPACE/SELECTOR`.
`kubectl get` prints YAML the way kubectl does (sigs.k8s.io/yaml over go-yaml v2: keys sorted, a list's
dashes at its key's indent, multi-line strings as literal blocks), because the collector's filters read
that layout. Standard library only: the fakes run without site-packages (tests/fakebin/fake.py).
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

KINDS = {"svc": "Service", "service": "Service", "secret": "Secret", "configmap": "ConfigMap", "pods": "Pod"}
PLURAL = {"Service": "services", "Secret": "secrets", "ConfigMap": "configmaps", "Pod": "pods"}
_PLAIN = re.compile(r"^[A-Za-z0-9_./*][A-Za-z0-9_./:=+,@* ()-]*$")
_NOT_TEXT = re.compile(r"^[-+]?[0-9][0-9_.:eE+-]*$|^[0-9]{4}-[0-9]{2}-[0-9]{2}")  # a number or a timestamp
_SPECIAL = {"", "true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if (
        text.lower() in _SPECIAL
        or not _PLAIN.match(text)
        or text.startswith("*")
        or (_NOT_TEXT.match(text) and text.count(".") != 3)  # an IPv4 address stays plain
        or text != text.strip()
        or ": " in text
    ):
        return json.dumps(text)
    return text


def _literal(text: str, indent: int) -> list[str]:
    head = "|" if text.endswith("\n") and not text.endswith("\n\n") else "|-"
    pad = " " * indent
    return [head, *[f"{pad}{line}" if line else "" for line in text.rstrip("\n").split("\n")]]


def emit(value: Any, indent: int = 0) -> list[str]:
    """go-yaml v2's block style for a JSON value, as lines."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        lines: list[str] = []
        for key in sorted(value):
            item = value[key]
            name = _scalar(key)
            if isinstance(item, str) and "\n" in item:
                head, *body = _literal(item, indent + 2)
                lines += [f"{pad}{name}: {head}", *body]
            elif isinstance(item, dict) and item:
                lines += [f"{pad}{name}:", *emit(item, indent + 2)]
            elif isinstance(item, list) and item:
                lines += [f"{pad}{name}:", *emit(item, indent)]
            else:
                lines.append(f"{pad}{name}: {'[]' if item == [] else '{}' if item == {} else _scalar(item)}")
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            inner = emit(item, indent + 2)
            lines += [f"{pad}- {inner[0].lstrip()}", *inner[1:]]
        return lines
    return [pad + _scalar(value)]


def _selected(obj: dict, selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        key, _, want = term.partition("=")
        if key not in labels or (want and labels[key] != want):
            return False
    return True


def _option(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _words(args: list[str]) -> list[str]:
    """Positional words: the flags that take a value skip it."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in (
            "-n",
            "--namespace",
            "-l",
            "--selector",
            "-o",
            "--output",
            "--context",
            "--kube-context",
        ):
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def _get(cluster: dict, args: list[str]) -> int:
    words = _words(args)
    kind = KINDS[words[1]]
    names = words[2:]
    everywhere = "-A" in args or "--all-namespaces" in args
    namespace = _option(args, "-n", "--namespace") or "default"
    found = [
        o
        for o in cluster.get("objects", [])
        if o["kind"] == kind
        and (everywhere or o["metadata"].get("namespace") == namespace)
        and (not names or o["metadata"]["name"] in names)
        and _selected(o, _option(args, "-l", "--selector"))
    ]
    code = 0
    for name in names:
        if not any(o["metadata"]["name"] == name for o in found):
            print(f'Error from server (NotFound): {PLURAL[kind]} "{name}" not found', file=sys.stderr)
            code = 1
    if names and not found:
        return code
    doc: Any = (
        found[0]
        if len(names) == 1
        else {"apiVersion": "v1", "items": found, "kind": "List", "metadata": {"resourceVersion": ""}}
    )
    print("\n".join(emit(doc)))
    return code


def _world() -> dict[str, Any]:
    with open(os.environ["NCPSIM_FAKE_CLUSTER"]) as handle:
        return dict(json.load(handle))


def kubectl(args: list[str]) -> int:
    world = _world()
    if args[:1] == ["version"]:
        print("Client Version: v1.30.2")
        return 0
    context = _option(args, "--context")
    cluster = world["contexts"].get(context)
    if cluster is None:
        print(f'error: context "{context}" does not exist', file=sys.stderr)
        return 1
    verb = _words(args)[0]
    if verb == "get":
        return _get(cluster, args)
    if verb == "logs":
        namespace = _option(args, "-n", "--namespace") or "default"
        target = _option(args, "-l", "--selector") or _words(args)[1]
        text = cluster.get("logs", {}).get(f"{namespace}/{target}")
        if text is None:
            print(f'error: error from server (NotFound): "{target}" not found', file=sys.stderr)
            return 1
        print(text, end="")
        return 0
    print(f"fake kubectl: a collector must only read, not {verb!r}", file=sys.stderr)
    return 2


def helm(args: list[str]) -> int:
    world = _world()
    words = _words(args)
    if words[:1] == ["version"]:
        print("v3.15.2+g1a500d5")
        return 0
    if words[:1] == ["list"]:
        print("\n".join(emit(world.get("releases", []))))
        return 0
    print(f"fake helm: a collector must only read, not {words!r}", file=sys.stderr)
    return 2
