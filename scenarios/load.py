"""A scenario file read into a Scenario: checked (scenarios/validate.py), its values layered as Helm layers
them (defaults < the scenario's values < the customer's `-f` files < `--set`), each step's setValues checked
as `helmfile sync` would check them at that step, and each fault checked against the topology it acts on.
Errors are one line naming the file, the line and key path, and what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scenarios.fault_args import FaultArgumentError, parse_fault
from scenarios.lookup import resolve_ref
from scenarios.spec import Scenario, step_from
from scenarios.validate import Origin, file_problem, located
from sim.errors import ConfigError, ScenarioError
from sim.model.layering import STEP, Layer, Layered, defaults_layer, layer, parse_set, scenario_layer, then
from sim.model.topology import Topology
from sim.model.values_file import file_layer, load_values_file


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
        if "setValues" not in raw or _expects_refusal(raw):  # a refused change leaves the values as they were
            continue
        origins = _values_origin(origin, f"steps[{index}].setValues.")
        layered = then(layered, Layer(STEP, f"step {index + 1}", raw["setValues"], origins))
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
    if problem := file_problem(path, data, origin):
        raise ScenarioError(problem)
    raw_steps = data.get("steps", [])
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
            located(
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
    """Every fault's arguments against the topology it will act on (scenarios.fault_args): a component,
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
            raise ScenarioError(located(scenario.path, where, origin, exc.reason)) from None


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
