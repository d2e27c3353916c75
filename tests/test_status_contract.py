"""`ncpsim status --json` on every backend (DESIGN.md section 5; issue 11 item 3): the proxy block is null when
the proxy is off, never a block with null ports; `proxy.http.url` follows invocationProxyURL; `proxy.h3` names
one real pod name; pod targets are what the pods hand workers. Both backends share clusters.stack.build_status:
the k3d builder is checked from a table, the local one on a running stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusters.k3d.stack import status as k3d_status
from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.report import endpoints_text
from sim.model.topology import Topology
from sim.protocols.grpc_callback import connect_url

WD = "grpc-worker.example.com"


def topology(scenario: str, *sets: str) -> Topology:
    return load_scenario(scenario, sets=list(sets)).build_topology("contract")


def k3d(scenario: str, *sets: str) -> dict:
    return k3d_status(topology(scenario, *sets), Path("/state/contract"), scenario)


def test_proxy_off_has_no_proxy_block() -> None:
    status = k3d("single-cluster-direct")
    assert status["proxy"] is None
    targets = [p["target"] for p in status["pods"] if p["role"] == "invocation"]
    assert targets and all(t.endswith(".invocation.nvcf.svc.cluster.local:8080") for t in targets)
    assert "None" not in endpoints_text(status)


def test_proxy_on_has_both_fronts_with_ports() -> None:
    status = k3d("http-callback")
    assert status["proxy"]["http"]["port"] and status["proxy"]["h3"]["port"]
    assert status["proxy"]["http"]["url"] == f"https://invocation.{WD}:10084"
    assert status["proxy"]["http"]["name"] == f"invocation.{WD}"


def test_http_url_follows_invocation_proxy_url() -> None:
    url = f"https://callbacks.{WD}:10084"
    status = k3d("http-callback", f"global.workerEndpoints.invocationProxyURL={url}")
    assert status["proxy"]["http"]["url"] == url
    assert status["proxy"]["http"]["name"] == f"callbacks.{WD}"
    assert f"callbacks.{WD}" in endpoints_text(status)


def test_h3_gives_the_first_grpc_pods_name() -> None:
    topo = topology("grpc-callback")
    status = k3d_status(topo, Path("/state/contract"), "grpc-callback")
    first = topo.pods_of("grpc-proxy")[0]
    assert status["proxy"]["h3"]["example"] == f"{first.ip.replace('.', '-')}.{WD}"
    # ... the very name that pod hands its workers
    assert connect_url(first.ip, WD, True).startswith(f"https://{status['proxy']['h3']['example']}/")


def test_h3_example_is_null_without_grpc_pods() -> None:
    assert k3d("http-callback")["proxy"]["h3"]["example"] is None


@pytest.fixture(scope="module")
def direct_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = LocalStack("contract-direct", root=tmp_path_factory.mktemp("ncpsim-contract"))
    try:
        result = run_scenario(
            load_scenario("single-cluster-direct"), LocalBackend(stack.root), stack.name, keep=True
        )
        assert result.ok, result.failures
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


def test_local_backend_proxy_off(direct_stack: LocalStack) -> None:
    status = direct_stack.status()
    assert status is not None and status["proxy"] is None
    assert all(p["target"].endswith(":8080") for p in status["pods"] if p["role"] == "invocation")
    text = endpoints_text(status)
    assert "None" not in text and "proxy             off" in text
    assert json.loads(json.dumps(status)) == status
