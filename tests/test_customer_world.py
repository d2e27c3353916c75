"""The customer's world as the model lays it out (pure): service.type, DNS rewrites, Secrets, the CA PEM."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from certs.profiles import ISSUERS, PRIVATE, Profile, secret_profile
from dns.rule import Answer, answer
from scenarios.secrets import parse_secret_arg, with_brought_secrets
from scenarios.spec import Scenario
from sim.errors import ConfigError
from sim.model.netmap import NetMap, Refused, Unreachable
from sim.model.parts import (
    BUS_LB_IP,
    CONTROL_CLUSTER,
    CONTROL_NODE_IP,
    INVOCATION_SERVICE_IP,
    NODE_PORTS,
    PROXY_CLUSTER_IP,
    PROXY_LB_IP,
    DnsRewrite,
    SecretSpec,
)
from sim.model.topology import ComputeSpec, Topology, build
from sim.model.values import DEFAULTS, deep_merge

WD = "grpc-worker.example.com"
COMPUTE = "ncpsim-compute-1"


def values(service_type: str = "LoadBalancer", **agent: str) -> dict:
    proxy = {"enabled": True, "workerDomain": WD, "service": {"type": service_type}}
    return deep_merge(DEFAULTS, {"workerCallbackProxy": proxy, "global": {"nvcaOperator": {"agent": agent}}})


DEFAULT_REWRITE = DnsRewrite()


def topology(
    service_type: str = "LoadBalancer",
    rewrite: DnsRewrite = DEFAULT_REWRITE,
    control: DnsRewrite | None = None,
) -> Topology:
    return build("t", values(service_type), compute=(ComputeSpec((), rewrite),), control_rewrite=control)


def bound(t: Topology, port: int) -> NetMap:
    """The network map with the proxy's fronts bound as the proxy component binds them."""
    bindings = {f"{ip}:{p}/tcp": 40000 for ip, p in t.proxy_addresses(port)}
    return NetMap(bindings=bindings, reach={c.name: t.reachable_ranges(c.name) for c in t.clusters})


# -- workerCallbackProxy.service.type -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "proxy_ip", "from_compute"),
    [
        ("LoadBalancer", PROXY_LB_IP, "reached"),
        ("ClusterIP", PROXY_CLUSTER_IP, "unreachable"),
        ("NodePort", CONTROL_NODE_IP, "refused at the Service port"),
    ],
)
def test_service_type_decides_where_the_proxy_answers_and_who_reaches_it(
    kind: str, proxy_ip: str, from_compute: str
) -> None:
    t = topology(kind)
    assert t.proxy_ip == proxy_ip
    netmap = bound(t, 10084)
    if from_compute == "reached":
        assert netmap.lookup(COMPUTE, proxy_ip, 10084) == ("127.0.0.1", 40000)
    elif from_compute == "unreachable":
        with pytest.raises(Unreachable, match="no route to host 10.43.0.30"):
            netmap.lookup(COMPUTE, proxy_ip, 10084)
    else:
        with pytest.raises(Refused):
            netmap.lookup(COMPUTE, proxy_ip, 10084)
        assert netmap.lookup(COMPUTE, proxy_ip, NODE_PORTS[10084]) == ("127.0.0.1", 40000)
    # Inside the control plane the Service answers whatever its type (its ClusterIP at least).
    inside = t.proxy_addresses(10084)[-1]
    assert netmap.lookup(CONTROL_CLUSTER, *inside) == ("127.0.0.1", 40000)


def test_service_type_follows_the_values_as_applied() -> None:
    t = topology("LoadBalancer")
    changed = Topology(**{**t.__dict__, "values": values("ClusterIP")})
    assert (t.proxy_ip, changed.proxy_ip) == (PROXY_LB_IP, PROXY_CLUSTER_IP)
    # The DNS record was written for the old address and does not follow it (as a real record would not).
    assert [r.target for r in changed.cluster(COMPUTE).dns_records] == [PROXY_LB_IP]


# -- DNS rewrites -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rewrite", "name", "rcode", "address"),
    [
        (DnsRewrite(), f"invocation.{WD}", "NOERROR", PROXY_LB_IP),
        (DnsRewrite(), f"10-42-0-11.{WD}", "NOERROR", PROXY_LB_IP),
        (DnsRewrite(domain="grpc-workers.example.com"), f"invocation.{WD}", "NXDOMAIN", None),
        (
            DnsRewrite(domain="grpc-workers.example.com"),
            "invocation.grpc-workers.example.com",
            "NOERROR",
            PROXY_LB_IP,
        ),
        (DnsRewrite(target="10.100.0.99"), f"invocation.{WD}", "NOERROR", "10.100.0.99"),
        (DnsRewrite(target="none"), f"invocation.{WD}", "NXDOMAIN", None),
    ],
)
def test_compute_dns_rewrite(rewrite: DnsRewrite, name: str, rcode: str, address: str | None) -> None:
    view = topology(rewrite=rewrite).dns_views()[COMPUTE]
    got = answer(view, name, "A")
    assert got.rcode == rcode
    assert got.addresses == ((address,) if address else ())


def test_rewrite_to_proxy_follows_the_service_type() -> None:
    for kind, ip in (("ClusterIP", PROXY_CLUSTER_IP), ("NodePort", CONTROL_NODE_IP)):
        view = topology(kind).dns_views()[COMPUTE]
        assert answer(view, f"invocation.{WD}", "A").addresses == (ip,)


def test_control_plane_rewrite_publishes_the_names_beside_the_pod_records() -> None:
    plain = topology().dns_views()[CONTROL_CLUSTER]
    assert answer(plain, f"invocation.{WD}", "A").rcode == "NXDOMAIN"  # the default: no rewrite
    published = topology(control=DnsRewrite()).dns_views()[CONTROL_CLUSTER]
    assert answer(published, f"invocation.{WD}", "A").addresses == (PROXY_LB_IP,)
    pod = "10-42-0-11.invocation.nvcf.svc.cluster.local"
    assert answer(published, pod, "A").addresses == ("10.42.0.11",)


# -- Secrets and the third CA -------------------------------------------------------------------------
def test_private_is_a_third_issuer_and_a_declared_secret_defaults_to_the_wildcard() -> None:
    assert PRIVATE in ISSUERS
    assert secret_profile("corp-tls", WD, PRIVATE) == Profile("corp-tls", (f"*.{WD}",), PRIVATE)
    assert secret_profile("x", WD, names=("a.example.com",)).identities == ("a.example.com",)
    with pytest.raises(ValueError, match="issuer"):
        Profile("x", ("a",), "corporate")


def test_topology_keeps_secrets_through_its_state_file() -> None:
    secrets = (
        SecretSpec("corp-tls", PRIVATE, ("*.a.example.com",), expired=True),
        SecretSpec("brought", source="/tmp/x"),
    )
    t = build("t", values(), secrets=secrets)
    assert Topology.from_json(t.to_json()) == t


def test_secret_argument_parses_and_joins_the_scenario(tmp_path: Path) -> None:
    folder = tmp_path / "certs"
    folder.mkdir()
    assert parse_secret_arg(f"corp-tls={folder}") == ("corp-tls", folder.resolve())
    scenario = Scenario(
        "s", "s", tmp_path / "s.yaml", 1, values(), {"secrets": {"corp-tls": {"issuer": "stack"}}}, ()
    )
    joined = with_brought_secrets(scenario, [f"corp-tls={folder}"])
    assert joined.topology["secrets"] == {"corp-tls": {"source": str(folder.resolve())}}
    assert joined.build_topology("t").secrets == (SecretSpec("corp-tls", source=str(folder.resolve())),)


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("corp-tls", "use NAME=DIR"),
        ("Corp=/tmp", "a lowercase RFC 1123 subdomain must consist of lower case"),  # kubectl's words
        ("corp-tls=/no/such/folder", "no such folder"),
    ],
)
def test_secret_argument_mistakes_are_one_line(arg: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_secret_arg(arg)


# -- workerCallbackCaPem, applied once -----------------------------------------------------------------
def test_ca_marker_becomes_pem_text_when_the_values_are_applied() -> None:
    pems = {"stack": "STACK-1", "private": "CORP", "public": "PUBLIC"}
    for marker, issuer in (("@stack-ca", "stack"), ("@private-ca", "private"), ("@public-ca", "public")):
        t = build("t", values(workerCallbackCaPem=marker))
        applied = t.with_ca_pem(pems.__getitem__)
        assert applied.values["global"]["nvcaOperator"]["agent"]["workerCallbackCaPem"] == pems[issuer]
        assert t.values["global"]["nvcaOperator"]["agent"]["workerCallbackCaPem"] == marker  # untouched
    # Applied text stays text: a rotated CA (a new answer from pem_of) does not reach it.
    applied = build("t", values(workerCallbackCaPem="@stack-ca")).with_ca_pem(pems.__getitem__)
    assert applied.with_ca_pem(lambda _: "STACK-2") == applied


def test_literal_pem_passes_and_an_unknown_marker_is_one_line() -> None:
    literal = build("t", values(workerCallbackCaPem="-----BEGIN CERTIFICATE-----\n..."))
    assert literal.with_ca_pem(lambda _: "never") == literal
    with pytest.raises(ConfigError, match="unknown marker '@corp-ca'"):
        build("t", values(workerCallbackCaPem="@corp-ca")).with_ca_pem(lambda _: "")


# -- pod certificates for the wrong name or from another CA (fault pod-cert) -------------------------
def test_pod_cert_fault_serves_the_wrong_certificate_and_keeps_the_trusted_ca(tmp_path: Path) -> None:
    from cryptography import x509

    from certs.profiles import INVOCATION_SECRET, invocation_profile
    from certs.store import CertStore
    from certs.volume import load_secret
    from scenarios.fault_args import PodCert
    from scenarios.faults import misissue_pod_certificate

    store = CertStore(tmp_path)
    store.ensure_cas()
    store.issue(invocation_profile())
    _, _, trusted = load_secret(store.secret_dir(INVOCATION_SECRET))
    # (A mistyped pod-cert fault is refused before it gets here: tests/test_fault_args.py.)
    note = misissue_pod_certificate(store, PodCert("invocation", ("*.wrong.example",), "stack"))
    assert "*.wrong.example" in note
    crt, _, ca = load_secret(store.secret_dir(INVOCATION_SECRET))
    assert ca == trusted  # what the proxy verifies against does not move
    san = x509.load_pem_x509_certificate(crt).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.DNSName) == ["*.wrong.example"]
    misissue_pod_certificate(store, PodCert("invocation", invocation_profile().identities, PRIVATE))
    crt, _, _ = load_secret(store.secret_dir(INVOCATION_SECRET))
    issuer = x509.load_pem_x509_certificate(crt).issuer
    assert issuer == x509.load_pem_x509_certificate(store.ca_path(PRIVATE).read_bytes()).subject


@pytest.mark.parametrize(
    ("rewrite", "message"),
    [
        (DnsRewrite(domain="bad..domain"), "workerDomain must be a DNS name"),
        (DnsRewrite(target="10.100.0.999"), "must be an IPv4 address"),
    ],
)
def test_a_bad_rewrite_is_one_line_when_the_topology_is_built(rewrite: DnsRewrite, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        topology(rewrite=rewrite)


@pytest.mark.parametrize(
    ("kind", "rewrite", "control", "refused"),
    [
        ("LoadBalancer", DEFAULT_REWRITE, None, None),
        ("LoadBalancer", DnsRewrite(domain="grpc-workers.example.com"), None, None),  # rendered as asked
        ("LoadBalancer", DnsRewrite(target="10.100.0.99"), None, "DNS of ncpsim-compute-1"),
        ("LoadBalancer", DnsRewrite(target="worker-callback-proxy.nvcf.svc.cluster.local"), None, None),
        ("LoadBalancer", DEFAULT_REWRITE, DnsRewrite(), None),  # a single cluster publishing the names
        ("LoadBalancer", DEFAULT_REWRITE, DnsRewrite(target="10.1.2.3"), "DNS of ncpsim-cp"),
        ("ClusterIP", DEFAULT_REWRITE, None, "set it to LoadBalancer"),
    ],
)
def test_k3d_refuses_in_one_line_what_it_cannot_render(
    kind: str, rewrite: DnsRewrite, control: DnsRewrite | None, refused: str | None
) -> None:
    from clusters.k3d.backend import check_reachable
    from sim.errors import BackendError

    t = topology(kind, rewrite, control)
    if refused is None:
        check_reachable(t)
    else:
        with pytest.raises(BackendError, match=refused):
            check_reachable(t)


@pytest.mark.parametrize(
    ("topology_yaml", "where", "message"),
    [
        (
            "  secrets:\n    corp-tls: {issuer: corporate}\n",
            ":9: topology.secrets.corp-tls.issuer",
            "'corporate' is not one of",
        ),
        (
            "  computeClusters:\n    - dnsRewrite: {target: proxyy}\n",
            ":9: topology.computeClusters[0].dnsRewrite.target",
            "does not have the expected form",
        ),
        (
            "  controlPlane:\n    dnsRewrite: {domian: a.example.com}\n",
            ":9: topology.controlPlane.dnsRewrite.domian",
            "unknown key",
        ),
    ],
)
def test_topology_mistakes_name_the_file_line_and_key(
    tmp_path: Path, topology_yaml: str, where: str, message: str
) -> None:
    from scenarios.load import load_scenario
    from sim.errors import ScenarioError

    path = tmp_path / "ticket.yaml"
    path.write_text(
        "name: ticket\nsummary: s\nsteps:\n  - invoke: {function: http-echo}\nvalues:\n"
        "  workerCallbackProxy: {enabled: true}\ntopology:\n" + topology_yaml
    )
    with pytest.raises(ScenarioError) as caught:
        load_scenario(str(path))
    assert f"{path}{where}" in str(caught.value) and message in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("pem", "message"),
    [
        (
            "@corp-ca",
            "unknown marker '@corp-ca'; paste PEM text or use one of @stack-ca, @public-ca, @private-ca",
        ),
        (True, "must be PEM text (a block scalar, |), found a boolean"),
    ],
)
def test_a_bad_worker_ca_pem_is_refused_with_the_values(pem: object, message: str) -> None:
    from sim.model.values_check import validate

    issues = validate({"global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": pem}}}})
    assert [str(i) for i in issues] == [f"global.nvcaOperator.agent.workerCallbackCaPem: {message}"]
    for fine in ("", "@stack-ca", "@private-ca", "-----BEGIN CERTIFICATE-----\nnot checked\n"):
        assert validate({"global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": fine}}}}) == []


def test_service_addresses_do_not_collide() -> None:
    t = topology()
    control = t.cluster(CONTROL_CLUSTER)
    addresses = [
        PROXY_LB_IP,
        BUS_LB_IP,
        PROXY_CLUSTER_IP,
        INVOCATION_SERVICE_IP,
        control.dns_ip,
        CONTROL_NODE_IP,
    ]
    assert len(set(addresses)) == len(addresses)


def test_an_undeclared_existing_secret_left_by_an_earlier_run_is_replaced(tmp_path: Path) -> None:
    """The state folder outlives a run: what a scenario declared must not leak into the next one."""
    from certs import inspect
    from certs.store import CertStore
    from certs.volume import load_secret
    from clusters.certificates import prepare_certificates

    store = CertStore(tmp_path)
    wcp = {"tls": {"frontend": {"existingSecret": "customer-tls"}}}
    declared = build(
        "t",
        deep_merge(values(), {"workerCallbackProxy": wcp}),
        secrets=(SecretSpec("customer-tls", PRIVATE),),
    )
    prepare_certificates(store, declared)
    first = load_secret(store.secret_dir("customer-tls"))[0]
    assert inspect.issued_by(first, store.ca_path(PRIVATE).read_bytes())
    undeclared = replace(declared, secrets=())
    prepare_certificates(store, undeclared)
    second = load_secret(store.secret_dir("customer-tls"))[0]
    assert inspect.issued_by(second, store.ca_path("public").read_bytes())
    prepare_certificates(store, undeclared)  # a valid public-style one is kept, as the stack's own are
    assert load_secret(store.secret_dir("customer-tls"))[0] == second


def test_the_stacks_own_secrets_keep_their_issuer_and_a_broken_one_is_renewed(tmp_path: Path) -> None:
    from certs import inspect
    from certs.profiles import FRONTEND_SECRET, INVOCATION_SECRET, PUBLIC_FRONTEND_SECRET
    from certs.store import CertStore
    from certs.volume import load_secret
    from clusters.certificates import prepare_certificates
    from scenarios.fault_args import PodCert
    from scenarios.faults import misissue_pod_certificate

    store = CertStore(tmp_path)
    t = build("t", values())
    prepare_certificates(store, t)
    crt = {name: load_secret(store.secret_dir(name))[0] for name in (FRONTEND_SECRET, PUBLIC_FRONTEND_SECRET)}
    assert inspect.issued_by(crt[FRONTEND_SECRET], store.ca_path("stack").read_bytes())
    assert inspect.issued_by(crt[PUBLIC_FRONTEND_SECRET], store.ca_path("public").read_bytes())
    misissue_pod_certificate(store, PodCert("invocation", ("*.wrong.example",), "stack"))
    prepare_certificates(store, t)  # the next `up` on the same state folder
    assert inspect.sans(load_secret(store.secret_dir(INVOCATION_SECRET))[0]) == [
        "*.invocation.nvcf.svc.cluster.local"
    ]
    assert load_secret(store.secret_dir(FRONTEND_SECRET))[0] == crt[FRONTEND_SECRET]  # valid: kept


def test_worker_pods_read_the_applied_pem_never_the_ca_file(tmp_path: Path) -> None:
    """NVCF_PROXY_CA_PEM is the text the values were applied with: a rotated CA file does not reach it, and
    a marker that was never applied is a bug of the backend, refused when the worker host starts."""
    from types import SimpleNamespace

    from sim.worker.runtime import proxy_ca_pem

    applied = build("t", values(workerCallbackCaPem="@stack-ca")).with_ca_pem(lambda _: "PEM AS PASTED")
    assert proxy_ca_pem(SimpleNamespace(values=applied.values)) == "PEM AS PASTED"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reached a worker host unresolved"):
        proxy_ca_pem(SimpleNamespace(values=values(workerCallbackCaPem="@stack-ca")))  # type: ignore[arg-type]


def test_k3d_renders_the_control_planes_record_for_the_proxy() -> None:
    """single-cluster-names-published on k3d: the control plane's CoreDNS answers *.<workerDomain> with
    the proxy's load-balancer address, from the very records the local resolver answers with."""
    from clusters.render.bundle import Addresses, manifests_by_cluster
    from clusters.render.control_plane import CertMaterial
    from dns.coredns import view_of
    from scenarios.load import load_scenario

    pem = (b"-", b"-", b"-")
    material = CertMaterial(
        secrets=dict.fromkeys(
            (
                "worker-callback-proxy-frontend-tls",
                "invocation-service-worker-tls",
                "grpc-proxy-worker-tls",
                "worker-public-tls",
            ),
            pem,
        ),
        stack_ca=b"-",
        public_ca=b"-",
    )
    for name, published in (("single-cluster-names-published", True), ("single-cluster-direct", False)):
        t = load_scenario(name).build_topology("default")
        objects = manifests_by_cluster(t, material, Addresses(proxy="172.30.0.3", bus="172.30.0.4"))
        maps = [
            o
            for o in objects[CONTROL_CLUSTER]
            if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "coredns-custom"
        ]
        assert bool(maps) == published, name
        if published:
            # The proxy Service is the control plane's own: rendered as a rewrite to its name, which the
            # cluster answers with the Service's address (the local view's host record for it).
            own = tuple((fqdn, ip) for fqdn, ip in t.dns_views()[CONTROL_CLUSTER].hosts)
            rendered = view_of(maps[0], CONTROL_CLUSTER, own)
            name = f"10-42-0-41.{WD}"
            assert answer(rendered, name, "A") == Answer("NOERROR", (PROXY_CLUSTER_IP,), "rewrite")
            assert answer(t.dns_views()[CONTROL_CLUSTER], name, "A").addresses == (PROXY_CLUSTER_IP,)
