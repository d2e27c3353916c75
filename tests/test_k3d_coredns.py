"""The clusters' DNS records in the k3d backend, and `ncpsim dns-rewrite`.

Same names in, same answers out: each name is asked of the local resolver's view of a cluster (dns.rule)
and of the k3d cluster as rendered: the coredns-custom ConfigMap read back by dns.coredns.view_of, with
the rendered Services (at their Endpoints' addresses) as the cluster's own names.
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
from dns.coredns import view_of
from dns.rule import View, answer, dashed_ip
from scenarios.load import load_scenario
from sim.errors import BackendError
from sim.model.parts import CONTROL_CLUSTER
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


def k3d_view(objects: list[dict], cluster: str) -> View:
    """What the rendered cluster answers: coredns-custom read back, the Services it renders as its own
    names (at their Endpoints' addresses, where a connection to them goes)."""
    services = tuple(
        (f"{o['metadata']['name']}.{o['metadata']['namespace']}.svc.cluster.local", a["ip"])
        for o in objects
        if o["kind"] == "Endpoints"
        for subset in o["subsets"]
        for a in subset["addresses"]
    )
    maps = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "coredns-custom"]
    return view_of(maps[0], cluster, services) if maps else View(cluster, services)


DNS_SCENARIOS = [
    "http-callback",
    "multi-compute",
    "grpc-callback",
    "dns-missing",
    "dns-rewrite-wrong-domain",
    "dns-rewrite-to-missing-service",
    "dns-rewrite-to-exposed-service",
    "dns-exact-invocation-record",
]


@pytest.mark.parametrize("scenario", DNS_SCENARIOS)
def test_same_names_in_same_answers_out(scenario: str) -> None:
    topology = load_scenario(scenario).build_topology("default")
    rendered = manifests_by_cluster(topology, MATERIAL, Addresses.virtual(topology))
    views = topology.dns_views()
    checked = 0
    for cluster in topology.compute_clusters:
        k3d = k3d_view(rendered[cluster.name], cluster.name)
        for qname in names(topology):
            for qtype in ("A", "AAAA"):
                local, theirs = answer(views[cluster.name], qname, qtype), answer(k3d, qname, qtype)
                assert (local.rcode, local.addresses) == (theirs.rcode, theirs.addresses), (qname, qtype)
                checked += local.rcode == "NOERROR"
    # the comparison is not vacuous: every scenario but the broken ones resolves the proxy's names
    broken = ("dns-missing", "dns-rewrite-wrong-domain", "dns-rewrite-to-missing-service")
    assert (checked > 0) is (scenario not in broken), checked


def test_the_records_are_rendered_from_the_resolvers_own_records() -> None:
    topology = load_scenario("http-callback").build_topology("default")
    cluster = topology.compute_clusters[0]
    records = topology.dns_views()[cluster.name].records
    rendered = coredns_rewrite(topology, cluster, "172.30.0.3")
    assert records and rendered is not None
    text = rendered["data"]["worker-callback.override"]
    assert f"# ncpsim: *.{topology.worker_domain} -> 172.30.0.3" in text  # the live address, not the virtual
    assert answer(view_of(rendered, cluster.name), f"10-42-0-11.{topology.worker_domain}", "A").addresses == (
        "172.30.0.3",
    )


def test_a_compute_cluster_holds_no_proxy_service_of_its_own() -> None:
    """As in the field (seed: "the compute cluster does not have [it] yet"): the make target's name does not
    resolve in a rendered compute cluster unless a record makes it."""
    topology = load_scenario("dns-rewrite-to-missing-service").build_topology("default")
    rendered = manifests_by_cluster(topology, MATERIAL, Addresses(proxy="172.30.0.3", bus="172.30.0.4"))
    cluster = topology.compute_clusters[0].name
    assert not [o for o in rendered[cluster] if o["metadata"]["name"] == "worker-callback-proxy"]
    view = k3d_view(rendered[cluster], cluster)
    assert answer(view, "worker-callback-proxy.nvcf.svc.cluster.local", "A").rcode == "NXDOMAIN"
    assert answer(view, f"invocation.{topology.worker_domain}", "A").rcode == "NXDOMAIN"
    assert CONTROL_CLUSTER in rendered


# -- ncpsim dns-rewrite ---------------------------------------------------------------------------
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


def test_plan_sends_the_names_where_the_backend_does() -> None:
    """`ncpsim dns-rewrite` writes the make target's form (a rewrite to the proxy Service it creates); the
    backend writes the seed's wildcard record for the load balancer. The same names reach the same address."""
    topology = load_scenario("http-callback").build_topology("default")
    cluster = topology.compute_clusters[0].name
    backend = k3d_view(
        manifests_by_cluster(topology, MATERIAL, Addresses(proxy="172.30.0.3", bus="172.30.0.4"))[cluster],
        cluster,
    )
    planned = plan(topology.worker_domain, parse_target("worker-callback-proxy"), "172.30.0.3")
    assert [o["kind"] for o in planned] == ["Namespace", "Service", "Endpoints", "ConfigMap"]
    made = k3d_view(planned, cluster)
    assert "worker-callback-proxy.nvcf.svc.cluster.local." in planned[-1]["data"]["worker-callback.override"]
    for qname in names(topology):
        mine, theirs = answer(made, qname, "A"), answer(backend, qname, "A")
        if qname != "worker-callback-proxy.nvcf.svc.cluster.local":  # the Service the plan creates
            assert (mine.rcode, mine.addresses) == (theirs.rcode, theirs.addresses), qname
