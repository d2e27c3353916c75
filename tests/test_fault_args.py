"""A fault step's arguments checked against the topology (scenarios.fault_args), from tables.

What the schema cannot say needs the topology: which components, roles and clusters it has, how many pods
a role runs. Each refusal names the key under the step's `fault` and what to do instead; nothing ncpsim
does not model comes back as a fault it would report done.
"""

from __future__ import annotations

from typing import Any

import pytest

from clusters.local.plan import phase_one, phase_two
from scenarios.fault_args import (
    ClearLinks,
    Expire,
    FaultArgumentError,
    PodCert,
    ProcessFault,
    Rollout,
    Scale,
    component_names,
    parse_fault,
)
from scenarios.load import load_scenario
from sim.errors import ScenarioError
from sim.model.parts import WorkerSpec
from sim.model.topology import ComputeSpec, Topology, build
from sim.runtime.links import LinkFault

WD = "grpc-worker.example.com"


def topology(*, invocation: int = 2, grpc: int = 0, proxy: bool = True, compute: int = 1) -> Topology:
    values = {
        "workerCallbackProxy": {"enabled": proxy, "workerDomain": WD, "service": {"type": "LoadBalancer"}}
    }
    clusters = tuple(ComputeSpec(workers=(WorkerSpec("w", ""),)) for _ in range(compute))
    return build("t", values, invocation_replicas=invocation, grpc_replicas=grpc, compute=clusters)


LINK = {"from": "ncpsim-compute-1", "to": "10.100.0.10"}

ACCEPTED: list[tuple[dict[str, Any], Any]] = [
    ({"kill": "invocation-service-1"}, ProcessFault("kill", "invocation-service-1")),
    ({"stop": "resolver"}, ProcessFault("stop", "resolver")),
    ({"restart": "nats-1"}, ProcessFault("restart", "nats-1")),  # a server of the nats StatefulSet
    ({"scale": {"role": "nats", "replicas": 1}}, Scale("nats", 1, ("nats-0", "nats-1", "nats-2"))),
    ({"rollout": "nats"}, Rollout("nats", ("nats-0", "nats-1", "nats-2"))),
    ({"start": "ncpsim-compute-1"}, ProcessFault("start", "ncpsim-compute-1")),
    (
        {"scale": {"role": "invocation", "replicas": 1}},
        Scale("invocation", 1, ("invocation-service-0", "invocation-service-1")),
    ),
    (
        {"scale": {"role": "invocation", "replicas": 2}},
        Scale("invocation", 2, ("invocation-service-0", "invocation-service-1")),
    ),
    ({"link": {**LINK, "drop": 1.0}}, LinkFault("ncpsim-compute-1", "10.100.0.10", drop=1.0)),
    (
        {"link": {**LINK, "to": "10.100.0.0/24", "latencyMs": 50, "protocol": "udp", "timeoutMs": 200}},
        LinkFault("ncpsim-compute-1", "10.100.0.0/24", latency_ms=50, timeout_ms=200, protocol="udp"),
    ),
    (
        {"link": {**LINK, "from": "ncpsim-cp", "to": "10.42.0.0/16", "drop": 0.5, "protocol": "tcp"}},
        LinkFault("ncpsim-cp", "10.42.0.0/16", drop=0.5, protocol="tcp"),
    ),
    ({"clear-links": None}, ClearLinks()),
    ({"expire": "frontend"}, Expire("frontend")),
    (
        {"pod-cert": {"pod": "invocation", "issuer": "private"}},
        PodCert("invocation", ("*.invocation.nvcf.svc.cluster.local",), "private"),
    ),
]


@pytest.mark.parametrize(("raw", "expected"), ACCEPTED, ids=[str(r) for r, _ in ACCEPTED])
def test_accepted_faults_become_values(raw: dict[str, Any], expected: Any) -> None:
    assert parse_fault(raw, topology()) == expected


REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], tuple[str, ...], tuple[str, ...]]] = [
    # (id, topology, the fault, its key path under `fault`, what the one line must say)
    (
        "scale-nats-past-count",
        {},
        {"scale": {"role": "nats", "replicas": 4}},
        ("scale", "replicas"),
        ("more than the 3 nats pods", "nats.config.cluster.replicas"),
    ),
    ("rollout-a-deployment", {}, {"rollout": "invocation"}, ("rollout",), ("only the nats StatefulSet",)),
    (
        "scale-past-count",
        {},
        {"scale": {"role": "invocation", "replicas": 3}},
        ("scale", "replicas"),
        ("3 is more than the 2 invocation pods", "topology.invocationReplicas"),
    ),
    (
        "scale-role-it-has-none-of",
        {"grpc": 0},
        {"scale": {"role": "grpc-proxy", "replicas": 0}},
        ("scale", "role"),
        ("no grpc-proxy pods", "topology.grpcProxyReplicas"),
    ),
    (
        "scale-unknown-role",
        {},
        {"scale": {"role": "invocation-service", "replicas": 1}},
        ("scale", "role"),
        ("not 'invocation-service'", "did you mean invocation?"),
    ),
    (
        "scale-workers",
        {},
        {"scale": {"role": "workers", "replicas": 1}},
        ("scale", "role"),
        ("ncpsim scales invocation, grpc-proxy, nats, not 'workers'",),
    ),
    (
        "kill-unknown",
        {},
        {"kill": "invocation-service-2"},
        ("kill",),
        ("no component 'invocation-service-2'", "did you mean invocation-service-1?"),
    ),
    (
        "kill-nats",
        {},
        {"kill": "nats"},
        ("kill",),
        ("did you mean nats-", "it runs resolver, nats-auth-callout, nats-0"),
    ),
    (
        "proxy-disabled",
        {"proxy": False},
        {"restart": "worker-callback-proxy"},
        ("restart",),
        ("no component",),
    ),
    (
        "link-unknown-cluster",
        {},
        {"link": {**LINK, "from": "ncpsim-compute-2", "drop": 1}},
        ("link", "from"),
        ("no cluster 'ncpsim-compute-2'", "did you mean ncpsim-compute-1?", "ncpsim-cp"),
    ),
    (
        "link-to-a-name",
        {},
        {"link": {**LINK, "to": "invocation.grpc-worker.example.com", "drop": 1}},
        ("link", "to"),
        ("not an IPv4 address or CIDR", "10.100.0.10"),
    ),
    (
        "link-host-bits",
        {},
        {"link": {**LINK, "to": "10.100.0.10/16", "drop": 1}},
        ("link", "to"),
        ("did you mean 10.100.0.0/16?",),
    ),
    ("link-ipv6", {}, {"link": {**LINK, "to": "fd00::1", "drop": 1}}, ("link", "to"), ("IPv4",)),
    ("link-does-nothing", {}, {"link": dict(LINK)}, ("link",), ("no latencyMs and no drop",)),
    ("pod-cert-the-right-one", {}, {"pod-cert": {"pod": "grpc-proxy"}}, ("pod-cert",), ("differ",)),
    ("unknown-action", {}, {"explode": "x"}, ("explode",), ("unknown action",)),
    ("two-actions", {}, {"kill": "resolver", "stop": "resolver"}, (), ("exactly one action",)),
]


@pytest.mark.parametrize(("case", "shape", "raw", "parts", "says"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_faults_name_the_key_and_the_way_out(
    case: str, shape: dict[str, Any], raw: dict[str, Any], parts: tuple[str, ...], says: tuple[str, ...]
) -> None:
    with pytest.raises(FaultArgumentError) as refused:
        parse_fault(raw, topology(**shape))
    assert refused.value.parts == parts
    line = str(refused.value)
    assert "\n" not in line and line.startswith("fault.")
    for words in says:
        assert words in line, line


@pytest.mark.parametrize("shape", [{}, {"grpc": 2, "compute": 3}, {"proxy": False, "invocation": 0}])
def test_component_names_are_the_launchers(shape: dict[str, Any]) -> None:
    """The names a fault may act on are those the local backend starts (clusters.local.plan)."""
    laid_out = topology(**shape)
    launched = [spec.name for spec in phase_one(laid_out) + phase_two(laid_out)]
    assert sorted(component_names(laid_out)) == sorted(launched)


# -- in a scenario file: one line with FILE:LINE, the key path and what was expected ----------------------
HEAD = """\
name: ticket
summary: a fault step as a ticket's author writes it
values:
  workerCallbackProxy: {enabled: true, workerDomain: grpc-worker.example.com}
topology:
  computeClusters:
    - workers: [{count: 1}]
steps:
  - name: the fault
"""
MISTYPED = [
    # (the step's fault line, the key path named, what the line says)
    ("fault: {scale: 3}", "steps[0].fault.scale", "is not of type 'object'"),
    ("fault: {link: {}}", "steps[0].fault.link.from", "required"),
    (
        "fault: {link: {from: ncpsim-compute-1, to: 10.100.0.10, latencyMs: fast}}",
        "steps[0].fault.link.latencyMs",
        "integer",
    ),
    (
        "fault: {link: {from: ncpsim-compute-1, to: 10.100.0.10, latencyMs: -1}}",
        "steps[0].fault.link.latencyMs",
        "minimum",
    ),
    (
        "fault: {link: {from: ncpsim-compute-1, to: 10.100.0.10, drop: 1.5}}",
        "steps[0].fault.link.drop",
        "maximum",
    ),
    (
        "fault: {link: {from: ncpsim-compute-1, to: 10.100.0.10, drop: 1, protocol: bogus}}",
        "steps[0].fault.link.protocol",
        "'tcp', 'udp', 'any'",
    ),
    ("fault: {expire: [frontend]}", "steps[0].fault.expire", "is not one of"),
    (
        "fault: {scale: {role: invocation, replicas: 1, when: now}}",
        "steps[0].fault.scale.when",
        "unknown key",
    ),
    ("fault: {kil: invocation-service-0}", "steps[0].fault.kil", "did you mean kill?"),
    ("fault: {scale: {role: nats, replicas: 5}}", "steps[0].fault.scale.replicas", "more than the 3 nats"),
    (
        "fault: {scale: {role: invocation, replicas: 5}}",
        "steps[0].fault.scale.replicas",
        "topology.invocationReplicas",
    ),
    ("fault: {stop: resolvr}", "steps[0].fault.stop", "did you mean resolver?"),
]


@pytest.mark.parametrize(("fault", "key", "says"), MISTYPED, ids=[m[1] + ":" + m[2][:12] for m in MISTYPED])
def test_a_mistyped_fault_is_one_line_naming_file_line_and_key(
    tmp_path, fault: str, key: str, says: str
) -> None:
    path = tmp_path / "ticket.yaml"
    path.write_text(HEAD + f"    {fault}\n")
    with pytest.raises(ScenarioError) as refused:
        load_scenario(str(path))
    line = str(refused.value)
    assert line.startswith(f"{path}:10: {key}: ") and "\n" not in line, line
    assert says in line, line
