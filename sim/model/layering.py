"""Helm's precedence in one place: chart defaults < a scenario's `values` < each `-f FILE` in order <
`--set key.path=value` < a step's `setValues`.

`layer()` merges the layers and remembers, for every key, which layer set it (`FILE:LINE`, `scenario
NAME`, `default`, `--set ...`). The report's list of overridden scenario values, the unknown-key warnings
and the locations in validation errors are all read from that one answer. Pure: files are read by
`sim.model.values_file`, `--set` text is parsed here.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from sim.errors import ConfigError
from sim.model import untrusted
from sim.model.not_modelled import NOT_MODELLED, NOT_MODELLED_MAPS
from sim.model.values import ANNOTATION_MAPS, DEFAULTS, KeyPath, deep_merge, key_path, lookup
from sim.model.values_check import check

DEFAULT, SCENARIO, FILE, SET, STEP = "default", "scenario", "file", "set", "step"
CUSTOMER = (FILE, SET)  # the layers a support engineer brings on top of a scenario

# Real stack keys without a default here (named in the seeds, or read by a renderer), so a customer file
# that sets them is not told they are unknown.
SEED_KEYS: tuple[KeyPath, ...] = (
    ("nats", "image"),  # clusters/render/nats.py: the nats-server image for the k3d backend
    ("nats", "jetstream", "ackWaitSeconds"),  # sim/nats: the work consumer's ack wait
    ("nats", "jetstream", "publishTimeoutSeconds"),  # sim/nats: one publish attempt of the pods
    ("nats", "config", "merge", "authorization", "timeout"),  # the nats servers' auth timeout
    ("invocation", "workerTls"),
    ("natsAuthCalloutService", "serviceConfig", "logging"),
    ("workerCallbackProxy", "tls", "frontend", "certificate", "issuerRef", "kind"),
    ("workerCallbackProxy", "tls", "frontend", "certificate", "issuerRef", "name"),
    ("workerCallbackProxy", "tls", "frontend", "certificate", "issuerRef", "group"),
)
# Mappings whose keys are the user's own (annotations, environment variables, image fields, log settings).
OPEN_MAPS: tuple[KeyPath, ...] = (
    *ANNOTATION_MAPS,
    ("invocation", "env"),
    ("workerCallbackProxy", "image"),
    ("nats", "image"),
    ("natsAuthCalloutService", "serviceConfig", "logging"),
    *NOT_MODELLED_MAPS,
)
# How alike a misspelling must be to its key (difflib ratio): a sibling first, then any key of that name.
SIBLING_CUTOFF, ANYWHERE_CUTOFF = 0.75, 0.85


@dataclass(frozen=True)
class KeyOrigin:
    """Where one key's value came from, as a person reads it."""

    kind: str  # DEFAULT | SCENARIO | FILE | SET | STEP
    label: str  # "customer.yaml:3", "scenario http-callback", "default", "--set a.b=c", "step 2 setValues"
    file: str | None = None  # the file and line validation errors name (scenario and step values too)
    line: int | None = None

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Layer:
    """One source of values: its kind, its name, the mapping, and the line each key path sits on."""

    kind: str
    name: str  # scenario name, file path, the `--set` argument, or "step N"
    values: Mapping[str, Any]
    lines: Mapping[str, tuple[str, int]] = field(default_factory=dict)  # key path -> (file, 1-based line)

    def origin(self, path: str) -> KeyOrigin:
        file, line = self.lines.get(path, (None, None))
        if self.kind == FILE:
            return KeyOrigin(FILE, f"{self.name}:{line}" if line else self.name, self.name, line)
        if self.kind == SCENARIO:
            return KeyOrigin(SCENARIO, f"scenario {self.name}", file, line)
        if self.kind == STEP:
            return KeyOrigin(STEP, f"{self.name} setValues", file, line)
        if self.kind == SET:
            return KeyOrigin(SET, f"--set {self.name}", f"--set {self.name}")
        return KeyOrigin(DEFAULT, DEFAULT)


@dataclass(frozen=True)
class Override:
    """A scenario value that a customer file or `--set` replaced."""

    path: str
    scenario_value: Any
    value: Any
    scenario: KeyOrigin
    by: KeyOrigin

    def __str__(self) -> str:
        return (
            f"{self.path}: {_show(self.value)} from {self.by} "
            f"(the {self.scenario} had {_show(self.scenario_value)})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.path,
            "value": self.value,
            "from": str(self.by),
            "scenarioValue": self.scenario_value,
            "scenario": str(self.scenario),
        }


@dataclass(frozen=True)
class UnknownKey:
    """A key the stack does not know: the real chart accepts it silently, which is often the field bug."""

    path: str
    origin: KeyOrigin
    suggestion: str | None

    def __str__(self) -> str:
        hint = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        return f"{self.origin}: unknown key {self.path}{hint}"


@dataclass(frozen=True)
class AcceptedKey:
    """A key the chart has and ncpsim accepts but does not model: said, so it neither vanishes nor reads
    as a typo (sim.model.not_modelled holds the list and what each key would do in the field)."""

    path: str
    origin: KeyOrigin
    why: str

    def __str__(self) -> str:
        return f"{self.origin}: {self.path}: accepted, not modelled ({self.why})"

    def to_json(self) -> dict[str, str]:
        return {"key": self.path, "from": str(self.origin), "why": self.why}


@dataclass(frozen=True)
class Layered:
    """The merged values and, for every key path in them, the layer that set it."""

    values: dict[str, Any]
    origins: Mapping[str, KeyOrigin]
    overrides: tuple[Override, ...] = ()
    unknown: tuple[UnknownKey, ...] = ()
    accepted: tuple[AcceptedKey, ...] = ()  # keys ncpsim accepts but does not model, where they were set

    def locations(self) -> dict[str, tuple[str, int | None]]:
        """File and line per key for validation errors; defaults name nothing (the user did not set them)."""
        return {path: (o.file, o.line) for path, o in self.origins.items() if o.file is not None}

    def check(self) -> None:
        check(self.values, self.locations())

    def origin_of(self, parts: KeyPath) -> KeyOrigin | None:
        """The origin of a key, or of its nearest ancestor when the key itself came whole with it."""
        for depth in range(len(parts), 0, -1):
            found = self.origins.get(key_path(parts[:depth]))
            if found is not None:
                return found
        return None


# -- merging ------------------------------------------------------------------------------------------
def _nodes(values: Mapping[str, Any], parts: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every key path a mapping sets, parents before children (lists are values, as Helm merges them)."""
    for key, value in values.items():
        here = (*parts, str(key))
        yield here, value
        if isinstance(value, Mapping):
            yield from _nodes(value, here)


def _drop_below(origins: dict[str, KeyOrigin], path: str) -> None:
    for known in [k for k in origins if k.startswith((f"{path}.", f"{path}["))]:
        del origins[known]


def _record(origins: dict[str, KeyOrigin], current: Layer) -> None:
    for parts, value in _nodes(current.values):
        path = key_path(parts)
        if not isinstance(value, Mapping):
            _drop_below(origins, path)  # a value in place of a mapping replaces everything under it
        origins[path] = current.origin(path)


def layer(layers: Sequence[Layer]) -> Layered:
    """Merge `layers` in order, later ones winning key by key (Helm's rule for values files)."""
    values: dict[str, Any] = {}
    origins: dict[str, KeyOrigin] = {}
    for current in layers:
        values = deep_merge(values, current.values)
        _record(origins, current)
    for default in (d for d in layers if d.kind == DEFAULT):
        values = _coalesce(default, values, origins)
    overrides = _overrides(layers, values, origins)
    return Layered(values, origins, overrides, _unknown(layers), _accepted(layers))


def _coalesce(default: Layer, values: dict[str, Any], origins: dict[str, KeyOrigin]) -> dict[str, Any]:
    """Chart defaults under the user's values, as Helm coalesces them after merging the files and sets: a
    `--set a.b=x` over a file's `a: 5` leaves a mapping `a` that still has the chart's other keys (merged in
    order alone, the defaults had gone with the 5, and the topology met a key no layer had)."""
    coalesced = deep_merge(default.values, values)
    for parts, _ in _nodes(default.values):
        path = key_path(parts)
        if path not in origins and lookup(coalesced, parts, _MISSING) is not _MISSING:
            origins[path] = default.origin(path)
    return coalesced


_MISSING = object()


def then(layered: Layered, step: Layer) -> Layered:
    """The values after a step's `setValues`, which sits above every other layer."""
    origins = dict(layered.origins)
    _record(origins, step)
    return Layered(
        deep_merge(layered.values, step.values),
        origins,
        layered.overrides,
        layered.unknown + _unknown([step]),
        layered.accepted + _accepted([step]),
    )


def _overrides(
    layers: Sequence[Layer], values: dict[str, Any], origins: Mapping[str, KeyOrigin]
) -> tuple[Override, ...]:
    found = []
    merged = Layered(values, origins)
    for scenario in (x for x in layers if x.kind == SCENARIO):
        for parts, value in _nodes(scenario.values):
            if isinstance(value, Mapping):
                continue
            by = merged.origin_of(parts)
            if by is not None and by.kind in CUSTOMER:
                found.append(
                    Override(
                        key_path(parts), value, lookup(values, parts), scenario.origin(key_path(parts)), by
                    )
                )
    return tuple(found)


# -- unknown keys -------------------------------------------------------------------------------------
def _known_paths() -> tuple[set[KeyPath], set[KeyPath]]:
    known = {parts for parts, _ in _nodes(DEFAULTS)}
    for parts in (*SEED_KEYS, *(p for p, _ in NOT_MODELLED)):
        known.update(parts[:depth] for depth in range(1, len(parts) + 1))
    return known, set(OPEN_MAPS)


KNOWN, OPEN = _known_paths()


def suggest(parts: KeyPath) -> str | None:
    """The closest known key: a sibling spelt alike, else a key of that name elsewhere (a wrong level)."""
    if parts in KNOWN:  # a key the chart has (modelled or not) is no misspelling of another
        return None
    parent, name = parts[:-1], str(parts[-1]).lower()
    siblings = {str(k[-1]).lower(): k for k in KNOWN if k[:-1] == parent}
    close = difflib.get_close_matches(name, list(siblings), n=1, cutoff=SIBLING_CUTOFF)
    if close:
        return key_path(siblings[close[0]])
    # Elsewhere only where the user's own levels stay in order around it (a level left out or the key set
    # too high): workerCallbackProxy.service.annotations is no openbao.server.annotations, however alike.
    anywhere = sorted((k for k in KNOWN if _keeps_levels(parent, k[:-1])), key=lambda k: (len(k), k))
    names = [str(k[-1]).lower() for k in anywhere]
    close = difflib.get_close_matches(name, names, n=1, cutoff=ANYWHERE_CUTOFF)
    return key_path(anywhere[names.index(close[0])]) if close else None


def _keeps_levels(parent: KeyPath, other: KeyPath) -> bool:
    """`parent`'s keys appear in `other` in the same order (a subsequence)."""
    rest = iter(str(part).lower() for part in other)
    return all(str(part).lower() in rest for part in parent)


def unknown_keys(values: Mapping[str, Any]) -> list[KeyPath]:
    """The first unknown key on each branch (nothing below it is reported again)."""
    found: list[KeyPath] = []

    def walk(node: Mapping[str, Any], parts: KeyPath) -> None:
        for key, value in node.items():
            here = (*parts, str(key))
            if parts in OPEN:
                continue
            if here not in KNOWN:
                found.append(here)
            elif isinstance(value, Mapping):
                walk(value, here)

    walk(values, ())
    return found


def _accepted(layers: Sequence[Layer]) -> tuple[AcceptedKey, ...]:
    return tuple(
        AcceptedKey(key_path(parts), current.origin(key_path(parts)), why)
        for current in layers
        if current.kind != DEFAULT
        for parts, why in NOT_MODELLED
        if lookup(current.values, parts, _ABSENT) is not _ABSENT
    )


_ABSENT = object()


def _unknown(layers: Sequence[Layer]) -> tuple[UnknownKey, ...]:
    return tuple(
        UnknownKey(key_path(parts), current.origin(key_path(parts)), suggest(parts))
        for current in layers
        if current.kind != DEFAULT
        for parts in unknown_keys(current.values)
    )


# -- `--set key.path=value` -----------------------------------------------------------------------------
_SEGMENT = re.compile(r'\["([^"]+)"\]|((?:[^.\[\]\\]|\\.)+)')  # ["a.b/c"] or a plain key (a\.b escapes a dot)


def _set_parts(text: str, key: str) -> tuple[str, ...]:
    parts: list[str] = []
    pos = 0
    while True:
        found = _SEGMENT.match(key, pos)
        if found is None:
            raise ConfigError(
                f"--set {text}: cannot read the key {key!r}; write it as a.b.c "
                '(a key with dots as a\\.b or ["a.b"])'
            )
        bracketed, plain = found.groups()
        parts.append(bracketed if bracketed is not None else re.sub(r"\\(.)", r"\1", plain))
        pos = found.end()
        if pos == len(key):
            return tuple(parts)
        pos += key[pos] == "."  # a bracketed key may follow without a dot


def parse_set(text: str) -> Layer:
    """`key.path=value`, the value read as YAML (true, 8080, [a, b]); an empty value is the empty string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"--set {text}: expected key.path=value, e.g. --set workerCallbackProxy.enabled=true"
        )
    if re.search(r"\[\d+\]", key):
        raise ConfigError(f"--set {text}: list indexes are not supported; set the whole list: key=[a, b]")
    try:
        value = untrusted.value(raw) if raw.strip() else ""  # bounded: no alias bomb, no 5,000-deep list
    except yaml.YAMLError:
        value = raw  # not YAML: the text itself, as Helm's --set would take it
    except untrusted.Refused as exc:
        raise ConfigError(f"--set {key.strip()}=...: {exc.message}") from None
    node: Any = value
    for part in reversed(_set_parts(text, key.strip())):
        node = {part: node}
    # The layer's name is how messages and `values` name it: a pasted 10,000-character value is cut short.
    return Layer(SET, text if len(text) <= 120 else text[:117] + "...", node)


def parse_key(text: str) -> tuple[str, ...]:
    """A key path as `--set` writes it (a.b.c, a\\.b or ["a.b"] for a key with dots)."""
    return _set_parts(text, text.strip())


def scenario_layer(name: str, values: Mapping[str, Any], lines: Mapping[str, tuple[str, int]]) -> Layer:
    return Layer(SCENARIO, name, values, lines)


def defaults_layer() -> Layer:
    return Layer(DEFAULT, DEFAULT, DEFAULTS)


def _show(value: Any) -> str:
    return json.dumps(value, default=str)
