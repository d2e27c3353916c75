"""The compute clusters' CoreDNS rewrite in the k3d backend, and `invoke dns-rewrite`.

Same names in, same answers out: each name is asked of the local resolver's view of a compute cluster
(dns.rule) and of the k3d cluster as rendered: the coredns-custom rewrite read back by
dns.coredns.evaluate_rewrite, then the rendered Service and Endpoints it points at.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from clusters.k3d.dnsrewrite import dns_rewrite, parse_target, plan
from clusters.k3d.runner import CommandRunner
from clusters.render.bundle import Addresses, manifests_by_cluster
from clusters.render.compute import coredns_rewrite
from clusters.render.control_plane import CertMaterial
from dns.coredns import evaluate_rewrite
from dns.rule import answer, dashed_ip, normalize_name
from scenarios.model import load_scenario
from sim.errors import BackendError
from sim.model.topology import Topology

FAKEBIN = Path(__file__).resolve().parent / "fakebin"
_spec = importlib.util.spec_from_file_location("ncpsim_fake_tools", FAKEBIN / "fake.py")
assert _spec and _spec.loader
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)

MATERIAL = CertMaterial(secrets={}, stack_ca=b"stack", public_ca=b"public")


def names(topology: Topology) -> list[str]:
    wd = topology.worker_domain
    pods = [f"{dashed_ip(p.ip)}.{wd}" for p in topology.pods]
    return [
        *pods,
        f"invocation.{wd}",
        f"INVOCATION.{wd.upper()}.",
        f"a.b.10-42-0-17.{wd}",
        f"*.{wd}",
        f"{wd}.{wd}",
        wd,  # the apex is not under the wildcard
        f"{wd}.",
        f"x{wd}",
        f"{wd}.evil.example",
        *[p.fqdn for p in topology.pods],  # control-plane pod names: never rewritten in a compute cluster
        "worker-callback-proxy.nvcf.svc.cluster.local",
        "example.com",
    ]


def k3d_answer(objects: list[dict], qname: str) -> tuple[str, ...] | None:
    """The A answer the rendered compute cluster gives, or None when the rewrite leaves the name alone
    (CoreDNS then answers from its other plugins, like a cluster without the rewrite)."""
    configmap = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "coredns-custom"
    )
    target = evaluate_rewrite(configmap, qname)
    if target is None:
        return None
    services = {
        f"{o['metadata']['name']}.{o['metadata']['namespace']}.svc.cluster.local": o
        for o in objects
        if o["kind"] == "Endpoints"
    }
    endpoints = services[target]  # the rewrite must point at a Service this cluster has
    return tuple(a["ip"] for subset in endpoints["subsets"] for a in subset["addresses"])


@pytest.mark.parametrize("scenario", ["http-callback", "multi-compute", "grpc-callback"])
def test_same_names_in_same_answers_out(scenario: str) -> None:
    topology = load_scenario(scenario).build_topology("default")
    rendered = manifests_by_cluster(topology, MATERIAL, Addresses.virtual(topology))
    views = topology.dns_views()
    for cluster in topology.compute_clusters:
        view = views[cluster.name]
        for qname in names(topology):
            local = answer(view, qname, "A")
            k3d = k3d_answer(rendered[cluster.name], qname)
            if local.matched == "wildcard":
                assert k3d == local.addresses == (topology.proxy_lb_ip,), qname
            else:
                assert k3d is None, f"{qname}: rewritten in k3d but not by the local rule"


def test_the_rewrite_is_rendered_from_the_resolvers_own_rule_object() -> None:
    topology = load_scenario("http-callback").build_topology("default")
    cluster = topology.compute_clusters[0]
    rule = topology.dns_views()[cluster.name].wildcard
    rendered = coredns_rewrite(topology, cluster)
    assert rule is not None and rendered is not None
    assert (
        f"*.{rule.domain} -> worker-callback-proxy.nvcf.svc.cluster.local"
        in rendered["data"]["worker-callback.override"]
    )
    assert (
        evaluate_rewrite(rendered, f"10-42-0-11.{rule.domain}")
        == "worker-callback-proxy.nvcf.svc.cluster.local"
    )


# -- invoke dns-rewrite ---------------------------------------------------------------------------
@pytest.fixture
def tools(tmp_path: Path):
    harness = fake.Harness(tmp_path)
    harness.preset(context="k3d-ncpsim-cp")
    return harness


def run(tools, *, answer_with: str = "y", **kwargs) -> tuple[int, CommandRunner, list[str], list[str]]:
    runner, asked, out = CommandRunner(env=tools.env, echo=None), [], []

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return answer_with

    args = {"context": "ncp-local-compute-1", "domain": "grpc-worker.example.com"}
    args.update({"proxy_service_name": "worker-callback-proxy", **kwargs})
    code = dns_rewrite(**args, runner=runner, ask=ask, out=out.append)
    return code, runner, asked, out


def test_parse_target_forms() -> None:
    assert parse_target("worker-callback-proxy").service == ("nvcf", "worker-callback-proxy")
    assert parse_target("proxy.ops.svc.cluster.local.").service == ("ops", "proxy")
    external = parse_target("proxy.example.net")
    assert external.fqdn == "proxy.example.net" and external.service is None


def test_rewrite_creates_the_missing_service_after_asking_to_switch_context(tools) -> None:
    code, runner, asked, _out = run(tools, proxy_address="172.30.0.3")
    assert code == 0
    assert asked == ["Switch kubectl context from k3d-ncpsim-cp to ncp-local-compute-1? [y/N] "]
    ctx = ("kubectl", "--context", "ncp-local-compute-1")
    assert runner.commands == [
        (*ctx, "-n", "nvcf", "get", "service", "worker-callback-proxy", "-o", "name"),
        ("kubectl", "config", "current-context"),
        ("kubectl", "config", "use-context", "ncp-local-compute-1"),
        (*ctx, "apply", "-f", "-"),
        (*ctx, "-n", "kube-system", "rollout", "restart", "deployment", "coredns"),
        (*ctx, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s"),
    ]
    applied = set(tools.state()["objects"]["ncp-local-compute-1"])
    assert applied == {
        "namespace/nvcf",
        "service/worker-callback-proxy",
        "endpoints/worker-callback-proxy",
        "configmap/coredns-custom",
    }
    assert tools.state()["context"] == "ncp-local-compute-1"


def test_declining_the_context_switch_changes_nothing(tools) -> None:
    code, runner, asked, out = run(tools, answer_with="", proxy_address="172.30.0.3")
    assert code == 1 and asked and "nothing was changed" in out[-1]
    assert not [c for c in runner.commands if "apply" in c or "use-context" in c]
    assert tools.state()["context"] == "k3d-ncpsim-cp"


def test_assume_yes_and_an_existing_service_apply_only_the_rewrite(tools) -> None:
    tools.preset(context="elsewhere", objects={"ncp-local-compute-1": {"service/worker-callback-proxy": {}}})
    code, runner, asked, _ = run(tools, assume_yes=True)
    assert ("kubectl", "config", "use-context", "ncp-local-compute-1") in runner.commands
    assert code == 0 and asked == []
    applied = tools.state()["objects"]["ncp-local-compute-1"]
    assert "configmap/coredns-custom" in applied and "endpoints/worker-callback-proxy" not in applied


def test_dry_run_prints_the_objects_and_changes_nothing(tools) -> None:
    code, runner, asked, out = run(tools, dry_run=True, proxy_address="172.30.0.3")
    assert code == 0 and asked == []
    assert [c[3:] for c in runner.commands] == [
        ("-n", "nvcf", "get", "service", "worker-callback-proxy", "-o", "name")
    ]
    kinds = [o["kind"] for o in yaml.safe_load_all(out[1])]
    assert kinds == ["Namespace", "Service", "Endpoints", "ConfigMap"]


def test_missing_service_without_an_address_is_a_clear_error(tools) -> None:
    with pytest.raises(BackendError, match="--proxy-address"):
        run(tools)  # ncpsim's control plane is not up either, so there is no address to take


def test_missing_service_takes_ncpsims_own_proxy_address(tools) -> None:
    tools.preset(
        context="ncp-local-compute-1", objects={"k3d-ncpsim-cp": {"service/worker-callback-proxy": {}}}
    )
    code, _runner, _asked, _ = run(tools)
    assert code == 0
    assert "endpoints/worker-callback-proxy" in tools.state()["objects"]["ncp-local-compute-1"]


def test_plan_matches_what_the_backend_renders() -> None:
    topology = load_scenario("http-callback").build_topology("default")
    backend_view = coredns_rewrite(topology, topology.compute_clusters[0])
    planned = plan(topology.worker_domain, parse_target("worker-callback-proxy"), topology.proxy_lb_ip)
    assert planned[-1] == backend_view
    assert normalize_name(topology.worker_domain) in planned[-1]["data"]["worker-callback.override"]
