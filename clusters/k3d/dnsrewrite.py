"""`ncpsim dns-rewrite`: the compute cluster's ``*.<workerDomain>`` CoreDNS rewrite, applied to any
existing cluster (an ncpsim compute cluster, or e.g. ``ncp-local-compute-1`` of the stack's own local
tooling), rendered by the same function as the k3d backend's.

When the rewrite's target is a cluster-local Service the cluster lacks, the selectorless Service and
Endpoints that stand for the proxy are created too (the address comes from --proxy-address, or from
ncpsim's own control plane). Before switching the kubectl context it asks, as the stack's make
target does; every command also names the context explicitly, so nothing lands elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusters.k3d.runner import CommandRunner
from clusters.render import kube
from clusters.render.compute import proxy_service
from clusters.render.layout import PROXY_NAME, kube_context
from clusters.render.text import dump_all
from dns.coredns import render_coredns_custom
from dns.rule import normalize_name, wildcard
from sim.errors import BackendError, ConfigError
from sim.model.parts import CONTROL_CLUSTER
from sim.wire import NAMESPACE

SERVICE_FQDN = re.compile(r"^(?P<name>[a-z0-9-]+)\.(?P<ns>[a-z0-9-]+)\.svc\.cluster\.local$")


@dataclass(frozen=True)
class Target:
    fqdn: str  # what the rewrite answers with
    service: tuple[str, str] | None  # (namespace, name) when it is a Service of the cluster


def parse_target(proxy_service_name: str) -> Target:
    """`worker-callback-proxy` (namespace nvcf), `NAME.NS.svc.cluster.local`, or any other DNS name."""
    name = normalize_name(proxy_service_name or "")
    if name is None:
        raise ConfigError(f"--proxy-service {proxy_service_name!r}: give a Service name or a DNS name")
    if "." not in name:
        name = f"{name}.{NAMESPACE}.svc.cluster.local"
    match = SERVICE_FQDN.match(name)
    return Target(name, (match["ns"], match["name"]) if match else None)


def plan(domain: str, target: Target, address: str | None) -> list[dict[str, Any]]:
    """The objects to apply: the Service pair when it must be created (address given), then the rewrite
    of every name under `domain` to the target's name, as the make target writes it."""
    try:
        rewrite = wildcard(domain, target.fqdn)
    except ValueError as exc:
        raise ConfigError(f"dns-rewrite {domain} -> {target.fqdn}: {exc}") from None
    objects: list[dict[str, Any]] = []
    if address is not None and target.service is not None:
        namespace, name = target.service
        objects += [kube.namespace(namespace), *proxy_service(address, name, namespace)]
    return [*objects, render_coredns_custom([rewrite])]


def ncpsim_proxy_address(runner: CommandRunner) -> str | None:
    """The proxy's load-balancer IP of ncpsim's own control plane, if it is up."""
    result = runner.run(
        "kubectl",
        "--context",
        kube_context(CONTROL_CLUSTER),
        "-n",
        NAMESPACE,
        "get",
        "service",
        PROXY_NAME,
        "-o",
        "json",
        check=False,
    )
    if not result.ok:
        return None
    ingress = json.loads(result.stdout or "{}").get("status", {}).get("loadBalancer", {}).get("ingress") or []
    return ingress[0].get("ip") if ingress else None


def service_exists(runner: CommandRunner, context: str, target: Target) -> bool:
    if target.service is None:
        return True  # not ours to create: an external name must already resolve
    namespace, name = target.service
    return runner.run(
        "kubectl", "--context", context, "-n", namespace, "get", "service", name, "-o", "name", check=False
    ).ok


def confirm_context(runner: CommandRunner, context: str, assume_yes: bool, ask: Callable[[str], str]) -> bool:
    current = runner.run("kubectl", "config", "current-context", check=False).stdout.strip()
    if current == context:
        return True
    if not assume_yes:
        answer = ask(f"Switch kubectl context from {current or '(none)'} to {context}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return False
    runner.run("kubectl", "config", "use-context", context)
    return True


def address_to_create(runner: CommandRunner, context: str, target: Target, given: str | None) -> str | None:
    """The proxy address for a Service pair to create, or None when the cluster already has the target."""
    if service_exists(runner, context, target):
        return None
    address = given or ncpsim_proxy_address(runner)
    if address is None:
        raise BackendError(
            f"{context} has no Service {target.fqdn} and the proxy's address is unknown; "
            "pass --proxy-address with the proxy load balancer's IP"
        )
    return address


def apply_and_restart(runner: CommandRunner, context: str, objects: list[dict[str, Any]]) -> str:
    kubectl = ("kubectl", "--context", context)
    applied = runner.run(*kubectl, "apply", "-f", "-", input_text=dump_all(objects)).stdout
    runner.run(*kubectl, "-n", "kube-system", "rollout", "restart", "deployment", "coredns")
    runner.run(*kubectl, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s")
    return applied.strip()


def dns_rewrite(
    context: str,
    domain: str,
    proxy_service_name: str,
    dry_run: bool = False,
    assume_yes: bool = False,
    *,
    proxy_address: str | None = None,
    runner: CommandRunner | None = None,
    ask: Callable[[str], str] = input,
    out: Callable[[str], None] = print,
) -> int:
    """0 when applied (or printed with dry_run), 1 when the user declined the context switch."""
    runner = runner or CommandRunner()
    if runner.which("kubectl") is None:
        raise BackendError("kubectl not found on PATH; `ncpsim doctor` shows the install step")
    target = parse_target(proxy_service_name)
    objects = plan(domain, target, address_to_create(runner, context, target, proxy_address))
    if dry_run:
        out(f"# would apply to context {context}, then restart kube-system/coredns")
        out(dump_all(objects))
        return 0
    if not confirm_context(runner, context, assume_yes, ask):
        out("not switching the kubectl context; nothing was changed")
        return 1
    out(apply_and_restart(runner, context, objects))
    out(f"*.{normalize_name(domain)} now resolves to {target.fqdn} in {context}")
    return 0
