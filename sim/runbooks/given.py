"""What a runbook rehearses on: the customer's values (every key set above the chart defaults, by a
scenario's `values`, each `-f` file, `--set`, a step's `setValues`: sim.model.layering) and whether the
stack is a fresh install or an existing one.

A rehearsal merges the values it needs over the runbook's own story (the values the runbook's steps set),
as Helm merges a later file over an earlier one, and says in its steps where each came from. What a
runbook cannot use is named in one line (`unused_line`), never dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.model.layering import DEFAULT, Layered
from sim.model.values import KeyPath, deep_merge, key_path, lookup

FRESH, EXISTING = "fresh", "existing"
INSTALLS = (FRESH, EXISTING)
SHOWN = 6  # keys named in the line of unused values before "and N more"


@dataclass(frozen=True)
class Given:
    """The customer's values as leaves (key path -> (value, where it came from)) and the install."""

    leaves: Mapping[KeyPath, tuple[Any, str]] = field(default_factory=dict)
    install: str | None = None  # FRESH | EXISTING; None: the runbook's own (an existing install)

    def __post_init__(self) -> None:
        if self.install not in (None, *INSTALLS):
            raise ValueError(f"install must be fresh or existing, got {self.install!r}")

    @classmethod
    def of(cls, layered: Layered | None, install: str | None = None) -> Given:
        """The keys `layered` has above the chart defaults, each with its origin ("customer.yaml:3")."""
        if layered is None:
            return cls(install=install)
        leaves = {}
        for parts, value in _leaves(layered.values):
            origin = layered.origins.get(key_path(parts)) or layered.origin_of(parts)
            if origin is not None and origin.kind != DEFAULT:
                leaves[parts] = (value, str(origin))
        return cls(leaves, install)

    def under(self, prefixes: tuple[KeyPath, ...]) -> dict[KeyPath, tuple[Any, str]]:
        return {p: v for p, v in self.leaves.items() if any(p[: len(x)] == x for x in prefixes)}

    def over(self, story: Mapping[str, Any], prefixes: tuple[KeyPath, ...]) -> dict[str, Any]:
        """`story` (the values the runbook's step sets) with the given keys under `prefixes` merged over it."""
        tree: dict[str, Any] = {}
        for parts, (value, _) in self.under(prefixes).items():
            node = tree
            for part in parts[:-1]:
                node = node.setdefault(str(part), {})
            node[str(parts[-1])] = value
        return deep_merge(story, tree)

    def where(self, parts: KeyPath) -> str | None:
        """Where a given key came from; None when the runbook's story or the chart default holds."""
        found = self.leaves.get(parts)
        return found[1] if found else None

    def show(self, values: Mapping[str, Any], parts: KeyPath) -> str:
        """``adminIssuerProxy.enabled: false (customer.yaml:2)``, or without the origin for a story value."""
        value = lookup(values, parts)
        shown = "true" if value is True else "false" if value is False else str(value)
        origin = self.where(parts)
        return f"{key_path(parts)}: {shown}" + (f" ({origin})" if origin else "")

    def unused_line(self, reads: tuple[KeyPath, ...], why: str, reads_install: bool) -> str | None:
        """One line naming every given key (and the install) this runbook does not use, or None."""
        unused = [
            f"{key_path(p)} ({origin})"
            for p, (_, origin) in self.leaves.items()
            if p not in self.under(reads)
        ]
        if self.install is not None and not reads_install:
            unused.append(f"install: {self.install}")
        if not unused:
            return None
        more = f" and {len(unused) - SHOWN} more" if len(unused) > SHOWN else ""
        return f"not used by this runbook: {', '.join(unused[:SHOWN])}{more}: {why}"


def _leaves(values: Mapping[str, Any], parts: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    for key, value in values.items():
        here = (*parts, str(key))
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, here)
        elif not isinstance(value, Mapping):
            yield here, value


NO_VALUES = Given()
