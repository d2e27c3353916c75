"""Pure parts of the scenario engine, from tables: expectations, probes, the Service address, diagrams."""

from __future__ import annotations

from pathlib import Path

import pytest

from scenarios.expect import Facts, evaluate
from scenarios.load import scenario_from_data
from scenarios.probe import fill, parse_head, request_bytes
from scenarios.sequence import Diagram, Message, Note, call_rows, mermaid, pod_lane
from scenarios.sequence_html import html_page
from scenarios.spec import Expect, Step, When, expect_from, probe_from
from scenarios.trace import CallTrace
from sim.model.netmap import NetMap
from sim.model.parts import INVOCATION_SERVICE_FQDN, INVOCATION_SERVICE_IP, WorkerSpec
from sim.model.topology import build
from sim.model.values import DEFAULTS

IPS = {"invocation-service-0": "10.42.0.11", "invocation-service-1": "10.42.0.12"}
WORKERS = {
    "w-stack": WorkerSpec("w-stack", "ncpsim-compute-1", "1.3.1", "stack"),
    "w-system": WorkerSpec("w-system", "ncpsim-compute-2", "1.3.1", "system"),
}


def _rec(method: str, status: int, flags: str = "-", upstream: str = "10.42.0.11:8443") -> dict[str, str]:
    return {
        "method": method,
        "status": str(status),
        "flags": flags,
        "upstream_host": upstream,
        "authority": "10-42-0-11.invocation.nvcf.svc.cluster.local:8443",
        "path": "/v2/nvcf/worker/request-attach",
    }


def ok_call(index: int = 1, worker: str = "w-stack") -> CallTrace:
    return CallTrace(
        step=1,
        index=index,
        function="http-echo",
        pod="invocation-service-0",
        request_id=f"r{index}",
        client_status=200,
        outcome="success",
        worker=worker,
        worker_statuses=[200, 200],
        dns={"name": "invocation.grpc-worker.example.com", "answer": "10.100.0.10"},
        via="proxy",
        proxy=[_rec("GET", 200), _rec("POST", 200)],
        pod_legs=[
            {"kind": "attach.get", "pod": "invocation-service-0", "status": 200},
            {"kind": "attach.post", "pod": "invocation-service-0", "status": 200},
        ],
    )


def wrong_pod_call(index: int = 2) -> CallTrace:
    return CallTrace(
        step=1,
        index=index,
        function="http-echo",
        pod="invocation-service-0",
        request_id=f"r{index}",
        client_status=202,
        outcome="failure",
        worker="w-system",
        worker_statuses=[401],
        via="direct",
        error="GET answered 401: The provided authorization token is invalid or has expired",
        pod_legs=[{"kind": "attach.get", "pod": "invocation-service-1", "status": 401}],
    )


def step_with(*expects: Expect) -> Step:
    return Step(index=3, name="callbacks", invoke={"function": "http-echo"}, expects=expects)


@pytest.mark.parametrize(
    ("expect", "traces", "wanted"),
    [
        (Expect(via="proxy", same_pod=True, proxy_status=200, proxy_flag="-"), [ok_call()], []),
        (
            Expect(proxy_status=404, proxy_flag="NR"),
            [ok_call()],
            [("expected proxy answering 404 NR, but the access log shows 200 -, 200 -")],
        ),
        (Expect(upstream_port=8080), [ok_call()], ["pod port 8080, but it forwarded to"]),
        (Expect(dns_rcode="NXDOMAIN"), [ok_call()], ["DNS answering NXDOMAIN", "it answered NOERROR"]),
        (Expect(outcome="failure"), [ok_call()], ["outcome failure, but it succeeded"]),
        (
            Expect(pod_contacted=False, outcome=None),
            [ok_call()],
            ["no pod contacted, but invocation-service-0"],
        ),
        (
            Expect(
                when=When(landed="other"),
                outcome="failure",
                callee_status=401,
                error="invalid or has expired",
            ),
            [ok_call(1), wrong_pod_call(2)],
            [],
        ),
        (
            Expect(when=When(landed="other"), outcome="success"),
            [ok_call(1), wrong_pod_call(2)],
            ["for calls with landed=other: expected outcome success, but it failed"],
        ),
        (Expect(when=When(trust="stack"), outcome="success"), [ok_call(1, "w-stack")], []),
        (
            Expect(when=When(cluster="ncpsim-compute-2")),
            [ok_call(1, "w-stack")],
            ["expected at least 1 call(s) with cluster=ncpsim-compute-2, but 0 of 1 were"],
        ),
        (
            Expect(when=When(landed="holder"), at_least=2),
            [ok_call(1), wrong_pod_call(2)],
            ["at least 2 call(s)"],
        ),
    ],
)
def test_expectations_name_step_expectation_and_what_happened(
    expect: Expect, traces: list[CallTrace], wanted: list[str]
) -> None:
    failures = evaluate(step_with(expect), traces, Facts(IPS, WORKERS))
    assert bool(failures) == bool(wanted), failures
    for line, want in zip(failures, wanted, strict=False):
        assert line.startswith("step 3 (callbacks): ") and want in line, line


def test_identical_failures_group_into_one_line() -> None:
    failures = evaluate(step_with(Expect(outcome="success")), [wrong_pod_call(i) for i in (1, 2, 3)], IPS)
    assert failures == [
        (
            "step 3 (callbacks): expected outcome success, but it failed: GET answered 401: The provided "
            "authorization token is invalid or has expired (invocations 1, 2, 3 of 3)"
        )
    ]


def test_expect_and_probe_from_yaml_shapes() -> None:
    assert expect_from({"when": {"workerUtils": "1.3.1"}, "atLeast": 2}).when == When(worker_utils="1.3.1")
    assert expect_from({"podContacted": False}).outcome is None  # probes: no call outcome implied
    probe = probe_from(
        {"targets": ["CONNECT {pod}:8443", "http://x/", {"method": "POST", "target": "http://y/"}]}
    )
    assert [(t.method, t.target) for t in probe.targets] == [
        ("CONNECT", "{pod}:8443"),
        ("GET", "http://x/"),
        ("POST", "http://y/"),
    ]


def test_probe_request_is_byte_exact_and_fills_placeholders() -> None:
    topology = build("t", DEFAULTS, invocation_replicas=2, grpc_replicas=0)
    target = fill("http://{pod}:8443/v2/../x?{workerDomain}&{podIp}&{unknown}", topology)
    assert target == (
        "http://10-42-0-11.invocation.nvcf.svc.cluster.local:8443/v2/../x?grpc-worker.example.com"
        "&10.42.0.11&{unknown}"
    )
    raw = request_bytes("GET", target, "rid-1")
    assert raw.startswith(
        f"GET {target} HTTP/1.1\r\nHost: 10-42-0-11.invocation.nvcf.svc.cluster.local:8443\r\n".encode()
    )
    assert b"X-Request-Id: rid-1\r\n" in raw and raw.endswith(b"\r\n\r\n")
    assert request_bytes("CONNECT", "a:8443", "r").startswith(b"CONNECT a:8443 HTTP/1.1\r\nHost: a:8443\r\n")
    assert parse_head(b"HTTP/1.1 404 Not Found\r\nserver: envoy\r\ncontent-length: 12\r\n\r\n") == (404, 12)
    assert parse_head(b"garbage\r\n\r\n") == (0, 0)


def test_service_address_spreads_connections_over_endpoints_repeatably() -> None:
    topology = build("t", {**DEFAULTS}, invocation_replicas=2, grpc_replicas=0, seed=43)
    services = topology.service_endpoints()
    assert services[f"{INVOCATION_SERVICE_IP}:8080/tcp"] == ["10.42.0.11:8080/tcp", "10.42.0.12:8080/tcp"]
    cp_view = topology.dns_views()["ncpsim-cp"]
    assert (INVOCATION_SERVICE_FQDN, INVOCATION_SERVICE_IP) in cp_view.hosts

    def picks() -> list[int]:
        netmap = NetMap(
            bindings={"10.42.0.11:8080/tcp": 1001, "10.42.0.12:8080/tcp": 1002},
            reach={"ncpsim-cp": ["10.42.0.0/16", "10.43.0.0/16"]},
            services=services,
            seed=43,
        )
        return [netmap.lookup("ncpsim-cp", INVOCATION_SERVICE_IP, 8080)[1] for _ in range(20)]

    first = picks()
    assert first == picks() and set(first) == {1001, 1002}  # seeded: the same spread every replay


def test_sequence_rows_and_mermaid_for_proxied_and_wrong_pod_calls() -> None:
    rows = call_rows(ok_call(), IPS_BY_IP)
    assert rows[0] == Message("client", "pod_invocation_service_0", "POST /v2/nvcf/pexec/functions/http-echo")
    assert Message("worker", "dns", "A invocation.grpc-worker.example.com") in rows
    assert (
        Message("proxy", "pod_invocation_service_0", "GET /v2/nvcf/worker/request-attach to 10.42.0.11:8443")
        in rows
    )
    wrong = call_rows(wrong_pod_call(), IPS_BY_IP)
    assert Message("pod_invocation_service_1", "worker", "401", "fail") in wrong
    d = Diagram("t: x; y #1", False, (), (Note("step 1"), *rows))
    text = mermaid(Diagram(d.title, d.ok, (*_lanes(),), d.rows))
    assert text.startswith("sequenceDiagram\n    title t: x, y no. 1\n")
    assert "    client->>pod_invocation_service_0: POST /v2/nvcf/pexec/functions/http-echo" in text
    assert "    dns-->>worker: 10.100.0.10" in text


def test_html_page_is_self_contained_with_a_lane_per_party() -> None:
    d = Diagram("demo <b>", True, _lanes(), (Note("step 1"), *call_rows(ok_call(), IPS_BY_IP)))
    page = html_page(d, mermaid(d))
    for lane in ("client", "worker", "dns", "proxy", pod_lane("invocation-service-0")):
        assert f'id="lane-{lane}"' in page
    assert (
        "<script" not in page
        and "http://" not in page.replace("http://www.w3.org/2000/svg", "").split("<svg")[0]
    )  # nothing to fetch before the drawing
    assert "demo &lt;b&gt;" in page and 'class="mermaid"' in page


def test_scenario_from_data_rejects_what_the_schema_cannot_say() -> None:
    with pytest.raises(Exception, match=r"steps\[0\]: a step needs one of invoke"):
        scenario_from_data({"name": "x", "summary": "y", "steps": [{"name": "nothing"}]}, Path("x.yaml"))
    with pytest.raises(Exception, match=r"steps\[0\].wait: name either event or listener"):
        scenario_from_data({"name": "x", "summary": "y", "steps": [{"wait": {"count": 2}}]}, Path("x.yaml"))


IPS_BY_IP = {ip: name for name, ip in IPS.items()}


def _lanes() -> tuple:
    from scenarios.sequence import BASE_LANES, Lane

    return (*BASE_LANES, *(Lane(pod_lane(n), n) for n in IPS))
