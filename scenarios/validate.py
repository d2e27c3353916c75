"""A scenario file checked before anything is built from it: first its schema (scenarios/schema.json), then
what the schema cannot say simply (one action per step, a refused change in a step of its own, log
expectations that can hold, known placeholders, DNS records and certificate names CoreDNS and trustme
would take). Each problem is one line, FILE:LINE: key.path: what was expected; the first one found wins.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from certs.names import certificate_name_problem
from dns.rule import wildcard
from scenarios.spec import ACTIONS, CHANGES, PLACEHOLDER, PLACEHOLDERS, dns_records
from sim.model.values import key_path

SCHEMA = json.loads((Path(__file__).parent / "schema.json").read_text())
_VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
Origin = dict[str, tuple[str, int]]  # key path -> (file, line), as sim.model.values_file reads them


def file_problem(path: Path, data: Any, origin: Origin) -> str | None:
    """The first problem of a scenario file's `data`, as one line, or None."""
    if problem := _schema_error(path, data, origin):
        return problem
    raw_steps = data.get("steps", [])
    for index, raw in enumerate(raw_steps):
        if problem := _step_problem(path, index, raw, origin):
            return problem
    topology = data.get("topology") or {}
    return _dns_problem(path, topology, origin, raw_steps) or _certificate_names_problem(
        path, topology, origin
    )


def located(path: Path, parts: tuple[Any, ...], origin: Origin, message: str) -> str:
    """The one-line form every scenario error takes: FILE:LINE: key.path: what was expected."""
    return f"{_where(path, parts, origin)}: {key_path(parts) or '(top level)'}: {message}"


def _where(path: Path, parts: tuple[Any, ...], origin: Origin) -> str:
    """FILE:LINE for a key path, falling back to its nearest ancestor the file set."""
    for depth in range(len(parts), 0, -1):
        found = origin.get(key_path(parts[:depth]))
        if found:
            return f"{path}:{found[1]}"
    return str(path)


def _describe(error: ValidationError) -> tuple[tuple[Any, ...], str]:
    """(key path, what was expected) for a schema error."""
    parts = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        schema, instance = error.schema, error.instance  # an object's, and its schema: mappings both
        known = sorted(schema.get("properties", {}) if isinstance(schema, Mapping) else ())
        extra = sorted(set(instance if isinstance(instance, Mapping) else ()) - set(known), key=str)
        close = difflib.get_close_matches(str(extra[0]), known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        return (*parts, extra[0]), f"unknown key; {hint}expected one of: {', '.join(known)}"
    if error.validator == "required":
        missing = str(error.message).split("'")[1]
        return (*parts, missing), "is required but missing"
    if error.validator == "pattern":
        return parts, f"{error.instance!r} does not have the expected form {error.validator_value}"
    return parts, " ".join(error.message.split())[:300]


def _schema_error(path: Path, data: Any, origin: Origin) -> str | None:
    errors = list(_VALIDATOR.iter_errors(data))
    # A misspelt key usually causes the rest (a required key "missing"): name the misspelling first.
    error = best_match([e for e in errors if e.validator == "additionalProperties"] or errors)
    if error is None:
        return None
    parts, message = _describe(error)
    return located(path, parts, origin, message)


def _step_problem(path: Path, index: int, raw: dict[str, Any], origin: Origin) -> str | None:
    """What the schema cannot say simply: one action per step, one wait condition, known placeholders."""
    here = ("steps", index)
    actions = [a for a in ACTIONS if a in raw]
    if not actions and not any(k in raw for k in CHANGES):
        return located(path, here, origin, f"a step needs one of {', '.join((*ACTIONS, *CHANGES))}")
    if "faultAfterMs" in raw and not ("fault" in raw and "invoke" in raw):
        return located(path, (*here, "faultAfterMs"), origin, "faultAfterMs needs a fault and an invoke")
    if len(actions) > 1:
        first, extra = actions[0], actions[1]
        return located(
            path,
            (*here, extra),
            origin,
            f"one action per step; {first} is already set (put {extra} in a step of its own)",
        )
    wait = raw.get("wait")
    if wait is not None and ("event" in wait) == ("listener" in wait):
        return located(path, (*here, "wait"), origin, "name either event or listener")
    expects = raw.get("expect")
    listed: list[tuple[int | None, Any]] = (
        list(enumerate(expects)) if isinstance(expects, list) else [(None, expects)] if expects else []
    )
    for n, exp in listed:
        where = (*here, "expect") if n is None else (*here, "expect", n)
        problem = _log_problem(exp)
        if problem:
            return located(path, (*where, "log"), origin, problem)
    if any("refused" in exp for _, exp in listed):
        return _refused_problem(path, here, raw, listed, origin)
    if listed and not actions and not all("log" in exp for _, exp in listed):
        return located(
            path, (*here, "expect"), origin, "expectations need an invoke, probe or runbook in the same step"
        )
    return _placeholder_problem(path, here, raw, origin)


def _refused_problem(
    path: Path,
    here: tuple[str | int, ...],
    raw: dict[str, Any],
    listed: list[tuple[int | None, Any]],
    origin: Origin,
) -> str | None:
    """A refused change is a step of its own: setValues/unsetValues and the one expectation, nothing else
    (a refused helmfile sync rolls nothing out, so nothing can follow it in that step)."""
    if len(listed) > 1:
        return located(path, (*here, "expect"), origin, "refused is an expectation of its own step")
    if not {"setValues", "unsetValues"} & set(raw):
        return located(path, (*here, "expect"), origin, "refused needs setValues or unsetValues to refuse")
    extra = sorted(set(raw) - {"name", "setValues", "unsetValues", "expect"})
    if extra:
        return located(
            path, (*here, extra[0]), origin, "a refused change changes nothing: put this in a step of its own"
        )
    exp = listed[0][1]
    if len(exp) > 1:
        return located(path, (*here, "expect"), origin, "refused is an entry of its own")
    return None


def _log_problem(exp: dict[str, Any]) -> str | None:
    """A log expectation stands alone, with a count that can hold and an expression that compiles."""
    if "log" not in exp:
        return None
    if len(exp) > 1:
        return f"a log expectation is an entry of its own; move {min(set(exp) - {'log'})} to another"
    if not {"contains", "matches"} & set(exp["log"]):
        return "give contains (text) or matches (a regular expression), or both"
    count = exp["log"].get("count") or {}
    if "exactly" in count and len(count) > 1:
        return "count: exactly stands alone (or give min and/or max)"
    if count.get("min", 0) > count.get("max", count.get("min", 0)):
        return f"count: min {count['min']} is above max {count['max']}"
    try:
        re.compile(exp["log"].get("matches") or "")
    except re.error as exc:
        return f"matches: not a regular expression ({exc})"
    return None


def _placeholder_problem(
    path: Path, here: tuple[Any, ...], raw: dict[str, Any], origin: Origin
) -> str | None:
    for n, item in enumerate((raw.get("probe") or {}).get("targets", [])):
        text = item if isinstance(item, str) else item["target"]
        unknown = [m for m in PLACEHOLDER.findall(text) if m not in PLACEHOLDERS]
        if unknown:
            known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
            return located(
                path,
                (*here, "probe", "targets", n),
                origin,
                f"unknown placeholder {{{unknown[0]}}}; expected one of: {known}",
            )
    return None


def _dns_problem(
    path: Path, topology: dict[str, Any], origin: Origin, steps: Sequence[dict[str, Any]] = ()
) -> str | None:
    """A DNS record or rewrite CoreDNS could not take, named at its line before anything is built."""
    clusters: list[tuple[tuple[str | int, ...], dict[str, Any]]] = [
        (("topology", "controlPlane"), topology.get("controlPlane") or {})
    ]
    clusters += [
        (("topology", "computeClusters", n), c) for n, c in enumerate(topology.get("computeClusters", []))
    ]
    clusters += [(("steps", n), s) for n, s in enumerate(steps) if "dnsRecords" in s or "dnsRewrite" in s]
    for here, cluster in clusters:
        for n, raw in enumerate(cluster.get("dnsRecords", [])):
            try:
                dns_records([raw])
            except ValueError as exc:
                return located(path, (*here, "dnsRecords", n), origin, str(exc))
        rewrite = cluster.get("dnsRewrite") or {}
        if rewrite.get("target", "proxy") != "none":
            try:
                wildcard(rewrite.get("domain") or "example.com", rewrite.get("target", "proxy"))
            except ValueError as exc:
                return located(path, (*here, "dnsRewrite"), origin, str(exc))
    return None


def _certificate_names_problem(path: Path, topology: dict[str, Any], origin: Origin) -> str | None:
    """A declared Secret's certificate names as trustme would issue them, named at their line first."""
    for secret, raw in (topology.get("secrets") or {}).items():
        for n, name in enumerate(raw.get("names") or ()):
            if problem := certificate_name_problem(name):
                shown = name if len(name) <= 80 else name[:77] + "..."
                where = ("topology", "secrets", secret, "names", n)
                return located(path, where, origin, f"{shown!r} {problem}")
    return None
