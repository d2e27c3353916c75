"""Rehearsals of the service-operations runbooks (pod annotations, restarts), each ending in a report."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim.errors import ConfigError
from sim.model.values import ANNOTATION_MAPS
from sim.runbooks import service_ops as ops
from sim.runbooks.given import NO_VALUES, Given
from sim.runbooks.report import RIGHT, Reads, RunbookReport, Steps

STEP_ANNOTATIONS = (
    'quote every annotation value ("8080", "true") and remove keys starting with '
    "nvcf.nvidia.com/nats-worker-auth or managed by the charts (checksum/...), then sync"
)
STEP_DELETE = (
    "delete each openbao-server pod in turn (standbys first, transfer leadership before the "
    "active one); OnDelete pods are not replaced by kubectl rollout restart"
)
STEP_SEAL = (
    "after each replacement run bao status in that member and unseal it before replacing the next; "
    "Kubernetes readiness is not the seal state"
)


def service_annotations(
    variant: str, _state_dir: Path | None = None, given: Given = NO_VALUES
) -> RunbookReport:
    steps = Steps()
    good = {
        "api": {"podAnnotations": {"example.com/scrape": "true"}},
        "openbao": {"server": {"annotations": {"example.com/scrape": "true"}}},
    }
    bad = {
        "api": {"podAnnotations": {"example.com/port": 8080, "nvcf.nvidia.com/nats-worker-auth-hash": "x"}}
    }
    values = given.over(good if variant == RIGHT else bad, ANNOTATION_MAPS)
    mine = given.under(ANNOTATION_MAPS)
    shown = f": {', '.join(given.show(values, parts) for parts in mine)}" if mine else ""
    steps(f"set pod annotations in environments/<env>.yaml{shown} and rendered")
    try:
        effects = ops.change_effects({}, values)
    except ConfigError as exc:
        problems = [str(issue) for issue in exc.issues]
        return RunbookReport(
            "service-annotations",
            variant,
            steps.as_tuple(),
            {"rendered": False, "issues": problems},
            False,
            f"the render fails: {'; '.join(problems)}",
            STEP_ANNOTATIONS,
        )
    steps(f"rendered: {effects}")
    return RunbookReport(
        "service-annotations", variant, steps.as_tuple(), {"rendered": True, "effects": effects}, True
    )


def openbao_restart(variant: str, _state_dir: Path | None = None, _given: Given = NO_VALUES) -> RunbookReport:
    """Replace every OpenBao member (e.g. to pick up new annotations)."""
    steps = Steps()
    bao = ops.workload("openbao-server")
    bao, replaced = ops.rollout_restart(bao)
    code, message = ops.rollout_status(bao)
    steps(
        f"kubectl rollout restart statefulset/openbao-server: replaced {replaced or 'nothing'}; "
        f"rollout status: exit {code}: {message}"
    )
    log: list[str] = [message]
    if variant == RIGHT:
        for name in ("openbao-server-2", "openbao-server-1", "openbao-server-0"):  # standbys first
            bao = ops.delete_pod(bao, name)
            bao = ops.unseal(bao, name)
            log.append(f"{name}: {ops.bao_status(bao, name)}")
            steps(f"deleted {name}, unsealed it, bao status shows it unsealed")
    return _restart_report("openbao-restart", variant, bao, steps, log)


def seal_check(variant: str, _state_dir: Path | None = None, _given: Given = NO_VALUES) -> RunbookReport:
    """Members replaced one by one; the wrong run waits only for readiness."""
    steps = Steps()
    bao, _ = ops.rollout_restart(ops.workload("openbao-server"))
    log: list[str] = []
    for name in ("openbao-server-2", "openbao-server-1", "openbao-server-0"):
        bao = ops.delete_pod(bao, name)
        if variant == RIGHT:
            bao = ops.unseal(bao, name)
        log.append(f"{name}: {ops.bao_status(bao, name)}")
        steps(
            f"deleted {name}; Ready={bao.pod(name).ready}"
            + ("; unsealed and checked" if variant == RIGHT else "; moved on")
        )
    return _restart_report("openbao-seal-check", variant, bao, steps, log)


def _restart_report(
    name: str, variant: str, bao: ops.Workload, steps: Steps, log: list[str]
) -> RunbookReport:
    outdated, sealed = bao.outdated(), ops.sealed_members(bao)
    state = {
        "revision": bao.revision,
        "outdated": outdated,
        "sealed": sealed,
        "ready": all(p.ready for p in bao.pods),
    }
    mistake = fix = None
    if outdated:
        mistake = (
            f"relied on kubectl rollout restart for an OnDelete StatefulSet: {', '.join(outdated)} "
            "still run the old revision"
        )
        fix = STEP_DELETE
    elif sealed:
        mistake = (
            f"checked only readiness: every pod is Ready but {', '.join(sealed)} "
            f"{'is' if len(sealed) == 1 else 'are'} sealed"
        )
        fix = STEP_SEAL
    return RunbookReport(name, variant, steps.as_tuple(), state, mistake is None, mistake, fix, tuple(log))


def deployment_restart(
    variant: str, _state_dir: Path | None = None, _given: Given = NO_VALUES
) -> RunbookReport:
    """A Deployment's rolling restart replaces all its pods; rollout status confirms it."""
    steps = Steps()
    api = ops.workload("nvcf-api", replicas=2)
    if variant == RIGHT:
        api, replaced = ops.rollout_restart(api)
        steps(f"kubectl rollout restart deployment/nvcf-api -n nvcf: replaced {', '.join(replaced)}")
    else:
        api = ops.delete_pod(api, api.pods[0].name)  # deleting a Deployment pod does not bump the template
        steps("deleted one nvcf-api pod instead of restarting the Deployment")
    code, message = ops.rollout_status(api)
    steps(f"kubectl rollout status: exit {code}: {message}")
    ok = api.revision > 1 and not api.outdated()
    mistake = None if ok else "deleted a pod instead of restarting: the Deployment was not rolled"
    fix = None if ok else "kubectl rollout restart deployment/nvcf-api -n nvcf, then kubectl rollout status"
    return RunbookReport(
        "deployment-restart",
        variant,
        steps.as_tuple(),
        {"revision": api.revision, "pods": [p.name for p in api.pods]},
        ok,
        mistake,
        fix,
        (message,),
    )


_RESTART = Reads(
    why="a restart reads no values (OpenBao's OnDelete strategy and the replicas are the chart's)"
)
READS = {
    "service-annotations": Reads(ANNOTATION_MAPS, why="it reads only the pod annotation maps"),
    "openbao-restart": _RESTART,
    "openbao-seal-check": _RESTART,
    "deployment-restart": _RESTART,
}
RUNS: dict[str, Callable[[str, Path | None, Given], RunbookReport]] = {
    "service-annotations": service_annotations,
    "openbao-restart": openbao_restart,
    "openbao-seal-check": seal_check,
    "deployment-restart": deployment_restart,
}
