"""The pieces of the live replay on k3d clusters, run against the fake kubectl: finding the pods the
cluster placed, port-forwards, copying `kubectl logs` into the files the engine tails, the client's
network map, redeploys and the status file. (The whole path needs real clusters; it has not been run
against them on the machine these tests were written on.)"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from pathlib import Path

import pytest

from clusters.k3d.backend import Backend
from clusters.k3d.live import LogSync, PortForward, live_topology, parse_pods, sort_log_lines, write_netmap
from clusters.k3d.runner import CommandRunner
from clusters.k3d.stack import ClusterLauncher, K3dStack, select, status
from clusters.render.bundle import Addresses, manifests_by_cluster
from clusters.render.control_plane import CertMaterial
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.report import render_text
from sim.errors import BackendError, ScenarioError
from sim.model.netmap import LiveNetMap, Unreachable
from sim.model.parts import Pod
from sim.proxy.access_log import AccessRecord, format_record

FAKEBIN = Path(__file__).resolve().parent / "fakebin"
_spec = importlib.util.spec_from_file_location("ncpsim_fake_tools", FAKEBIN / "fake.py")
assert _spec and _spec.loader
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)

SCENARIO = load_scenario("http-callback")
TOPOLOGY = SCENARIO.build_topology("default")


@pytest.fixture
def tools(tmp_path: Path):
    harness = fake.Harness(tmp_path)
    # What `up` left: two invocation pods, no grpc-proxy pods (the scenario's topology).
    harness.preset(objects={"k3d-ncpsim-cp": {"deployment.apps/invocation-service": {"replicas": 2}}})
    return harness


def test_pods_come_from_the_cluster_with_real_names_and_ips(tools) -> None:
    live = live_topology(CommandRunner(env=tools.env, echo=None), TOPOLOGY)
    assert [(p.name, p.role, p.ip) for p in live.pods] == [
        ("invocation-service-7d9f8-0", "invocation", "10.42.0.111"),
        ("invocation-service-7d9f8-1", "invocation", "10.42.0.112"),
    ]
    assert live.workers == TOPOLOGY.workers and live.values == TOPOLOGY.values


def test_missing_pods_are_reported(tools) -> None:
    tools.preset(objects={"k3d-ncpsim-cp": {"deployment.apps/invocation-service": {"replicas": 1}}})
    with pytest.raises(BackendError, match="1 of 2 control-plane pods"):
        live_topology(CommandRunner(env=tools.env, echo=None), TOPOLOGY)


def test_only_running_ready_pods_count() -> None:
    def item(name: str, phase: str, ready: str, app: str = "invocation-service") -> dict:
        return {
            "metadata": {"name": name, "labels": {"app": app}},
            "status": {
                "phase": phase,
                "podIP": "10.42.0.9",
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }

    raw = json.dumps(
        {
            "items": [
                item("a", "Running", "True"),
                item("b", "Pending", "False"),
                item("c", "Running", "False"),
                item("d", "Running", "True", app="nats"),
                item("e", "Running", "True", app="grpc-proxy-deployment"),
            ]
        }
    )
    assert [(p.name, p.role) for p in parse_pods(raw)] == [("e", "grpc-proxy"), ("a", "invocation")]


def test_port_forward_reports_its_local_port_and_stops_with_its_group(tools) -> None:
    runner = CommandRunner(env=tools.env, echo=None)
    pod = Pod("invocation-service-7d9f8-0", "invocation", "ncpsim-cp", "10.42.0.111")
    forward = PortForward.start(runner, pod, 8080)
    try:
        assert forward.local_port == 48080
        assert runner.commands == [
            (
                "kubectl",
                "--context",
                "k3d-ncpsim-cp",
                "-n",
                "nvcf",
                "port-forward",
                "pod/invocation-service-7d9f8-0",
                ":8080",
            )
        ]
    finally:
        forward.stop()
    assert forward.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(forward.process.pid, 0)  # nothing of the group is left


def test_client_netmap_reaches_forwarded_pods_only(tmp_path: Path) -> None:
    pod = Pod("invocation-service-7d9f8-0", "invocation", "ncpsim-cp", "10.42.0.111")

    class Forwarded:
        def __init__(self) -> None:
            self.pod, self.port, self.local_port = pod, 8080, 48080

    write_netmap(tmp_path, TOPOLOGY, [Forwarded()])  # type: ignore[list-item]
    netmap = LiveNetMap(tmp_path / "netmap.json")
    assert netmap.lookup("ncpsim-cp", "10.42.0.111", 8080) == ("127.0.0.1", 48080)
    with pytest.raises(Unreachable):
        netmap.lookup("ncpsim-compute-1", "10.42.0.111", 8080)


def access_line(request_id: str) -> str:
    record = AccessRecord(
        start=1_700_000_000.0,
        method="GET",
        path="/v2/nvcf/worker/request-attach",
        status=200,
        request_id=request_id,
        authority="10-42-0-111.invocation.nvcf.svc.cluster.local:8443",
        upstream_host="10.42.0.111:8443",
    )
    return format_record(record)


def test_logs_are_sorted_into_events_and_the_access_log(tmp_path: Path, tools) -> None:
    event = json.dumps(
        {"ts": 1.0, "component": "worker-1-0", "kind": "worker.callback.result", "requestId": "r1"}
    )
    logs = "\n".join(
        [
            f"[pod/worker-1-0-abc/workers] {event}",
            f"[pod/worker-callback-proxy-xyz/envoy] {access_line('r1')}",
            "[pod/worker-callback-proxy-xyz/envoy] [2026-01-01 00:00:00.000][1][info][main] starting workers",
            "[pod/invocation-service-1/invocation] Traceback (most recent call last):",
            '[pod/invocation-service-1/invocation] {"not": "an event"}',
            "garbage without a prefix",
        ]
    )
    events, access = sort_log_lines(logs)
    assert events == {"worker-1-0-abc": [event]} and access == [access_line("r1")]

    (tmp_path / "logs.txt").write_text(logs + "\n")
    tools.env["NCPSIM_FAKE_LOGS"] = str(tmp_path / "logs.txt")
    state = tmp_path / "state"
    LogSync(CommandRunner(env=tools.env, echo=None), state, ["ncpsim-cp"]).sync_once()
    assert (state / "events" / "worker-1-0-abc.jsonl").read_text() == event + "\n"
    assert (state / "logs" / "worker-callback-proxy.access.log").read_text() == access_line("r1") + "\n"
    assert tools.calls()[-1] == (
        "kubectl",
        "--context",
        "k3d-ncpsim-cp",
        "-n",
        "nvcf",
        "logs",
        "-l",
        "app.kubernetes.io/part-of=ncpsim",
        "--all-containers",
        "--prefix",
        "--tail=-1",
        "--max-log-requests=64",
    )


def test_log_sync_runs_in_the_background_and_once_more_at_the_end(tmp_path: Path, tools) -> None:
    (tmp_path / "logs.txt").write_text("")
    tools.env["NCPSIM_FAKE_LOGS"] = str(tmp_path / "logs.txt")
    with LogSync(CommandRunner(env=tools.env, echo=None), tmp_path / "state", ["ncpsim-cp"], interval=0.01):
        (tmp_path / "logs.txt").write_text(f"[pod/p/envoy] {access_line('late')}\n")
    assert "late" in (tmp_path / "state" / "logs" / "worker-callback-proxy.access.log").read_text()


# -- redeploys ------------------------------------------------------------------------------------
MATERIAL = CertMaterial(secrets={}, stack_ca=b"stack", public_ca=b"public")


def test_redeploy_groups_select_what_a_helm_upgrade_of_that_part_would() -> None:
    objects = manifests_by_cluster(TOPOLOGY, MATERIAL, Addresses.virtual(TOPOLOGY))
    cp, compute = objects["ncpsim-cp"], objects["ncpsim-compute-1"]

    def names(what: str, objs: list[dict], is_compute: bool) -> set[str]:
        return {f"{o['kind']}/{o['metadata']['name']}" for o in select(objs, what, is_compute)}

    assert names("proxy", cp, False) == {
        "ConfigMap/worker-callback-proxy-envoy",
        "Deployment/worker-callback-proxy",
        "Service/worker-callback-proxy",
    }
    assert names("proxy", compute, True) == set()
    assert names("pods", cp, False) == {
        "ConfigMap/ncpsim-topology",
        "Deployment/invocation-service",
        "Deployment/grpc-proxy-deployment",
    }
    assert names("workers", cp, False) == set()  # no control-plane workers in this scenario
    assert names("workers", compute, True) == {f"{o['kind']}/{o['metadata']['name']}" for o in compute}
    with pytest.raises(ScenarioError, match="redeploy 'everything'"):
        select(cp, "everything", False)


def test_redeploy_workers_applies_new_values_and_restarts_them(tools, tmp_path: Path) -> None:
    runner = CommandRunner(env=tools.env, echo=None)
    backend = Backend(runner, engine=None, state=tmp_path / "state")  # type: ignore[arg-type]
    launcher = ClusterLauncher(backend, TOPOLOGY, Addresses(proxy="172.30.0.3", bus="172.30.0.3"))
    launcher.redeploy(TOPOLOGY, "workers")
    c1 = ("kubectl", "--context", "k3d-ncpsim-compute-1")
    assert runner.commands == [
        (*c1, "apply", "-f", "-"),
        (*c1, "-n", "nvcf", "rollout", "restart", "deployment/worker-1-0"),
        (*c1, "-n", "nvcf", "rollout", "restart", "deployment/worker-1-1"),
        (*c1, "-n", "nvcf", "rollout", "status", "deployment/worker-1-0", "--timeout=180s"),
        (*c1, "-n", "nvcf", "rollout", "status", "deployment/worker-1-1", "--timeout=180s"),
    ]


def test_status_file_keeps_the_contract_keys(tmp_path: Path) -> None:
    current = status(TOPOLOGY, tmp_path, "http-callback")
    assert {"backend", "scenario", "workerDomain", "stateDir", "proxy", "dns", "ca", "pods", "logs"} <= set(
        current
    )
    assert current["backend"] == "k3d" and current["proxy"]["http"]["port"] == 10084
    assert {"host", "port", "name", "url"} <= set(current["proxy"]["h3"])
    assert {p["name"] for p in current["pods"]} == {p.name for p in TOPOLOGY.pods}


class AttachOnly:
    """The k3d backend after its clusters are up: `up` only attaches (live pods, forwards, log copying)."""

    name = "k3d"

    def __init__(self, steps: Backend):
        self.steps = steps

    def up(self, topology, scenario: str) -> K3dStack:
        return K3dStack(self.steps, topology).attach(scenario)

    def attach(self, stack: str) -> K3dStack:
        return K3dStack(self.steps, TOPOLOGY)

    def interruptible(self, stack: str):
        return contextlib.nullcontext()


def test_replay_plumbing_runs_end_to_end_against_fakes(tools, tmp_path: Path) -> None:
    """Nothing listens behind the fake port-forwards, so every call fails: the point is that the
    live path (pods, forwards, network map, log sync, the engine, the report) runs and says so."""
    (tmp_path / "logs.txt").write_text("")
    tools.env["NCPSIM_FAKE_LOGS"] = str(tmp_path / "logs.txt")
    tools.preset(
        objects={
            "k3d-ncpsim-cp": {
                "deployment.apps/invocation-service": {"replicas": 2},
                "service/nats": {},
                "service/worker-callback-proxy": {},
            }
        }
    )
    runner = CommandRunner(env=tools.env, echo=None)
    steps = Backend(runner, engine=None, state=tmp_path / "state")  # type: ignore[arg-type]
    result = run_scenario(SCENARIO, AttachOnly(steps), "default", keep=True)
    assert not result.ok
    assert render_text(result).startswith("FAIL http-callback")
    status_file = json.loads((tmp_path / "state" / "status.json").read_text())
    assert status_file["backend"] == "k3d"
    assert status_file["pods"][0]["target"].endswith(":8443")  # upstream TLS on: the shared builder
    assert (tmp_path / "state" / "reports" / "report.json").exists()
    forwards = [c for c in runner.commands if "port-forward" in c]
    assert [c[-2:] for c in forwards] == [
        ("pod/invocation-service-7d9f8-0", ":8080"),
        ("pod/invocation-service-7d9f8-1", ":8080"),
    ]


def test_status_pod_targets_follow_upstream_tls(tmp_path: Path) -> None:
    """The k3d status once hard-coded :8443; both backends now share one builder."""
    from dataclasses import replace

    from sim.model.values import deep_merge

    plain = replace(
        TOPOLOGY,
        values=deep_merge(
            TOPOLOGY.values, {"workerCallbackProxy": {"invocation": {"upstreamTls": {"enabled": False}}}}
        ),
    )
    targets = {
        p["target"].rsplit(":", 1)[1]
        for p in status(plain, tmp_path, "x")["pods"]
        if p["role"] == "invocation"
    }
    assert targets == {"8080"}
