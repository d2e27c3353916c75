"""What `ncpsim render --backend k3d` writes: every k3d config validates against k3d's published JSON
schema, every manifest validates with kubernetes-validate in strict mode, and the objects say what
DESIGN.md sections 1 and 4 ask (clusters, CIDRs, ports, Secrets, proxy, compute-side Services)."""

from __future__ import annotations

import functools
import ipaddress
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from certs.profiles import FRONTEND_SECRET, GRPC_SECRET, INVOCATION_SECRET, PUBLIC_FRONTEND_SECRET
from clusters.k3d.engine import CONTEXT_DIRS, context_members
from clusters.render.bundle import Addresses, manifests_by_cluster, render_bundle
from clusters.render.control_plane import CertMaterial
from clusters.render.envoy import render_envoy
from clusters.render.k3d_config import k3d_configs
from clusters.render.layout import KUBE_VERSION, NETWORK
from scenarios.load import load_scenario
from scenarios.lookup import catalogue_names
from sim.errors import NcpsimError
from sim.model.topology import Topology
from sim.model.values import deep_merge
from sim.nats.config import render
from sim.nats.server import find_binary
from sim.nats.stack import StackKeys, server_config
from sim.proxy.component import policy_from_values

# kubernetes-validate re-reads its (large) schema files and lists its schema folders on every call;
# caching both keeps the strict validation of every rendered object of every scenario to a few seconds.
_utils = kubernetes_validate.utils
_utils.schema_contents = functools.lru_cache(maxsize=None)(_utils.schema_contents)
_utils.all_versions = functools.lru_cache(maxsize=None)(_utils.all_versions)

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # PyYAML built without libyaml has none

# k3d's own schema, vendored with its licence (vendor/k3d/README.md says from where).
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "vendor" / "k3d" / "k3d-config-v1alpha5.schema.json"

SECRET_NAMES = (FRONTEND_SECRET, INVOCATION_SECRET, GRPC_SECRET, PUBLIC_FRONTEND_SECRET)
MATERIAL = CertMaterial(
    secrets={name: (f"{name} crt".encode(), f"{name} key".encode(), b"ca") for name in SECRET_NAMES},
    stack_ca=b"-----BEGIN CERTIFICATE-----\nstack\n-----END CERTIFICATE-----\n",
    public_ca=b"-----BEGIN CERTIFICATE-----\npublic\n-----END CERTIFICATE-----\n",
)


@functools.cache
def topology(name: str) -> Topology | None:
    """A catalogue scenario's topology, built when a test first asks for it (collection reads only the
    names); None for a scenario whose values are meant to be refused: it has nothing to render."""
    try:
        return load_scenario(name).build_topology("default")
    except NcpsimError:
        load_scenario(name, allow_expected_error=True)  # refused as its expectation says, or this raises
        return None


def rendered(name: str) -> Topology:
    """The topology of a scenario that renders."""
    built = topology(name)
    assert built is not None, f"{name} is refused: it renders nothing"
    return built


NAMES = catalogue_names()


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def rendered_yaml(topology: Topology, addresses: Addresses | None = None) -> dict[str, list[dict]]:
    """Each rendered file read back as a YAML reader (k3d, kubectl) would; with libyaml's safe loader, which
    reads what PyYAML's reads ten times faster (the pure-Python one was most of this module's time)."""
    return {
        path: list(yaml.load_all(f.text, Loader=SAFE_LOADER))
        for path, f in render_bundle(topology, MATERIAL, addresses).items()
    }


def test_catalogue_has_multi_cluster_scenarios() -> None:
    built = [t for t in map(topology, NAMES) if t is not None]
    assert rendered("http-callback") and any(len(t.compute_clusters) > 1 for t in built)


@pytest.mark.parametrize("name", NAMES)
def test_every_k3d_config_validates_against_the_schema(name: str, validator) -> None:
    if (built := topology(name)) is None:
        return  # refused as the scenario expects (topology() checked that): nothing rendered to validate
    files = rendered_yaml(built)
    configs = {path: docs[0] for path, docs in files.items() if path.startswith("k3d/")}
    assert len(configs) == len(built.clusters)
    for path, config in configs.items():
        errors = sorted(validator.iter_errors(config), key=str)
        assert not errors, f"{path}: {errors[0].message}"


def test_schema_check_is_strict_enough_to_fail(validator) -> None:
    config = k3d_configs(rendered("http-callback"))["ncpsim-cp"]
    assert not list(validator.iter_errors(config))
    for broken in (
        {**config, "servers": 0},
        {**config, "options": {**config["options"], "k3d": {"waitForIt": True}}},
        {**config, "ports": [{"port": 10084}]},  # the schema wants "host:container/proto" strings
    ):
        assert list(validator.iter_errors(broken)), broken


# Objects already found valid, as canonical JSON: most scenarios render many of the same objects (about
# 330 distinct among 1,500), and an object's validity is a property of its content alone.
VALID: set[str] = set()


@pytest.mark.parametrize("name", NAMES)
def test_every_manifest_validates_strictly(name: str) -> None:
    if (built := topology(name)) is None:
        return  # refused as the scenario expects (topology() checked that): nothing rendered to validate
    files = rendered_yaml(built, Addresses(proxy="172.30.0.3", bus="172.30.0.3"))
    objects = [obj for path, docs in files.items() if path.startswith("manifests/") for obj in docs]
    assert objects
    for obj in objects:
        content = json.dumps(obj, sort_keys=True)
        if content not in VALID:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            VALID.add(content)


def test_strict_validation_catches_an_unknown_field() -> None:
    objects = manifests_by_cluster(
        rendered("http-callback"), MATERIAL, Addresses.virtual(rendered("http-callback"))
    )
    deployment = next(o for o in objects["ncpsim-cp"] if o["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy2"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_VERSION, strict=True)


# -- k3d configs ----------------------------------------------------------------------------------
def test_clusters_share_one_network_with_distinct_ranges() -> None:
    topology = rendered("multi-compute")
    configs = k3d_configs(topology)
    assert list(configs) == ["ncpsim-cp", "ncpsim-compute-1", "ncpsim-compute-2", "ncpsim-compute-3"]
    ranges = []
    for cluster in topology.clusters:
        config = configs[cluster.name]
        assert config["apiVersion"] == "k3d.io/v1alpha5" and config["kind"] == "Simple"
        assert config["network"] == NETWORK and config["options"]["k3d"]["timeout"] == "180s"
        args = [a["arg"] for a in config["options"]["k3s"]["extraArgs"]]
        assert (
            f"--cluster-cidr={cluster.pod_cidr}" in args and f"--service-cidr={cluster.service_cidr}" in args
        )
        assert f"--cluster-dns={cluster.dns_ip}" in args
        ranges += [ipaddress.ip_network(cluster.pod_cidr), ipaddress.ip_network(cluster.service_cidr)]
    assert not [(a, b) for i, a in enumerate(ranges) for b in ranges[i + 1 :] if a.overlaps(b)]


def test_only_the_control_plane_publishes_the_proxy_ports_on_its_load_balancer() -> None:
    configs = k3d_configs(rendered("http-callback"))
    assert configs["ncpsim-cp"]["ports"] == [
        {"port": "10084:10084/tcp", "nodeFilters": ["loadbalancer"]},
        {"port": "443:443/udp", "nodeFilters": ["loadbalancer"]},
    ]
    assert "ports" not in configs["ncpsim-compute-1"]
    assert configs["ncpsim-cp"]["options"]["kubeconfig"]["switchCurrentContext"] is False


# -- control plane --------------------------------------------------------------------------------
def control_objects(topology: Topology) -> dict[tuple[str, str], dict]:
    objects = manifests_by_cluster(topology, MATERIAL, Addresses.virtual(topology))["ncpsim-cp"]
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_control_plane_objects() -> None:
    objects = control_objects(rendered("http-callback"))
    assert next(iter(objects)) == ("Namespace", "nvcf")  # applied first
    assert {("Secret", name) for name in SECRET_NAMES} <= set(objects)
    assert objects[("Secret", INVOCATION_SECRET)]["type"] == "kubernetes.io/tls"
    for service, deployment in (
        ("invocation", "invocation-service"),
        ("grpc-headless", "grpc-proxy-deployment"),
    ):
        spec = objects[("Service", service)]["spec"]
        assert spec["clusterIP"] == "None" and spec["selector"] == {"app": deployment}
        assert ("Deployment", deployment) in objects
    assert objects[("Deployment", "invocation-service")]["spec"]["replicas"] == 2
    proxy = objects[("Service", "worker-callback-proxy")]["spec"]
    assert proxy["type"] == "LoadBalancer"
    assert [(p["port"], p["protocol"]) for p in proxy["ports"]] == [(10084, "TCP"), (443, "UDP")]
    nats = objects[("Service", "nats")]["spec"]
    assert nats["type"] == "LoadBalancer" and [p["port"] for p in nats["ports"]] == [4222]


def test_nats_runs_the_real_server_with_the_local_backends_config(tmp_path: Path) -> None:
    """nats-server from nats.image.*, the config the local backend renders (listening on the pod), accepted by
    the real binary's config check; the callout as a stand-in; ready from /healthz."""
    values = {
        "nats": {"image": {"registry": "registry.example.com", "repository": "mirror/nats", "tag": "2.11.4"}}
    }
    topology = replace(rendered("http-callback"), values=deep_merge(rendered("http-callback").values, values))
    objects = control_objects(topology)
    pod = objects[("Deployment", "nats")]["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    assert server["image"] == "registry.example.com/mirror/nats:2.11.4"
    assert server["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 8222}
    text = objects[("ConfigMap", "nats-config")]["data"]["nats-server.conf"]
    local = render(server_config(StackKeys.of(topology), "/data/jetstream", 4222, 8222))
    assert text == local.replace('listen: "127.0.0.1:4222"', 'listen: "0.0.0.0:4222"').replace(
        'http: "127.0.0.1:8222"', 'http: "0.0.0.0:8222"'
    )
    conf = tmp_path / "nats-server.conf"
    conf.write_text(text.replace("/data/jetstream", str(tmp_path / "js")))
    checked = subprocess.run(
        [str(find_binary()), "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30, check=False
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout
    callout = objects[("Deployment", "nats-auth-callout-service")]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert callout["args"] == ["nats-callout"] and callout["command"] == ["python", "-m", "clusters.k3d.pod"]
    env = {e["name"]: e.get("value") for e in callout["env"]}
    assert env["NCPSIM_BUS_ADDRESS"] == "nats.nvcf.svc.cluster.local:4222"


def test_proxy_runs_envoy_from_values_with_the_rendered_config() -> None:
    topology = rendered("http-callback")
    objects = control_objects(topology)
    pod = objects[("Deployment", "worker-callback-proxy")]["spec"]["template"]["spec"]
    image = topology.values["workerCallbackProxy"]["image"]
    assert pod["containers"][0]["image"] == f"{image['registry']}/{image['repository']}:{image['tag']}"
    config = objects[("ConfigMap", "worker-callback-proxy-envoy")]["data"]
    expected = render_envoy(policy_from_values(topology.values), topology.worker_domain)
    assert yaml.safe_load(config["envoy.yaml"]) == expected.bootstrap
    assert {k: yaml.safe_load(v) for k, v in config.items() if k.startswith("sds-")} == {
        f"sds-{k}": v for k, v in expected.sds.items()
    }
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    # Whole Secret volumes (never subPath), so the kubelet's ..data swap reaches Envoy's watch.
    assert secrets["frontend"] == {
        "secretName": FRONTEND_SECRET,
        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
    }
    assert secrets["invocation-ca"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # never the pods' keys
    assert not [m for m in pod["containers"][0]["volumeMounts"] if "subPath" in m]


def test_public_frontend_mounts_the_public_secret() -> None:
    topology = rendered("public-frontend-cert")
    pod = control_objects(topology)[("Deployment", "worker-callback-proxy")]["spec"]["template"]["spec"]
    frontend = next(v for v in pod["volumes"] if v["name"] == "frontend")
    assert frontend["secret"]["secretName"] == PUBLIC_FRONTEND_SECRET


def test_no_proxy_objects_when_the_proxy_is_disabled() -> None:
    topology = rendered("single-cluster-direct")
    assert not topology.proxy_enabled
    proxy_objects = [k for k in control_objects(topology) if k[1].startswith("worker-callback-proxy")]
    assert [k for k in proxy_objects if k[0] != "Secret"] == []  # certificates are issued all the same


def test_topology_configmap_round_trips() -> None:
    topology = rendered("multi-compute")
    data = control_objects(topology)[("ConfigMap", "ncpsim-topology")]["data"]["topology.json"]
    assert Topology.from_json(data) == topology


# -- compute clusters -----------------------------------------------------------------------------
def compute_objects(topology: Topology, cluster: str = "ncpsim-compute-1") -> dict[tuple[str, str], dict]:
    objects = manifests_by_cluster(topology, MATERIAL, Addresses(proxy="172.30.0.3", bus="172.30.0.4"))[
        cluster
    ]
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_compute_cluster_reaches_the_proxy_at_its_load_balancer_address() -> None:
    """The seed's step 2: a wildcard record for the load balancer's address; NATS through a selectorless
    Service. No Service stands for the proxy, so the make target's name does not resolve there unasked."""
    objects = compute_objects(rendered("http-callback"))
    assert ("Service", "worker-callback-proxy") not in objects
    text = objects[("ConfigMap", "coredns-custom")]["data"]["worker-callback.override"]
    assert 'answer "{{ .Name }} 5 IN A 172.30.0.3"' in text
    service = objects[("Service", "nats")]
    assert "selector" not in service["spec"] and service["metadata"]["namespace"] == "nvcf"
    assert objects[("Endpoints", "nats")]["subsets"][0]["addresses"] == [{"ip": "172.30.0.4"}]


def test_workers_get_nvcf_proxy_ca_pem_only_when_configured() -> None:
    topology = rendered("http-callback")  # workerCallbackCaPem: "@stack-ca"

    def env_of(t: Topology) -> dict[str, str]:
        container = compute_objects(t)[("Deployment", "worker-1-0")]["spec"]["template"]["spec"][
            "containers"
        ][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert env_of(topology)["NVCF_PROXY_CA_PEM"] == MATERIAL.stack_ca.decode()
    values = deep_merge(topology.values, {"global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": ""}}}})
    assert "NVCF_PROXY_CA_PEM" not in env_of(replace(topology, values=values))


def test_scenario_without_the_rewrite_renders_no_coredns_custom() -> None:
    topology = rendered("dns-missing")
    assert not [c for c in topology.clusters if c.kind == "compute" and c.dns_records]
    assert ("ConfigMap", "coredns-custom") not in compute_objects(topology)


def test_every_worker_has_a_deployment_in_its_cluster() -> None:
    topology = rendered("multi-compute")
    for cluster in topology.compute_clusters:
        names = {key[1] for key in compute_objects(topology, cluster.name) if key[0] == "Deployment"}
        assert names == {w.name for w in topology.workers_in(cluster.name)}


# -- files and the image --------------------------------------------------------------------------
def test_bundle_files_and_which_hold_private_keys() -> None:
    files = render_bundle(rendered("http-callback"), MATERIAL)
    assert sorted(files) == [
        "envoy/envoy.yaml",
        "envoy/sds/frontend.yaml",
        "envoy/sds/grpc_ca.yaml",
        "envoy/sds/invocation_ca.yaml",
        "k3d/ncpsim-compute-1.yaml",
        "k3d/ncpsim-cp.yaml",
        "manifests/ncpsim-compute-1.yaml",
        "manifests/ncpsim-cp.yaml",
    ]
    assert {p for p, f in files.items() if f.private} == {
        "manifests/ncpsim-cp.yaml",
        "manifests/ncpsim-compute-1.yaml",
    }
    assert not [p for p, f in files.items() if "&id0" in f.text or "*id0" in f.text]  # no YAML aliases


def test_render_task_writes_files_without_running_anything(tmp_path: Path, monkeypatch) -> None:
    from clusters.k3d import tasks

    monkeypatch.setenv("NCPSIM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # any command would fail to start
    topology = load_scenario("http-callback").build_topology("default")
    assert tasks.render(tmp_path / "out", topology, "http-callback") == 0
    assert (tmp_path / "out" / "k3d" / "ncpsim-cp.yaml").exists()
    assert (tmp_path / "out" / "manifests" / "ncpsim-cp.yaml").stat().st_mode & 0o777 == 0o600
    text = (tmp_path / "out" / "manifests" / "ncpsim-cp.yaml").read_text()
    assert "PRIVATE KEY" not in text and "tls.key" in text  # Secret data is base64, as Kubernetes wants


def test_image_context_is_an_allow_list() -> None:
    members = {p.as_posix() for p in context_members()}
    assert {"pyproject.toml", "docker/Dockerfile", "clusters/k3d/pod.py", "sim/runtime/run.py"} <= members
    assert not [m for m in members if m.startswith((".venv", ".ncpsim", "tests/")) or "__pycache__" in m]
    dockerfile = (Path(__file__).resolve().parents[1] / "docker" / "Dockerfile").read_text()
    for folder in CONTEXT_DIRS:  # everything sent is copied, and only that
        assert f"COPY {folder} ./{folder}" in dockerfile
