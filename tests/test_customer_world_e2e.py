"""Every value takes effect, end to end on the local backend, each with its negative control.

The catalogue test replays the new scenarios as they are; here each runs without the thing it depends
on (the fix, or the fault) and must then fail for the stated reason, so the passing run cannot be luck.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from cli_support import ncpsim

from clusters.local import LocalBackend
from clusters.local.launcher import Launcher
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.lookup import CATALOGUE
from scenarios.replay import replay_all, replay_stack
from scenarios.result import ScenarioResult
from scenarios.secrets import with_brought_secrets

WD = "grpc-worker.example.com"
Data = dict[str, Any]


def catalogue(name: str) -> Data:
    return yaml.safe_load((CATALOGUE / f"{name}.yaml").read_text())


def replay(tmp_path: Path, data: Data, secrets: list[str] | None = None) -> ScenarioResult:
    """One scenario on a fresh stack under tmp_path; the stack is stopped whatever happens."""
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    backend = LocalBackend(tmp_path / "state")
    stack = backend.attach("world")
    try:
        scenario = with_brought_secrets(load_scenario(str(path)), secrets or [])
        return run_scenario(scenario, backend, stack.name, keep=False)
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


def without(name: str, change: Callable[[Data], None]) -> Data:
    data = copy.deepcopy(catalogue(name))
    data["name"] = f"{name}-control"
    change(data)
    return data


def failures_of(result: ScenarioResult, step: int) -> str:
    return "\n".join(f for f in result.failures if f.startswith(f"step {step} "))


def assert_fails_at(result: ScenarioResult, step: int, reason: str) -> None:
    assert not result.ok, "the negative control passed: the scenario does not depend on what it removed"
    assert reason in failures_of(result, step), result.failures


def drop_set_values(step: int) -> Callable[[Data], None]:
    def change(data: Data) -> None:
        del data["steps"][step - 1]["setValues"]

    return change


# -- negative controls of the catalogue scenarios ---------------------------------------------------
CONTROLS = [
    # (scenario, what is taken away, the step that must then fail, the reason it fails)
    ("private-ca-frontend", drop_set_values(2), 3, "x509: certificate signed by unknown authority"),
    ("stale-ca-pem-after-rotation", drop_set_values(6), 7, "x509: certificate signed by unknown authority"),
    (
        "clusterip-service",
        lambda d: d["values"]["workerCallbackProxy"]["service"].update(type="LoadBalancer"),
        1,
        "outcome failure, but it succeeded",
    ),
    (
        "dns-rewrite-wrong-domain",
        lambda d: d["topology"]["computeClusters"][0].pop("dnsRewrite"),
        1,
        "outcome failure, but it succeeded",
    ),
    (
        "dns-rewrite-wrong-address",
        lambda d: d["topology"]["computeClusters"][0].pop("dnsRewrite"),
        1,
        "outcome failure, but it succeeded",
    ),
    (
        "single-cluster-names-published",
        lambda d: d["topology"].pop("controlPlane"),
        1,
        "lookup invocation.grpc-worker.example.com on",
    ),
    ("wrong-name-pod-cert", lambda d: d["steps"].pop(0), 1, "outcome failure, but it succeeded"),
    # No filter on the way: the gRPC callbacks the scenario shows failing go through.
    ("tcp-only-load-balancer", lambda d: d["steps"].pop(0), 2, "outcome failure, but it succeeded"),
    # The same dead link on TCP instead: the HTTP callbacks the scenario shows passing fail.
    (
        "tcp-only-load-balancer",
        lambda d: d["steps"][0]["fault"]["link"].update(protocol="tcp"),
        2,
        "outcome success, but it failed",
    ),
    # DNS as customers write it: the make target's rewrite resolves only through the name the customer
    # exposed; an exact record for invocation.<workerDomain> is why gRPC fails (the wildcard would not).
    (
        "dns-rewrite-to-exposed-service",
        lambda d: d["topology"]["computeClusters"][0].pop("dnsRecords"),
        1,
        "no such host",  # Go's words for NXDOMAIN
    ),
    (
        "dns-rewrite-to-missing-service",
        lambda d: d["topology"]["computeClusters"][0].update(
            dnsRecords=[
                {"kind": "exact", "name": "worker-callback-proxy.nvcf.svc.cluster.local", "target": "proxy"}
            ]
        ),
        1,
        "outcome failure, but it succeeded",
    ),
    (
        "dns-exact-invocation-record",
        lambda d: d["topology"]["computeClusters"][0]["dnsRecords"][0].update(kind="suffix", name=f".{WD}"),
        2,
        "outcome failure, but it succeeded",
    ),
    # issue 26: the brought certificate's names, the pod certificate's own name, the shared dial's NXDOMAIN
    (
        "frontend-cert-wrong-names",
        lambda d: d["topology"]["secrets"]["acme-wildcard-tls"].pop("names"),  # *.<workerDomain> instead
        1,
        "outcome failure, but it succeeded",
    ),
    ("grpc-pod-cert-own-name", lambda d: d["steps"].pop(0), 1, "outcome failure, but it succeeded"),
    (
        "grpc-dns-missing",
        lambda d: d["topology"]["computeClusters"][0].pop("wildcardDns"),
        1,
        "outcome failure, but it succeeded",
    ),
]


@pytest.fixture(scope="module")
def controls(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[ScenarioResult, Path]]:
    """Every control replayed once for the module, two at a time as `ncpsim replay --jobs 2` runs them (a
    replay mostly waits on its stack's processes), each on a fresh stack stopped afterwards: (result, its
    state folder), in CONTROLS order."""
    root = tmp_path_factory.mktemp("controls")
    scenarios = []
    for n, (name, change, _, _) in enumerate(CONTROLS):
        data = without(name, change)
        data["name"] += f"-{n}"  # a stack of its own each, the same scenario's two controls included
        path = root / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        scenarios.append(load_scenario(str(path)))
    try:
        results, _ = replay_all(scenarios, root=root / "state", out=io.StringIO(), jobs=2)
    finally:
        for folder in (root / "state").iterdir():  # replay stops each stack: make sure of it
            Launcher(folder).stop_all()
    folders = [root / "state" / replay_stack(s.name, several=True)[0] for s in scenarios]
    return list(zip(results, folders, strict=True))


@pytest.mark.parametrize(
    ("index", "step", "reason"),
    [(n, step, reason) for n, (_, _, step, reason) in enumerate(CONTROLS)],
    ids=[c[0] for c in CONTROLS],
)
def test_negative_control(
    controls: list[tuple[ScenarioResult, Path]], index: int, step: int, reason: str
) -> None:
    result, folder = controls[index]
    assert_fails_at(result, step, reason)
    assert not Launcher(folder).running(), "components still running after the replay"


# -- effects the catalogue shows only in part -------------------------------------------------------
def base(name: str, steps: list[Data], **proxy: Any) -> Data:
    wcp = {"enabled": True, "workerDomain": WD, "service": {"type": "LoadBalancer"}, **proxy}
    return {
        "name": name,
        "summary": name,
        "seed": 5,
        # one NATS server, as the catalogue's scenarios not about the NATS cluster: three wait for a leader
        "values": {"workerCallbackProxy": wcp, "nats": {"config": {"cluster": {"enabled": False}}}},
        "topology": {
            "invocationReplicas": 1,
            "grpcProxyReplicas": 0,
            "computeClusters": [{"workers": [{"count": 1, "trust": "system"}]}],
        },
        "steps": steps,
    }


HTTP_OK = {"invoke": {"function": "http-echo", "count": 2}, "expect": {"outcome": "success", "via": "proxy"}}
REDEPLOY_WORKERS = {"redeploy": "workers"}  # returns once the new worker pods are ready (subscribed)


def http_fails(error: str) -> Data:
    return {"invoke": {"function": "http-echo", "count": 1}, "expect": {"outcome": "failure", "error": error}}


def test_node_port_answers_on_the_node_address_at_its_node_port(tmp_path: Path) -> None:
    """Workers resolve to the node; the Service port 10084 is closed there, the node port 30084 is not."""
    trust = {"nvcaOperator": {"agent": {"workerCallbackCaPem": "@stack-ca"}}}
    closed = base(
        "node-port",
        [http_fails("dial tcp 172.18.0.2:10084: connect: connection refused")],
        service={"type": "NodePort"},
    )
    closed["values"]["global"] = trust
    result = replay(tmp_path, closed)
    assert result.ok, result.failures
    opened = base("node-port-url", [HTTP_OK], service={"type": "NodePort"})
    opened["values"]["global"] = {
        **trust,
        "workerEndpoints": {"invocationProxyURL": f"https://invocation.{WD}:30084"},
    }
    result = replay(tmp_path, opened)
    assert result.ok, result.failures


def test_undeclared_existing_secret_is_public_and_workers_trust_it(tmp_path: Path) -> None:
    data = base("undeclared-secret", [HTTP_OK], tls={"frontend": {"existingSecret": "customer-tls"}})
    result = replay(tmp_path, data)
    assert result.ok, result.failures
    assert result.status is not None
    assert {"stack", "public", "private"} <= set(result.status["ca"])  # each CA's PEM path, to paste from
    assert all(Path(path).is_file() for path in result.status["ca"].values())
    control = base("declared-private", [HTTP_OK], tls={"frontend": {"existingSecret": "customer-tls"}})
    control["topology"]["secrets"] = {"customer-tls": {"issuer": "private"}}
    assert_fails_at(replay(tmp_path, control), 1, "x509: certificate signed by unknown authority")


def test_declared_expired_secret(tmp_path: Path) -> None:
    data = base(
        "expired-secret",
        [http_fails("certificate has expired")],
        tls={"frontend": {"existingSecret": "customer-tls"}},
    )
    data["topology"]["secrets"] = {"customer-tls": {"issuer": "public", "expired": True}}
    result = replay(tmp_path, data)
    assert result.ok, result.failures


def brought_folder(tmp_path: Path) -> tuple[Path, str]:
    """A customer's certificate from a CA the simulation never made, as `kubectl create secret tls` takes it."""
    corporate = trustme.CA(organization_name="Customer Corp")
    leaf = corporate.issue_cert(f"*.{WD}")
    folder = tmp_path / "brought"
    folder.mkdir()
    (folder / "tls.crt").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    (folder / "tls.key").write_bytes(leaf.private_key_pem.bytes())
    return folder, corporate.cert_pem.bytes().decode()


def test_brought_secret_is_served_as_it_is_and_trusted_through_pasted_pem(tmp_path: Path) -> None:
    folder, corporate_pem = brought_folder(tmp_path)
    paste = {"global": {"nvcaOperator": {"agent": {"workerCallbackCaPem": corporate_pem}}}}
    data = base(
        "brought-secret",
        [
            http_fails("x509: certificate signed by unknown authority"),
            {"setValues": paste, **REDEPLOY_WORKERS},
            HTTP_OK,
        ],
        tls={"frontend": {"existingSecret": "customer-tls"}},
    )
    # Declared as public: the brought folder must win over the declaration, or step 1 would pass.
    data["topology"]["secrets"] = {"customer-tls": {"issuer": "public"}}
    result = replay(tmp_path, data, secrets=[f"customer-tls={folder}"])
    assert result.ok, result.failures
    served = tmp_path / "state" / "world" / "certs" / "secrets" / "customer-tls" / "tls.crt"
    assert served.read_bytes() == (folder / "tls.crt").read_bytes()


def test_invoke_up_serves_the_secret_the_user_brings(tmp_path: Path, invoke_env: dict[str, str]) -> None:
    """`ncpsim up --secret NAME=DIR` as a user types it: the brought certificate is what the proxy serves."""
    folder, _ = brought_folder(tmp_path)
    data = base(
        "brought-cli",
        [http_fails("x509: certificate signed by unknown authority")],
        tls={"frontend": {"existingSecret": "customer-tls"}},
    )
    path = tmp_path / "brought-cli.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    state = Path(invoke_env["NCPSIM_HOME"]) / "cli-secret"
    try:
        up = ncpsim(
            "up",
            f"scenario={path}",
            "--secret",
            f"customer-tls={folder}",
            "--stack",
            "cli-secret",
            env=invoke_env,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        served = state / "certs" / "secrets" / "customer-tls" / "tls.crt"
        assert served.read_bytes() == (folder / "tls.crt").read_bytes()
    finally:
        down = ncpsim("down", "--stack", "cli-secret", env=invoke_env)
    assert down.returncode == 0, down.stderr
    bad = ncpsim(
        "up", f"scenario={path}", "--secret", "customer-tls", "--stack", "cli-secret", env=invoke_env
    )
    assert bad.returncode == 2 and "use NAME=DIR" in bad.stderr and "Traceback" not in bad.stderr
