"""A fault step's arguments as frozen values, checked against the topology they act on (pure).

scenarios/schema.json has checked their shape (types, ranges, choices, unknown keys) before they get
here; what is left needs the topology: a component, role or cluster a fault names must be one it has, a
scale stays within the pods it runs, an address is an address. What ncpsim does not model is refused,
never reported as done. A refusal carries its key path under the step's `fault`, so scenarios.load can
name the file's line.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from certs.names import certificate_name_problem
from certs.profiles import STACK, grpc_profile, invocation_profile
from sim.errors import ScenarioError
from sim.model.parts import NATS_ROLE
from sim.model.topology import Topology
from sim.model.values import key_path
from sim.runtime.links import ANY, LinkFault

PROCESS_ACTIONS = ("kill", "restart", "stop", "start")
# Roles a scale fault acts on, with the key that sets how many pods each has.
SCALABLE = {
    "invocation": "topology.invocationReplicas in the scenario",
    "grpc-proxy": "topology.grpcProxyReplicas in the scenario",
    NATS_ROLE: "nats.config.cluster.replicas in the values",
}
NATS_ROLES = (NATS_ROLE, "nats-server")
# The control plane's processes besides the pods, the NATS servers and the proxy, as clusters.local.plan
# names them (tests/test_fault_args.py holds the two lists together).
CONTROL_COMPONENTS = ("resolver", "nats-auth-callout")
PROXY_COMPONENT = "worker-callback-proxy"
POD_CERTIFICATES = {"invocation": invocation_profile, "grpc-proxy": grpc_profile}
KeyPath = tuple[str, ...]


class FaultArgumentError(ScenarioError):
    """A fault argument refused; `parts` is its key path under the step's `fault`, `reason` what is wrong."""

    def __init__(self, parts: KeyPath, reason: str):
        super().__init__(f"fault.{key_path(parts)}: {reason}")
        self.parts, self.reason = parts, reason


@dataclass(frozen=True)
class ProcessFault:
    action: str  # kill | restart | stop | start
    component: str


@dataclass(frozen=True)
class Scale:
    role: str
    replicas: int
    pods: tuple[str, ...]  # the role's pods in the topology, in order: the first `replicas` keep running


@dataclass(frozen=True)
class ClearLinks:
    pass


@dataclass(frozen=True)
class Expire:
    which: str  # frontend | public-frontend | invocation | grpc-proxy


@dataclass(frozen=True)
class PodCert:
    pod: str  # invocation | grpc-proxy
    names: tuple[str, ...]
    issuer: str


@dataclass(frozen=True)
class Rollout:
    role: str  # the nats StatefulSet
    pods: tuple[str, ...]  # in ordinal order; a rollout restarts them from the last


Fault = ProcessFault | Scale | LinkFault | ClearLinks | Expire | PodCert | Rollout


def parse_fault(raw: Mapping[str, Any], topology: Topology) -> Fault:
    """The fault a step's `fault: {ACTION: ARGUMENT}` asks for, or FaultArgumentError."""
    if len(raw) != 1:
        raise FaultArgumentError((), "give exactly one action, e.g. {kill: invocation-service-0}")
    ((action, arg),) = raw.items()
    if action in PROCESS_ACTIONS:
        return ProcessFault(action, _component(action, arg, topology))
    parser = _PARSERS.get(action)
    if parser is None:
        known = (*PROCESS_ACTIONS, *_PARSERS)
        raise FaultArgumentError((str(action),), f"unknown action{_hint(str(action), known)}")
    return parser(arg, topology)


def component_names(topology: Topology) -> list[str]:
    """The processes a stack of this topology runs, by the names `ncpsim status` shows."""
    names = [*CONTROL_COMPONENTS, *topology.members(NATS_ROLE), *(p.name for p in topology.pods)]
    if topology.proxy_enabled:
        names.append(PROXY_COMPONENT)
    return names + [c.name for c in topology.clusters if topology.workers_in(c.name)]


def _component(action: str, name: str, topology: Topology) -> str:
    known = component_names(topology)
    if name not in known:
        raise FaultArgumentError(
            (action,),
            f"no component {name!r} in this topology{_hint(name, known)}; it runs {', '.join(known)}",
        )
    return name


def _scale(arg: Mapping[str, Any], topology: Topology) -> Scale:
    role, replicas = str(arg["role"]), int(arg["replicas"])
    role = NATS_ROLE if role in NATS_ROLES else role
    if role not in SCALABLE:
        raise FaultArgumentError(
            ("scale", "role"),
            f"ncpsim scales {', '.join(SCALABLE)}, not {role!r}{_hint(role, SCALABLE)}",
        )
    pods = tuple(topology.members(role))  # a StatefulSet scales down from its highest ordinal
    more = f"raise {SCALABLE[role]} (a running stack: bring it up again with more)"
    if not pods:
        raise FaultArgumentError(
            ("scale", "role"), f"the topology runs no {role} pods, so there is nothing to scale; {more}"
        )
    if replicas > len(pods):
        raise FaultArgumentError(
            ("scale", "replicas"),
            f"{replicas} is more than the {len(pods)} {role} pods the topology runs; to scale further, {more}",
        )
    return Scale(role, replicas, pods)


def _rollout(arg: Any, topology: Topology) -> Rollout:
    role = str(arg)
    if role not in NATS_ROLES:
        raise FaultArgumentError(
            ("rollout",),
            f"{role!r}: only the nats StatefulSet rolls here (restart a Deployment's pods one by one with restart)",
        )
    return Rollout(NATS_ROLE, tuple(topology.members(NATS_ROLE)))


def _link(arg: Mapping[str, Any], topology: Topology) -> LinkFault:
    clusters = [c.name for c in topology.clusters]
    source = str(arg["from"])
    if source not in clusters:
        raise FaultArgumentError(
            ("link", "from"),
            f"no cluster {source!r}{_hint(source, clusters)}; clusters: {', '.join(clusters)}",
        )
    fault = LinkFault(
        source=source,
        target=_network(str(arg["to"]), topology),
        latency_ms=int(arg.get("latencyMs", 0)),
        drop=float(arg.get("drop", 0.0)),
        timeout_ms=int(arg.get("timeoutMs", 1000)),
        protocol=str(arg.get("protocol", ANY)),
    )
    if not fault.latency_ms and not fault.drop:
        raise FaultArgumentError(
            ("link",), "no latencyMs and no drop: the link would change nothing; give one"
        )
    return fault


def _network(text: str, topology: Topology) -> str:
    """An IPv4 address or CIDR as the link's target; a CIDR with host bits set is refused with its network."""
    try:
        network = ipaddress.ip_network(text)
    except ValueError:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise FaultArgumentError(
                ("link", "to"),
                f"{text!r} is not an IPv4 address or CIDR; a link acts on addresses, not names "
                f"(the proxy answers at {topology.proxy_ip})",
            ) from None
        raise FaultArgumentError(
            ("link", "to"), f"{text!r} has host bits set; did you mean {network}?"
        ) from None
    if network.version != 4:
        raise FaultArgumentError(("link", "to"), f"{text!r}: the simulated networks are IPv4")
    return text


def _pod_cert(arg: Mapping[str, Any], _topology: Topology) -> PodCert:
    right = POD_CERTIFICATES[str(arg["pod"])]()
    names, issuer = tuple(arg.get("names") or right.identities), str(arg.get("issuer", STACK))
    for name in names:  # as trustme will issue it: one line now, not an IDNAError mid-step
        if problem := certificate_name_problem(name):
            shown = name if len(name) <= 80 else name[:77] + "..."
            raise FaultArgumentError(("pod-cert", "names"), f"{shown!r} {problem}")
    if names == right.identities and issuer == STACK:
        raise FaultArgumentError(
            ("pod-cert",), "give names or an issuer that differ from the right certificate's"
        )
    return PodCert(str(arg["pod"]), names, issuer)


def _hint(word: str, known: Sequence[str] | Mapping[str, Any]) -> str:
    """A name spelt alike, else one the word is part of (`nats` for nats-server)."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    close += [name for name in known if word and word in name]
    return f" (did you mean {close[0]}?)" if close else ""


_PARSERS: dict[str, Callable[[Any, Topology], Fault]] = {
    "scale": _scale,
    "link": _link,
    "clear-links": lambda _arg, _topology: ClearLinks(),
    "expire": lambda arg, _topology: Expire(str(arg)),
    "pod-cert": _pod_cert,
    "rollout": _rollout,
}
