"""Where each value of a running stack came from, kept beside it (`ncpsim values`, as `helm get values`).

A scenario's layering knows every key's origin (default, scenario, `-f FILE:LINE`, `--set`) when the stack
comes up; `set` and `set --unset` change values later, on the running stack. The origins are kept in the
state folder (`values-origins.json`: key path -> label, for the values a user set) and updated by each step
that changes values, so the view reads the values as they are now with the layer each came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certs.inspect import summary
from clusters.state import write_file
from sim.model.layering import DEFAULT, Layered
from sim.model.values import DEFAULTS, KeyPath, key_path, lookup

ORIGINS = "values-origins.json"
UNSET = object()


@dataclass(frozen=True)
class Value:
    """One leaf of the effective values, and the layer it came from."""

    path: str
    value: Any
    origin: str  # "default", "scenario http-callback", "customer.yaml:3", "--set a.b=c", "ncpsim set"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.path, "value": self.value, "from": self.origin}

    def text(self) -> str:
        """`key: value  # origin`, one line whatever the value (a PEM shows its subject and fingerprint)."""
        value = self.value
        if isinstance(value, str) and "-----BEGIN " in value:
            shown = summary(value)
        else:
            shown = json.dumps(value, default=str)
        return f"{self.path}: {shown}  # {self.origin}"


def leaves(values: Mapping[str, Any], parts: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every value that is not a mapping (a list is a value, as Helm merges it); an empty mapping too."""
    for key, value in values.items():
        here = (*parts, str(key))
        if isinstance(value, Mapping) and value:
            yield from leaves(value, here)
        else:
            yield here, value


def save(state_dir: Path, layered: Layered) -> None:
    """At `up`: the origin of every leaf a user's layer set (defaults are left out: they are the default)."""
    found = {}
    for parts, _ in leaves(layered.values):
        origin = layered.origin_of(parts)
        if origin is not None and origin.kind != DEFAULT:
            found[key_path(parts)] = str(origin)
    write_file(state_dir / ORIGINS, json.dumps(found, indent=2, sort_keys=True) + "\n")


def load(state_dir: Path) -> dict[str, str]:
    try:
        raw = json.loads((state_dir / ORIGINS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def record(state_dir: Path, overrides: Mapping[str, Any], label: str) -> None:
    """A step's setValues: its leaves now come from `label` (anything that was under a replaced key goes)."""
    origins = load(state_dir)
    for parts, _ in leaves(overrides):
        path = key_path(parts)
        for known in [k for k in origins if k.startswith((f"{path}.", f"{path}["))]:
            del origins[known]
        origins[path] = label
    write_file(state_dir / ORIGINS, json.dumps(origins, indent=2, sort_keys=True) + "\n")


def forget(state_dir: Path, paths: Sequence[KeyPath]) -> None:
    """`set --unset`: those keys (and everything under them) are the chart's defaults again."""
    origins = load(state_dir)
    for parts in paths:
        path = key_path(parts)
        for known in [k for k in origins if k == path or k.startswith((f"{path}.", f"{path}["))]:
            del origins[known]
    write_file(state_dir / ORIGINS, json.dumps(origins, indent=2, sort_keys=True) + "\n")


def unset(values: Mapping[str, Any], parts: tuple[str, ...], above: KeyPath = ()) -> dict[str, Any]:
    """`values` with the key at `parts` back to the chart's default (gone, where the chart has none, with
    any mapping it leaves empty that the chart does not have either)."""
    head, *rest = parts
    here = (*above, head)
    copy = dict(values)
    if not rest:
        default = lookup(DEFAULTS, here, UNSET)
        if default is UNSET:
            copy.pop(head, None)
        else:
            copy[head] = default
        return copy
    below = copy.get(head)
    if isinstance(below, Mapping):
        copy[head] = unset(below, tuple(rest), here)
        if not copy[head] and lookup(DEFAULTS, here, UNSET) is UNSET:
            del copy[head]
    return copy


def effective(values: Mapping[str, Any], origins: Mapping[str, str], everything: bool = False) -> list[Value]:
    """The values as the stack has them now, each with its origin; only what users set unless `everything`.

    A value that differs from the chart's default but has no recorded origin (a state folder from before
    origins were kept) is shown as "set (origin not recorded)", never as a default."""
    shown = []
    for parts, value in leaves(values):
        path = key_path(parts)
        origin = origins.get(path)
        if origin is None and lookup(DEFAULTS, parts, UNSET) != value:
            origin = "set (origin not recorded)"
        if origin is not None or everything:
            shown.append(Value(path, value, origin or DEFAULT))
    return shown
