"""A render refusal's fix, as values (pure): what a ticket for a refused render runs.

In the field a refused render deploys nothing, so there is no running stack to fix. A ticket is still one
scenario: its stack runs the customer's values as the fix makes them, its first step applies the keys the
render refused, as the customer set them, and is refused as their `helmfile sync` was (a refused change
changes nothing), and its last calls back through the fixed values. One scenario, not two: one replay
shows both, and the refusal is judged on the very values the last step then runs.

The fix of every render cause is a key to change: each refused key back to the chart's default (a
split-plane URL empty, an invocationProxyURL unset, nats.workerAuth nkey, the webhook URL the in-cluster
API's, a reserved annotation gone), an annotation value quoted. A refusal it cannot fix so is said, in one
line, and the ticket replays the refusal alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scenarios.diagnose.judge import RenderIssue
from scenarios.origins import unset
from sim.errors import ConfigError
from sim.model.layering import parse_key
from sim.model.values import KeyPath, deep_merge, key_path, lookup, nested
from sim.model.values_check import validate

_ABSENT = object()


@dataclass(frozen=True)
class RenderFix:
    values: dict[str, Any]  # the customer's values, each refused key fixed
    refused: dict[str, Any]  # the refused keys as the customer set them: the first step's setValues
    message: str  # what the render says of the first refused key (the first step expects it)
    done: tuple[str, ...]  # what the fix did, key by key


def render_fix(values: Mapping[str, Any], issues: Sequence[RenderIssue]) -> RenderFix | str:
    """The fixed values and the refused change; or, when a refusal is not a key the customer set, why not."""
    fixed: dict[str, Any] = dict(values)
    refused: dict[str, Any] = {}
    done: list[str] = []
    handled: set[KeyPath] = set()
    for issue in issues:
        try:
            parts = parse_key(issue.path)
        except ConfigError:
            return f"{issue.path}: not a key path ncpsim can set back ({issue.message})"
        if parts in handled:  # a reserved key with a value that is no string: gone already
            continue
        handled.add(parts)
        set_to = lookup(values, parts, _ABSENT)
        if set_to is _ABSENT:
            return f"{issue.path} is not in the customer's values: {issue.message}; fix it by hand"
        refused = deep_merge(refused, nested(parts, set_to))
        if "must be a string" in issue.message and not isinstance(set_to, str):
            fixed = deep_merge(fixed, nested(parts, json.dumps(set_to)))
            done.append(f"{key_path(parts)} quoted")
        else:
            fixed = unset(fixed, parts)
            done.append(f"{key_path(parts)} back to the chart's default")
    left = validate(fixed)
    if left:
        return f"the values are still refused once fixed so ({left[0]}); fix them by hand"
    return RenderFix(fixed, refused, issues[0].message, tuple(dict.fromkeys(done)))
