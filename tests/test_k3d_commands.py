"""The k3d backend's commands, run against fake `k3d`, `kubectl` and `docker` first on PATH: the exact
sequence of `up` and `down`, a second `up` that creates nothing, rollback after a failure midway, and
the preflight's messages. The fakes log their argv and keep state (tests/fakebin/fake.py)."""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import pytest

from clusters.k3d.runner import CommandRunner
from clusters.k3d.stack import K3dBackend, K3dStack
from scenarios.load import load_scenario
from sim.errors import BackendError

FAKEBIN = Path(__file__).resolve().parent / "fakebin"
_spec = importlib.util.spec_from_file_location("ncpsim_fake_tools", FAKEBIN / "fake.py")
assert _spec and _spec.loader
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)


class FakeEngine:
    """The docker SDK seam: answers a version and records builds (or is unreachable)."""

    def __init__(self, reachable: bool = True):
        self.reachable, self.builds = reachable, []

    def version(self) -> str:
        if not self.reachable:
            raise BackendError("Docker engine not reachable (connection refused); start Docker")
        return "27.1.1"

    def build(self, context: bytes, dockerfile: str, tag: str) -> str:
        self.builds.append((len(context), dockerfile, tag))
        return "sha256:feedface"


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NCPSIM_HOME", str(tmp_path / "home"))
    harness = fake.Harness(tmp_path)
    harness.attached = []

    def attach(stack: K3dStack, scenario: str) -> K3dStack:
        harness.attached.append(stack.topology)
        return stack

    monkeypatch.setattr(K3dStack, "attach", attach)
    return harness


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("http-callback")  # one compute cluster with two workers


def k3d_up(scenario, runner: CommandRunner, engine) -> K3dStack:
    return K3dBackend(runner, engine, sleep=lambda _s: None).up(
        scenario.build_topology("default"), scenario.name
    )


def k3d_down(runner: CommandRunner, purge: bool = False) -> list[str]:
    return K3dBackend(runner, FakeEngine()).attach("default").down(purge=purge)


def run_up(tools, scenario, engine=None) -> tuple[int, CommandRunner, list]:
    """Up without the attach to live pods (which needs real pods; its parts are in test_k3d_live.py)."""
    runner = CommandRunner(env=tools.env, echo=None)
    k3d_up(scenario, runner, engine or FakeEngine())
    return 0, runner, tools.attached


def expected_up(home: Path, first: bool) -> list[tuple[str, ...]]:
    rendered = home / "default" / "rendered"
    cp, c1 = ("kubectl", "--context", "k3d-ncpsim-cp"), ("kubectl", "--context", "k3d-ncpsim-compute-1")
    create = [("docker", "network", "create", "--label", "io.ncpsim.managed=true", "ncpsim")] if first else []
    clusters = (
        [
            ("k3d", "cluster", "create", "--config", str(rendered / "k3d" / f"{name}.yaml"))
            for name in ("ncpsim-cp", "ncpsim-compute-1")
        ]
        if first
        else []
    )
    coredns = (
        [
            (*c1, "-n", "kube-system", "rollout", "restart", "deployment", "coredns"),
            (*c1, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=180s"),
        ]
        if first
        else []
    )
    return [
        ("docker", "version", "--format", "{{.Client.Version}}"),
        ("k3d", "version"),
        ("kubectl", "version", "--client", "-o", "json"),
        ("docker", "network", "ls", "--format", "{{.Name}}"),
        *create,
        ("k3d", "cluster", "list", "-o", "json"),
        *clusters,
        ("k3d", "image", "import", "ncpsim/standin:dev", "--cluster", "ncpsim-cp"),
        ("k3d", "image", "import", "ncpsim/standin:dev", "--cluster", "ncpsim-compute-1"),
        (*cp, "apply", "-f", str(rendered / "manifests" / "ncpsim-cp.yaml")),
        *[
            (*cp, "-n", "nvcf", "rollout", "status", f"deployment/{name}", "--timeout=180s")
            for name in (
                "nats",
                "nats-auth-callout-service",
                "invocation-service",
                "grpc-proxy-deployment",
                "worker-callback-proxy",
            )
        ],
        (*cp, "-n", "nvcf", "get", "service", "nats", "-o", "json"),
        (*cp, "-n", "nvcf", "get", "service", "worker-callback-proxy", "-o", "json"),
        (*c1, "apply", "-f", str(rendered / "manifests" / "ncpsim-compute-1.yaml")),
        *coredns,
        *[
            (*c1, "-n", "nvcf", "rollout", "status", f"deployment/{name}", "--timeout=180s")
            for name in ("worker-1-0", "worker-1-1")
        ],
    ]


def test_up_runs_the_exact_sequence_and_the_fakes_saw_it(tools, scenario, tmp_path: Path) -> None:
    engine = FakeEngine()
    code, runner, replays = run_up(tools, scenario, engine)
    assert code == 0
    assert runner.commands == expected_up(tmp_path / "home", first=True)
    assert tools.calls() == runner.commands  # every command really ran, as the fakes on PATH recorded
    assert tools.state()["clusters"] == ["ncpsim-cp", "ncpsim-compute-1"]
    assert tools.state()["networks"] == ["ncpsim"]
    assert engine.builds == [(engine.builds[0][0], "docker/Dockerfile", "ncpsim/standin:dev")]
    assert len(replays) == 1
    # The compute cluster's NATS Service and its DNS record for the proxy hold the live load-balancer address.
    text = (tmp_path / "home" / "default" / "rendered" / "manifests" / "ncpsim-compute-1.yaml").read_text()
    assert f"ip: {fake.LB_IP}" in text and f"IN A {fake.LB_IP}" in text
    assert 'answer "{{ .Name }} 5 IN A 10.100.0.10"' not in text  # not the local backend's virtual one
    manifest = tmp_path / "home" / "default" / "rendered" / "manifests" / "ncpsim-cp.yaml"
    assert manifest.stat().st_mode & 0o777 == 0o600  # Secrets with private keys inside


def test_second_up_is_idempotent_and_down_removes_everything(tools, scenario, tmp_path: Path) -> None:
    run_up(tools, scenario)
    before = len(tools.calls())
    code, runner, _ = run_up(tools, scenario)
    assert code == 0
    assert runner.commands == expected_up(tmp_path / "home", first=False)
    assert not [c for c in runner.commands if "create" in c or "restart" in c]
    assert len(tools.calls()) == before + len(runner.commands)
    assert tools.state()["clusters"] == ["ncpsim-cp", "ncpsim-compute-1"]
    k3d_down(CommandRunner(env=tools.env, echo=None))
    assert tools.state()["clusters"] == [] and tools.state()["networks"] == []
    assert (
        tmp_path / "home" / "default" / "certs"
    ).exists()  # kept for the next `up`: workers' trust survives
    k3d_down(CommandRunner(env=tools.env, echo=None), purge=True)
    assert not (tmp_path / "home" / "default").exists()


def test_failure_midway_rolls_back_what_this_run_created(tools, scenario) -> None:
    tools.fail_on("--context k3d-ncpsim-compute-1 apply")
    runner = CommandRunner(env=tools.env, echo=None)
    with pytest.raises(
        BackendError, match=r"apply -f .*ncpsim-compute-1.yaml` failed \(exit 1\): Error: injected"
    ):
        k3d_up(scenario, runner, FakeEngine())
    failed_at = next(i for i, c in enumerate(runner.commands) if "apply" in c and "k3d-ncpsim-compute-1" in c)
    assert runner.commands[failed_at + 1 :] == [
        ("k3d", "cluster", "delete", "ncpsim-compute-1"),
        ("k3d", "cluster", "delete", "ncpsim-cp"),
        ("docker", "network", "rm", "ncpsim"),
    ]
    assert tools.state()["clusters"] == [] and tools.state()["networks"] == []


def test_rollback_leaves_what_existed_before(tools, scenario) -> None:
    tools.preset(networks=["ncpsim"], clusters=["ncpsim-cp"])
    tools.fail_on("ncpsim-compute-1.yaml")  # creating the compute cluster fails
    runner = CommandRunner(env=tools.env, echo=None)
    with pytest.raises(BackendError, match="k3d cluster create"):
        k3d_up(scenario, runner, FakeEngine())
    assert runner.commands[-1][:3] == ("k3d", "cluster", "create")  # nothing of ours to delete
    assert tools.state()["clusters"] == ["ncpsim-cp"] and tools.state()["networks"] == ["ncpsim"]


def test_failed_image_build_rolls_back_too(tools, scenario) -> None:
    class BrokenBuild(FakeEngine):
        def build(self, context: bytes, dockerfile: str, tag: str) -> str:
            raise BackendError("building ncpsim/standin:dev failed: pip install exited 1")

    runner = CommandRunner(env=tools.env, echo=None)
    with pytest.raises(BackendError, match="building"):
        k3d_up(scenario, runner, BrokenBuild())
    assert runner.commands[-3:] == [
        ("k3d", "cluster", "delete", "ncpsim-compute-1"),
        ("k3d", "cluster", "delete", "ncpsim-cp"),
        ("docker", "network", "rm", "ncpsim"),
    ]


def test_down_deletes_only_ncpsim_clusters_then_the_network(tools) -> None:
    tools.preset(networks=["ncpsim", "other-net"], clusters=["ncpsim-cp", "dev", "ncpsim-compute-1"])
    runner = CommandRunner(env=tools.env, echo=None)
    removed = k3d_down(runner)
    assert runner.commands == [
        ("docker", "version", "--format", "{{.Client.Version}}"),
        ("k3d", "version"),
        ("k3d", "cluster", "list", "-o", "json"),
        ("k3d", "cluster", "delete", "ncpsim-compute-1"),
        ("k3d", "cluster", "delete", "ncpsim-cp"),
        ("docker", "network", "ls", "--format", "{{.Name}}"),
        ("docker", "network", "rm", "ncpsim"),
    ]
    assert tools.state()["clusters"] == ["dev"] and tools.state()["networks"] == ["other-net"]
    assert removed == ["cluster ncpsim-compute-1", "cluster ncpsim-cp", "network ncpsim"]


def test_down_when_nothing_is_up(tools) -> None:
    runner = CommandRunner(env=tools.env, echo=None)
    assert k3d_down(runner) == []
    assert [c for c in runner.commands if "delete" in c or "rm" in c] == []


# -- preflight -----------------------------------------------------------------------------------
def test_preflight_names_each_missing_tool_with_its_install_step(
    tmp_path: Path, scenario, monkeypatch
) -> None:
    monkeypatch.setenv("NCPSIM_HOME", str(tmp_path / "home"))
    only_docker = fake.Harness(tmp_path, tools=("docker",), inherit_path=False)
    runner = CommandRunner(env=only_docker.env, echo=None)
    with pytest.raises(BackendError) as raised:
        k3d_up(scenario, runner, FakeEngine())
    message = str(raised.value)
    assert "k3d not found on PATH" in message and "install.sh" in message
    assert "kubectl not found on PATH" in message and "kubernetes.io/docs/tasks/tools" in message
    assert "docker" not in message.split("cannot start:")[1].split(";")[0]  # docker itself was fine
    assert only_docker.calls() == [("docker", "version", "--format", "{{.Client.Version}}")]


def test_preflight_reports_an_unreachable_engine(tools, scenario) -> None:
    runner = CommandRunner(env=tools.env, echo=None)
    with pytest.raises(BackendError, match="docker engine Docker engine not reachable .*start Docker"):
        k3d_up(scenario, runner, FakeEngine(reachable=False))
    assert not [c for c in tools.calls() if c[:2] in (("docker", "network"), ("k3d", "cluster"))]


def test_preflight_refuses_an_old_k3d(tmp_path: Path) -> None:
    from clusters.k3d.preflight import tool_check

    harness = fake.Harness(tmp_path)
    old = harness.bin / "k3d"
    old.write_text("#!/bin/sh\necho 'k3d version v5.4.9'\necho 'k3s version v1.25.7-k3s1 (default)'\n")
    check = tool_check(CommandRunner(env=harness.env, echo=None), "k3d")
    assert not check.ok and "older than v5.5" in check.detail and "install" in check.fix


def test_doctor_lists_both_backends(tools) -> None:
    from clusters.k3d.doctor import doctor

    lines: list[str] = []
    code = doctor(CommandRunner(env=tools.env, echo=None), FakeEngine(reachable=False), out=lines.append)
    text = "\n".join(lines)
    assert code == 0  # the local backend is ready on this machine
    assert "local backend: ready" in text and "k3d backend: not ready" in text
    assert "k3d: v5.7.4" in text and "kubectl: v1.30.2" in text and "docker: 27.1.1" in text
    assert "docker engine" in text and "fix: start Docker" in text
    assert "host port 10084/tcp" in text and "host port 443/udp" in text
    assert "clients and peers (tests, bench)" in text and "dnsmasq" in text and "chromium" in text
    k3d = doctor(CommandRunner(env=tools.env, echo=None), FakeEngine(reachable=False), lambda _: None, "k3d")
    assert k3d == 1  # the backend asked about is not ready


def test_a_missing_client_is_named_with_its_package() -> None:
    from clusters.k3d.doctor import client_checks

    checks = {c.name: c for c in client_checks(lambda tool: None if tool == "dig" else f"/usr/bin/{tool}")}
    assert not checks["dig"].ok and "apt-get install bind9-dnsutils" in checks["dig"].fix
    assert checks["curl"].ok and checks["curl"].detail == "/usr/bin/curl"


def test_proxy_service_type_must_be_a_load_balancer_for_compute_clusters(tools, scenario) -> None:
    from dataclasses import replace

    from sim.model.values import deep_merge

    values = deep_merge(scenario.values, {"workerCallbackProxy": {"service": {"type": "ClusterIP"}}})
    with pytest.raises(BackendError, match="service.type.*LoadBalancer"):
        k3d_up(replace(scenario, values=values), CommandRunner(env=tools.env, echo=None), FakeEngine())


# -- the runner and the engine seam ----------------------------------------------------------------
def test_runner_turns_failures_into_one_line_errors(tools) -> None:
    runner = CommandRunner(env=tools.env, echo=None)
    tools.fail_on("cluster list")
    with pytest.raises(BackendError) as raised:
        runner.run("k3d", "cluster", "list", "-o", "json")
    assert (
        str(raised.value)
        == "`k3d cluster list -o json` failed (exit 1): Error: injected failure (cluster list)"
    )
    assert not runner.run("k3d", "cluster", "list", check=False).ok
    with pytest.raises(BackendError, match="no-such-tool: not found on PATH"):
        runner.run("no-such-tool", "--version")
    assert runner.commands[-1] == ("no-such-tool", "--version")  # recorded even when it cannot start


def test_sdk_engine_reports_an_unreachable_engine_with_the_fix(monkeypatch, tmp_path: Path) -> None:
    from clusters.k3d.engine import SdkEngine

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    with pytest.raises(BackendError, match=r"Docker engine not reachable .*; start Docker"):
        SdkEngine().version()
    # The docker SDK (7.2.0, transport/unixconn.py UnixHTTPConnection.connect) leaves the socket of a
    # failed connect open, held by the traceback's frames until the garbage collector runs. Collected
    # here, its warning belongs to this test, not to whichever test happened to be running later.
    with pytest.warns(ResourceWarning, match=r"unclosed <socket\.socket .*family=1"):
        gc.collect()
