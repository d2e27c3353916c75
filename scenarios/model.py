"""Scenario files: load, check against the schema, and turn into a Topology plus steps.

A scenario names a field situation: values overrides (the stack's environment file shape), the
clusters and workers, the steps to replay and what each step must show. Errors are one line naming
the file, the line and key path, and what was expected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from sim.errors import ScenarioError
from sim.topology import ComputeSpec, Topology, WorkerSpec, build
from sim.values import DEFAULTS, check, deep_merge, key_path, load_values_file

CATALOGUE = Path(__file__).parent / "catalogue"
SCHEMA = json.loads((Path(__file__).parent / "schema.json").read_text())


@dataclass(frozen=True)
class Expect:
    outcome: str = "success"
    via: str | None = None  # "proxy" | "direct"
    same_pod: bool | None = None
    proxy_status: int | None = None
    proxy_flag: str | None = None
    callee_status: int | None = None  # the status the pod answered the worker's first leg with
    error: str | None = None  # substring of the failure the worker reports


@dataclass(frozen=True)
class Step:
    index: int  # 1-based, as reports name it
    name: str
    invoke: dict[str, Any] | None = None
    set_values: dict[str, Any] | None = None
    redeploy: str | None = None
    expect: Expect | None = None

    @property
    def label(self) -> str:
        return f"step {self.index} ({self.name})"


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    path: Path
    seed: int
    values: dict[str, Any]  # merged: defaults <- customer's file <- scenario overrides
    topology: dict[str, Any]
    steps: tuple[Step, ...]
    origin: dict[str, tuple[str, int]] = field(default_factory=dict)

    def build_topology(self, stack: str, values: dict[str, Any] | None = None) -> Topology:
        spec = self.topology
        compute = tuple(
            ComputeSpec(workers=_workers(c.get("workers", []), f"worker-{n}"),
                        wildcard_dns=c.get("wildcardDns", True))
            for n, c in enumerate(spec.get("computeClusters", []), start=1))
        return build(stack, values if values is not None else self.values,
                     invocation_replicas=spec.get("invocationReplicas", 2),
                     grpc_replicas=spec.get("grpcProxyReplicas", 2), compute=compute,
                     control_workers=_workers(spec.get("controlWorkers", []), "worker-cp"), seed=self.seed)


def _workers(groups: list[dict[str, Any]], prefix: str) -> tuple[WorkerSpec, ...]:
    workers: list[WorkerSpec] = []
    for group in groups:
        for _ in range(group.get("count", 1)):
            workers.append(WorkerSpec(f"{prefix}-{len(workers)}", "", group.get("workerUtils", "1.4.0"),
                                      group.get("trust", "system")))
    return tuple(workers)


def resolve_ref(ref: str) -> Path:
    """A catalogue name or a path to a YAML file."""
    candidate = Path(ref)
    if candidate.suffix in (".yaml", ".yml") or "/" in ref:
        if not candidate.exists():
            raise ScenarioError(f"{ref}: no such scenario file")
        return candidate
    path = CATALOGUE / f"{ref}.yaml"
    if not path.exists():
        names = ", ".join(name for name, _ in catalogue())
        raise ScenarioError(f"unknown scenario {ref!r}; the catalogue has: {names}")
    return path


def catalogue() -> list[tuple[str, str]]:
    out = []
    for path in sorted(CATALOGUE.glob("*.yaml")):
        data, _ = load_values_file(path)
        out.append((data.get("name", path.stem), data.get("summary", "")))
    return out


def _schema_error(path: Path, data: dict[str, Any], origin: dict[str, tuple[str, int]]) -> str | None:
    validator = jsonschema.Draft7Validator(SCHEMA)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if not errors:
        return None
    error = errors[0]
    parts = tuple(error.absolute_path)
    where = key_path(parts) or "(top level)"
    line = origin.get(key_path(parts), (str(path), None))[1]
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        line = origin.get(key_path((*parts, extra[0])), (str(path), line))[1]
        where = key_path((*parts, extra[0]))
        message = f"unknown key; expected one of: {', '.join(sorted(error.schema.get('properties', {})))}"
    else:
        message = error.message
    return f"{path}:{line}: {where}: {message}" if line else f"{path}: {where}: {message}"


def load_scenario(ref: str, values_file: Path | None = None) -> Scenario:
    path = resolve_ref(ref)
    data, origin = load_values_file(path)
    problem = _schema_error(path, data, origin)
    if problem:
        raise ScenarioError(problem)
    customer, customer_origin = load_values_file(values_file) if values_file else ({}, {})
    values = deep_merge(deep_merge(DEFAULTS, customer), data.get("values", {}))
    # Key paths in the scenario file sit under "values."; strip it so values errors name the stack key.
    scenario_origin = {k[len("values."):]: v for k, v in origin.items() if k.startswith("values.")}
    merged_origin = {**customer_origin, **scenario_origin}
    check(values, merged_origin)
    steps = tuple(_step(i, raw) for i, raw in enumerate(data["steps"], start=1))
    return Scenario(name=data["name"], summary=data["summary"], path=path, seed=data.get("seed", 1),
                    values=values, topology=data.get("topology", {}), steps=steps, origin=merged_origin)


def _step(index: int, raw: dict[str, Any]) -> Step:
    expect = raw.get("expect")
    kind = next((k for k in ("invoke", "setValues", "redeploy") if k in raw), "step")
    return Step(index=index, name=raw.get("name", kind), invoke=raw.get("invoke"),
                set_values=raw.get("setValues"), redeploy=raw.get("redeploy"),
                expect=Expect(outcome=expect.get("outcome", "success"), via=expect.get("via"),
                              same_pod=expect.get("samePod"), proxy_status=expect.get("proxyStatus"),
                              proxy_flag=expect.get("proxyFlag"), callee_status=expect.get("calleeStatus"),
                              error=expect.get("error")) if expect else None)
