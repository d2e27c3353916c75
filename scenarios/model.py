"""Scenario files: load, check against the schema, and turn into a Topology plus steps.

A scenario names a field situation: values overrides (the stack's environment file shape), the
clusters and workers, the steps to replay and what each step must show. Errors are one line naming
the file, the line and key path, and what was expected.
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
from scenarios.spec import (
    ACTIONS,
    CHANGES,
    PLACEHOLDER,
    PLACEHOLDERS,
    Expect,
    Scenario,
    Step,
    dns_records,
    step_from,
)
from sim.errors import ConfigError, ScenarioError
from sim.model.layering import STEP, Layer, Layered, defaults_layer, layer, parse_set, scenario_layer, then
from sim.model.topology import Topology
from sim.model.values import key_path
from sim.model.values_file import file_layer, load_values_file
from sim.runtime.fault_args import FaultArgumentError, parse_fault

__all__ = [
    "CATALOGUE",
    "Expect",
    "Scenario",
    "Step",
    "catalogue",
    "load_scenario",
    "resolve_ref",
    "scenario_from_data",
]

CATALOGUE = Path(__file__).parent / "catalogue"
SCHEMA = json.loads((Path(__file__).parent / "schema.json").read_text())
_VALIDATOR = jsonschema.Draft7Validator(SCHEMA)
Origin = dict[str, tuple[str, int]]


def resolve_ref(ref: str) -> Path:
    """A catalogue name or a path to a YAML file."""
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or "/" in ref:
        if not _exists(candidate):
            raise ScenarioError(f"{ref[:200]}: no such scenario file")
        return candidate
    path = CATALOGUE / f"{ref}.yaml"
    if not _exists(path):
        raise ScenarioError(unknown_scenario(ref, [name for name, _ in catalogue()]))
    return path


def _exists(path: Path) -> bool:
    """exists(), with a name the system refuses (too long, say) as missing rather than a traceback."""
    try:
        return path.exists() or path.is_symlink()
    except (OSError, ValueError):
        return False


def unknown_scenario(ref: str, names: list[str]) -> str:
    """The closest catalogue names, one per line (a list of all of them on one line helps nobody)."""
    close = difflib.get_close_matches(ref, names, n=4, cutoff=0.5)
    close += [n for n in names if ref and ref in n and n not in close][: 4 - len(close)]
    if not close:
        return f"unknown scenario {ref!r}; `ncpsim scenarios` lists the {len(names)} in the catalogue"
    return "\n".join(
        [
            f"unknown scenario {ref!r}; did you mean:",
            *(f"  {name}" for name in close),
            "(`ncpsim scenarios` lists them all)",
        ]
    )


def catalogue() -> list[tuple[str, str]]:
    out = []
    for path in sorted(CATALOGUE.glob("*.yaml")):
        data, _ = load_values_file(path, "scenario file")
        out.append((data.get("name", path.stem), data.get("summary", "")))
    return out


# -- one-line errors ----------------------------------------------------------------------------------
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


def _located(path: Path, parts: tuple[Any, ...], origin: Origin, message: str) -> str:
    """The one-line form every scenario error takes: FILE:LINE: key.path: what was expected."""
    return f"{_where(path, parts, origin)}: {key_path(parts) or '(top level)'}: {message}"


def _schema_error(path: Path, data: Any, origin: Origin) -> str | None:
    errors = list(_VALIDATOR.iter_errors(data))
    # A misspelt key usually causes the rest (a required key "missing"): name the misspelling first.
    error = best_match([e for e in errors if e.validator == "additionalProperties"] or errors)
    if error is None:
        return None
    parts, message = _describe(error)
    return _located(path, parts, origin, message)


def _step_problem(path: Path, index: int, raw: dict[str, Any], origin: Origin) -> str | None:
    """What the schema cannot say simply: one action per step, one wait condition, known placeholders."""
    here = ("steps", index)
    actions = [a for a in ACTIONS if a in raw]
    if not actions and not any(k in raw for k in CHANGES):
        return _located(path, here, origin, f"a step needs one of {', '.join((*ACTIONS, *CHANGES))}")
    if "faultAfterMs" in raw and not ("fault" in raw and "invoke" in raw):
        return _located(path, (*here, "faultAfterMs"), origin, "faultAfterMs needs a fault and an invoke")
    if len(actions) > 1:
        first, extra = actions[0], actions[1]
        return _located(
            path,
            (*here, extra),
            origin,
            f"one action per step; {first} is already set (put {extra} in a step of its own)",
        )
    wait = raw.get("wait")
    if wait is not None and ("event" in wait) == ("listener" in wait):
        return _located(path, (*here, "wait"), origin, "name either event or listener")
    expects = raw.get("expect")
    listed: list[tuple[int | None, Any]] = (
        list(enumerate(expects)) if isinstance(expects, list) else [(None, expects)] if expects else []
    )
    for n, exp in listed:
        where = (*here, "expect") if n is None else (*here, "expect", n)
        problem = _log_problem(exp)
        if problem:
            return _located(path, (*where, "log"), origin, problem)
    if any("refused" in exp for _, exp in listed):
        return _refused_problem(path, here, raw, listed, origin)
    if listed and not actions and not all("log" in exp for _, exp in listed):
        return _located(
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
        return _located(path, (*here, "expect"), origin, "refused is an expectation of its own step")
    if not {"setValues", "unsetValues"} & set(raw):
        return _located(path, (*here, "expect"), origin, "refused needs setValues or unsetValues to refuse")
    extra = sorted(set(raw) - {"name", "setValues", "unsetValues", "expect"})
    if extra:
        return _located(
            path, (*here, extra[0]), origin, "a refused change changes nothing: put this in a step of its own"
        )
    exp = listed[0][1]
    if len(exp) > 1:
        return _located(path, (*here, "expect"), origin, "refused is an entry of its own")
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
            return _located(
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
                return _located(path, (*here, "dnsRecords", n), origin, str(exc))
        rewrite = cluster.get("dnsRewrite") or {}
        if rewrite.get("target", "proxy") != "none":
            try:
                wildcard(rewrite.get("domain") or "example.com", rewrite.get("target", "proxy"))
            except ValueError as exc:
                return _located(path, (*here, "dnsRewrite"), origin, str(exc))
    return None


def _certificate_names_problem(path: Path, topology: dict[str, Any], origin: Origin) -> str | None:
    """A declared Secret's certificate names as trustme would issue them, named at their line first."""
    for secret, raw in (topology.get("secrets") or {}).items():
        for n, name in enumerate(raw.get("names") or ()):
            if problem := certificate_name_problem(name):
                shown = name if len(name) <= 80 else name[:77] + "..."
                where = ("topology", "secrets", secret, "names", n)
                return _located(path, where, origin, f"{shown!r} {problem}")
    return None


def _values_origin(origin: Origin, prefix: str) -> Origin:
    """Key paths under `prefix` (e.g. "values.") re-rooted, so values errors name the stack's key."""
    return {k[len(prefix) :]: v for k, v in origin.items() if k.startswith(prefix)}


def _expects_refusal(raw: dict[str, Any]) -> bool:
    expect = raw.get("expect")
    return any(
        isinstance(e, dict) and "refused" in e for e in (expect if isinstance(expect, list) else [expect])
    )


def _check_set_values(layered: Layered, steps: list[dict[str, Any]], origin: Origin) -> None:
    """Each setValues must leave valid values behind, as `helmfile sync` would refuse them at that step."""
    for index, raw in enumerate(steps):
        if "setValues" in raw and not _expects_refusal(
            raw
        ):  # a refused change leaves the values as they were
            step = Layer(
                STEP,
                f"step {index + 1}",
                raw["setValues"],
                _values_origin(origin, f"steps[{index}].setValues."),
            )
            layered = then(layered, step)
            layered.check()


def _files(values_files: Path | Sequence[Path] | None) -> tuple[Path, ...]:
    if values_files is None:
        return ()
    return (values_files,) if isinstance(values_files, Path) else tuple(values_files)


def load_scenario(
    ref: str,
    values_files: Path | Sequence[Path] | None = None,
    allow_expected_error: bool = False,
    sets: Sequence[str] = (),
    customer: Sequence[Layer] | None = None,
) -> Scenario:
    """Load a catalogue name or YAML path with a customer's `-f` files and `--set key.path=value`s on top.

    Precedence is Helm's (sim.model.layering): defaults < scenario values < each file in order < --set.
    `customer` gives those layers already read (a replay reads the files once for every scenario).
    An error scenario (`expectError`) whose values are refused raises that ConfigError, as `ncpsim up`
    should; with `allow_expected_error` (replay) it comes back as `Scenario.config_error` instead.
    """
    path = resolve_ref(ref)
    data, origin = load_values_file(path, "scenario file")  # bounded: the file may be a ticket's
    return scenario_from_data(data, path, origin, values_files, allow_expected_error, sets, customer)


def customer_layers(
    values_files: Path | Sequence[Path] | None = None, sets: Sequence[str] = ()
) -> list[Layer]:
    """What a support engineer brings, read once: each `-f` file, then each `--set`."""
    return [*(file_layer(p) for p in _files(values_files)), *(parse_set(text) for text in sets)]


def scenario_from_data(
    data: Any,
    path: Path,
    origin: Origin | None = None,
    values_files: Path | Sequence[Path] | None = None,
    allow_expected_error: bool = False,
    sets: Sequence[str] = (),
    customer: Sequence[Layer] | None = None,
    topology: Topology | None = None,
) -> Scenario:
    """`topology`: the running stack's, when the steps are to run on it (its faults are checked against it);
    otherwise the scenario's own."""
    origin = origin or {}
    problem = _schema_error(path, data, origin)
    if problem:
        raise ScenarioError(problem)
    raw_steps = data.get("steps", [])
    for index, raw in enumerate(raw_steps):
        if problem := _step_problem(path, index, raw, origin):
            raise ScenarioError(problem)
    if problem := _dns_problem(path, data.get("topology") or {}, origin, raw_steps):
        raise ScenarioError(problem)
    if problem := _certificate_names_problem(path, data.get("topology") or {}, origin):
        raise ScenarioError(problem)
    customer = customer_layers(values_files, sets) if customer is None else customer
    own = scenario_layer(data["name"], data.get("values") or {}, _values_origin(origin, "values."))
    layered = layer([defaults_layer(), own, *customer])
    expect_error = data.get("expectError")
    try:
        layered.check()
        _check_set_values(layered, raw_steps, origin)
    except ConfigError as exc:
        if expect_error and allow_expected_error:
            return _scenario(data, path, layered, config_error=str(exc))
        raise _with_unknown_keys(exc, layered) from None
    if expect_error and not allow_expected_error:
        raise ScenarioError(
            _located(
                path,
                ("expectError",),
                origin,
                f"the values were accepted, but the scenario expects them refused with {expect_error!r}",
            )
        )
    scenario = _scenario(data, path, layered)
    _check_faults(scenario, raw_steps, origin, topology)
    return scenario


def _check_faults(
    scenario: Scenario, raw_steps: list[dict[str, Any]], origin: Origin, topology: Topology | None
) -> None:
    """Every fault's arguments against the topology it will act on (sim.runtime.fault_args): a component,
    role or cluster it does not have, a scale past its count, what ncpsim does not model, with FILE:LINE."""
    faults = [(index, raw["fault"]) for index, raw in enumerate(raw_steps) if "fault" in raw]
    if not faults:
        return
    topology = topology or scenario.build_topology("check")
    for index, fault in faults:
        try:
            parse_fault(fault, topology)
        except FaultArgumentError as exc:
            where = ("steps", index, "fault", *exc.parts)
            raise ScenarioError(_located(scenario.path, where, origin, exc.reason)) from None


def _with_unknown_keys(error: ConfigError, layered: Layered) -> ConfigError:
    """A refused render stops `ncpsim up` before its warnings print, yet a misspelt key is often why it
    was refused (`workerDomian` leaves workerDomain empty): name them on the same one line."""
    if not layered.unknown:
        return error
    widened = ConfigError(f"{error} (also: {'; '.join(str(u) for u in layered.unknown)})")
    widened.issues = getattr(error, "issues", ())
    return widened


def _scenario(
    data: dict[str, Any], path: Path, layered: Layered, config_error: str | None = None
) -> Scenario:
    steps = tuple(step_from(i, raw) for i, raw in enumerate(data.get("steps", []), start=1))
    return Scenario(
        name=data["name"],
        summary=data["summary"],
        path=path,
        seed=data.get("seed", 1),
        values=layered.values,
        topology=data.get("topology", {}),
        steps=steps,
        origin=layered.locations(),
        expect_error=data.get("expectError"),
        config_error=config_error,
        layering=layered,
    )
