"""Service operations: pod-annotation values and restart semantics, as a small pure state model.

Annotation rules come from ``sim.model.values.validate`` (strings only, the reserved
``nvcf.nvidia.com/nats-worker-auth`` prefix and chart-managed keys refused); this module adds which
workloads a change rolls. Restarts: a rolling restart replaces Deployment pods and RollingUpdate
StatefulSet pods (reverse ordinal order); OpenBao's OnDelete pods are replaced only when deleted, and a
replaced member comes back sealed, which Kubernetes readiness does not show in this model, because the
runbook says to check each member's seal state, not just readiness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sim.errors import ConfigError
from sim.model.values import ANNOTATION_MAPS, deep_merge, key_path
from sim.model.values_check import ValuesIssue, validate

DEPLOYMENT, STATEFULSET = "Deployment", "StatefulSet"
ROLLING, ON_DELETE = "RollingUpdate", "OnDelete"
ROLLOUT_STATUS_ONDELETE = "error: rollout status is only available for RollingUpdate strategy type"

# Annotation key path (as sim.model.values spells it) -> (namespace, resource, kind, update strategy).
WORKLOADS: dict[str, tuple[str, str, str, str]] = {
    "api.podAnnotations": ("nvcf", "nvcf-api", DEPLOYMENT, ROLLING),
    "nvctApi.podAnnotations": ("nvcf", "nvct-api", DEPLOYMENT, ROLLING),
    "invocation.podAnnotations": ("nvcf", "invocation-service", DEPLOYMENT, ROLLING),
    "grpcproxy.podAnnotations": ("nvcf", "grpc-proxy-deployment", DEPLOYMENT, ROLLING),
    "apikeys.podAnnotations": ("api-keys", "api-keys", DEPLOYMENT, ROLLING),
    "ess.podAnnotations": ("ess", "ess-api-helm-nvcf-ess-api-deployment", DEPLOYMENT, ROLLING),
    "natsAuthCalloutService.podAnnotations": (
        "nats-system",
        "nats-auth-callout-service",
        DEPLOYMENT,
        ROLLING,
    ),
    "nats.podAnnotations": ("nats-system", "nats", STATEFULSET, ROLLING),
    "openbao.server.annotations": ("vault-system", "openbao-server", STATEFULSET, ON_DELETE),
}


# -- annotations -------------------------------------------------------------------------------------
def annotation_issues(values: Mapping[str, Any]) -> list[ValuesIssue]:
    prefixes = tuple(key_path(parts) for parts in ANNOTATION_MAPS)
    return [issue for issue in validate(values) if issue.path.startswith(prefixes)]


def _annotations(values: Mapping[str, Any], parts: tuple[str | int, ...]) -> dict[str, Any]:
    node: Any = deep_merge({}, values)
    for part in parts:
        node = node.get(part, {}) if isinstance(node, Mapping) else {}
    return dict(node or {})


def render_annotations(values: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Resource name -> the annotations its pods get; unset keys render nothing. Fails like the render."""
    issues = annotation_issues(values)
    if issues:
        error = ConfigError(str(issues[0]))
        error.issues = tuple(issues)
        raise error
    rendered = {}
    for parts in ANNOTATION_MAPS:
        found = _annotations(values, parts)
        if found:
            rendered[WORKLOADS[key_path(parts)][1]] = found
    return rendered


def change_effects(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, str]:
    """What an annotation change does to each workload it touches."""
    before, after = render_annotations(old), render_annotations(new)
    effects = {}
    for _ns, name, _kind, strategy in WORKLOADS.values():
        if before.get(name) != after.get(name):
            effects[name] = (
                "pods pick up the change only when deleted (OnDelete)" if strategy == ON_DELETE else "rolls"
            )
    return effects


# -- restarts ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pod:
    name: str
    revision: int
    ready: bool = True
    sealed: bool = False  # OpenBao only


@dataclass(frozen=True)
class Workload:
    namespace: str
    name: str
    kind: str
    strategy: str
    revision: int
    pods: tuple[Pod, ...]

    def outdated(self) -> list[str]:
        return [p.name for p in self.pods if p.revision != self.revision]

    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)


def workload(resource: str, replicas: int = 3) -> Workload:
    namespace, name, kind, strategy = next(w for w in WORKLOADS.values() if w[1] == resource)
    if kind == STATEFULSET:
        pods = tuple(Pod(f"{name}-{i}", 1) for i in range(replicas))
    else:
        pods = tuple(Pod(f"{name}-r1-{i}", 1) for i in range(replicas))
    return Workload(namespace, name, kind, strategy, 1, pods)


def rollout_restart(w: Workload) -> tuple[Workload, list[str]]:
    """``kubectl rollout restart``: bumps the pod template; returns the pods replaced, in order."""
    revision = w.revision + 1
    if w.strategy == ON_DELETE:
        return replace(w, revision=revision), []  # nothing is replaced until each pod is deleted
    if w.kind == DEPLOYMENT:
        pods = tuple(Pod(f"{w.name}-r{revision}-{i}", revision) for i in range(len(w.pods)))
        return replace(w, revision=revision, pods=pods), [p.name for p in w.pods]
    order = [p.name for p in reversed(w.pods)]  # one at a time, highest ordinal first
    pods = tuple(Pod(p.name, revision) for p in w.pods)
    return replace(w, revision=revision, pods=pods), order


def rollout_status(w: Workload) -> tuple[int, str]:
    if w.strategy == ON_DELETE:
        return 1, ROLLOUT_STATUS_ONDELETE
    if w.outdated():
        pending = len(w.outdated())
        return 1, f"Waiting for rollout to finish: {pending} old replicas are pending termination..."
    noun = "deployment" if w.kind == DEPLOYMENT else "statefulset"
    return 0, f'{noun} "{w.name}" successfully rolled out'


def delete_pod(w: Workload, name: str) -> Workload:
    """The controller recreates the pod from the current template; an OpenBao member restarts sealed."""
    sealed = w.name == "openbao-server"
    pods = []
    for index, pod in enumerate(w.pods):
        if pod.name != name:
            pods.append(pod)
        else:
            # A StatefulSet pod keeps its name; a Deployment's replacement gets a new one.
            fresh = pod.name if w.kind == STATEFULSET else f"{w.name}-r{w.revision}-{index}-re"
            pods.append(Pod(fresh, w.revision, True, sealed))
    return replace(w, pods=tuple(pods))


def unseal(w: Workload, name: str) -> Workload:
    return replace(w, pods=tuple(replace(p, sealed=False) if p.name == name else p for p in w.pods))


def bao_status(w: Workload, name: str) -> str:
    """The line of ``bao status`` the runbook reads."""
    return f"Sealed          {str(w.pod(name).sealed).lower()}"


def sealed_members(w: Workload) -> list[str]:
    return [p.name for p in w.pods if p.sealed]
