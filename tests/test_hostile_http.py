"""Hostile input against the proxy's fronts (DESIGN.md section 3): HTTP/1.1 over raw TLS sockets to TCP
10084, TLS-level cases (plaintext, SNI, ALPN), slow clients, CONNECT switched on, and the HTTP/3 front's
SNI routing on UDP 443.

Every case checks the answer on the wire, the proxy's record of it (Envoy-format access-log line, or its
events), and -- the point of the exercise -- that no request the policy forbids ever reached a pod, read
from the pods' own events.

Every request carries a unique X-Request-Id `hx-<case>`: the pods log what they receive under that id
(their token check fails, so the header is what they log), and allowed controls must show up there,
proving the pod-side check can fail.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from proxy_wire import up_with_stream_idle
from stack_records import Records

from clusters.local import LocalBackend, LocalStack
from scenarios.engine import run_scenario
from scenarios.load import load_scenario
from scenarios.result import ScenarioResult
from sim.protocols import h3
from sim.proxy.access_log import read_access_log

WD = "grpc-worker.example.com"
SNI = f"invocation.{WD}"
POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
POD2 = "10-42-0-12.invocation.nvcf.svc.cluster.local"
ATTACH = "/v2/nvcf/worker/request-attach"
SHORT = 5.0  # a local reply or a pod's 401 takes milliseconds; this only bounds a broken proxy
IDLE = 0.6  # NCPSIM_PROXY_STREAM_IDLE for the slow-client stack (Envoy's 300 s, scaled down)
TRICKLE = 0.1  # gap between a steady client's pieces: well inside IDLE even on a busy machine


# Wire helpers ----------------------------------------------------------------------------------
def client_context(ca: str | None, verify: bool = True) -> ssl.SSLContext:
    """A worker's TLS client: trusts the stack CA only, or (verify=False) nothing at all."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if verify:
        ctx.load_verify_locations(cafile=ca)
    else:
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


def read_until_eof(sock: socket.socket | ssl.SSLSocket) -> tuple[bytes, bool]:
    """Everything the proxy sends until it closes; (data, True) if it went quiet instead of closing."""
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return out, True
        except (ConnectionError, ssl.SSLError):
            return out, False  # a reset or an unclean TLS close still ends the exchange
        if not chunk:
            return out, False
        out += chunk


def exchange(port: int, raw: bytes, ctx: ssl.SSLContext, sni: str | None = SNI) -> tuple[bytes, bool]:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=SHORT) as sock,
        ctx.wrap_socket(sock, server_hostname=sni) as tls,
    ):
        tls.sendall(raw)
        return read_until_eof(tls)


def statuses(data: bytes) -> list[int]:
    """Status codes of the complete responses in `data` (Content-Length framing, as the proxy sends)."""
    found = []
    while data.startswith(b"HTTP/"):
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.split(b"\r\n")
        found.append(int(lines[0].split()[1]))
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in lines[1:]
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        data = rest[length:]
    return found


def req(
    name: str,
    line: str,
    *headers: tuple[str, str],
    host: str | None = f"{POD}:8443",
    body: bytes = b"",
    close: bool = True,
) -> bytes:
    """One request head (+ body). Connection: close makes the proxy close after its log line is written,
    so reading to EOF means the access log is complete for this case."""
    hdrs = ([("Host", host)] if host else []) + [("X-Request-Id", f"hx-{name}"), *headers]
    if close:
        hdrs.append(("Connection", "close"))
    text = line + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs) + "\r\n"
    return text.encode("latin-1") + body


def get(name: str, target: str, *headers: tuple[str, str], **kw: object) -> bytes:
    return req(name, f"GET {target} HTTP/1.1", *headers, **kw)  # type: ignore[arg-type]


# Cases -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes  # {pod_port} and {proxy_port} are filled with the stack's real loopback ports
    expect: tuple[tuple[int, str], ...]  # (status, access-log flag) per request on the connection
    allowed: tuple[str, ...] = ()  # request ids that must reach a pod; every other hx- id must not
    parsed: bool | None = True  # the head parsed, so the log names hx-<name>; None: depends on chunking
    forbidden_ids: tuple[str, ...] = field(default=())
    may_reach: bool = False  # an allowed head whose body then breaks: Envoy streams it too, so either way

    @property
    def ids(self) -> tuple[str, ...]:
        return (f"hx-{self.name}", *self.forbidden_ids)


def nr(name: str, raw: bytes) -> Case:
    return Case(name, raw, ((404, "NR"),))


def dpe(name: str, raw: bytes, status: int = 400, parsed: bool | None = False) -> Case:
    return Case(name, raw, ((status, "DPE"),), parsed=parsed)


def path_case(name: str, path: str) -> Case:
    return nr(name, get(name, f"http://{POD}:8443{path}"))


CASES: list[Case] = [
    # Allowed controls: the pod answers 401 (no token), proving these requests do reach it.
    Case("ok-get", get("ok-get", f"http://{POD}:8443{ATTACH}"), ((401, "-"),), allowed=("hx-ok-get",)),
    Case(
        "ok-post",
        req("ok-post", f"POST http://{POD}:8443{ATTACH} HTTP/1.1", ("Content-Length", "2"), body=b"{}"),
        ((401, "-"),),
        allowed=("hx-ok-post",),
    ),
    Case(
        "ok-query",
        get("ok-query", f"http://{POD}:8443{ATTACH}?a=1&b=%2e%2e"),
        ((401, "-"),),
        allowed=("hx-ok-query",),
    ),
    Case(
        "ok-pod2",
        get("ok-pod2", f"http://{POD2}:8443{ATTACH}", host=f"{POD2}:8443"),
        ((401, "-"),),
        allowed=("hx-ok-pod2",),
    ),
    # RFC 9112 3.2.2: with an absolute-form target the Host header is ignored (Envoy does the same).
    Case(
        "ok-host-mismatch",
        get("ok-host-mismatch", f"http://{POD}:8443{ATTACH}", host="evil.example"),
        ((401, "-"),),
        allowed=("hx-ok-host-mismatch",),
    ),
    # Envoy lower-cases an absolute URL's scheme before routing, so this is the allowed form.
    Case(
        "ok-upper-scheme",
        get("ok-upper-scheme", f"HTTP://{POD}:8443{ATTACH}"),
        ((401, "-"),),
        allowed=("hx-ok-upper-scheme",),
    ),
    # Path tricks: Envoy matches the path as sent (no normalisation in this route), so none matches.
    path_case("p-dotdot", "/v2/nvcf/x/../worker/request-attach"),
    path_case("p-dotdot-tail", f"{ATTACH}/../request-attach"),
    path_case("p-dot", "/v2/nvcf/worker/./request-attach"),
    path_case("p-pct-dotdot", "/v2/nvcf/x/%2e%2e/worker/request-attach"),
    path_case("p-pct-dotdot-upper", "/v2/nvcf/x/%2E%2E/worker/request-attach"),
    path_case("p-double-slash-lead", f"/{ATTACH}"),
    path_case("p-double-slash-mid", "/v2/nvcf//worker/request-attach"),
    path_case("p-params-tail", f"{ATTACH};a=b"),
    path_case("p-params-mid", "/v2;x=1/nvcf/worker/request-attach"),
    path_case("p-upper", ATTACH.upper()),
    path_case("p-upper-one", "/v2/nvcf/worker/Request-attach"),
    path_case("p-pct-slash", "/v2%2fnvcf/worker/request-attach"),
    path_case("p-pct-slash-upper", "/v2/nvcf/worker%2Frequest-attach"),
    path_case("p-pct-letter", "/v2/nvcf/worker/request%2dattach"),
    path_case("p-trailing-slash", f"{ATTACH}/"),
    path_case("p-backslash", "/v2\\nvcf\\worker\\request-attach"),
    path_case("p-pct-nul", f"{ATTACH}%00"),
    path_case("p-empty", ""),
    # A pexec call through the proxy would start an invocation on the pod (seen as invoke.accepted).
    nr(
        "p-pexec",
        req(
            "p-pexec",
            f"POST http://{POD}:8443/v2/nvcf/pexec/functions/hx-p-pexec HTTP/1.1",
            ("Content-Length", "0"),
        ),
    ),
    dpe("p-fragment", get("p-fragment", f"http://{POD}:8443{ATTACH}#frag"), parsed=True),
    dpe(
        "p-fragment-authority",
        get("p-fragment-authority", f"http://evil.example#@{POD}:8443{ATTACH}"),
        parsed=True,
    ),
    # Absolute URLs off the allowed form: other schemes, hosts, ports, user-info.
    nr("a-https", get("a-https", f"https://{POD}:8443{ATTACH}")),
    nr("a-ftp", get("a-ftp", f"ftp://{POD}:8443{ATTACH}")),
    nr("a-other-host", get("a-other-host", f"http://example.com:8443{ATTACH}")),
    nr("a-loopback", get("a-loopback", "http://127.0.0.1:{pod_port}" + ATTACH)),
    nr("a-pod-ip", get("a-pod-ip", f"http://10.42.0.11:8443{ATTACH}")),
    nr("a-other-port", get("a-other-port", f"http://{POD}:9000{ATTACH}")),
    nr("a-no-port", get("a-no-port", f"http://{POD}{ATTACH}")),
    nr("a-plain-port", get("a-plain-port", f"http://{POD}:8080{ATTACH}")),  # upstream TLS is on
    nr("a-port-leading-zero", get("a-port-leading-zero", f"http://{POD}:08443{ATTACH}")),
    nr("a-double-port", get("a-double-port", f"http://{POD}:8443:8443{ATTACH}")),
    nr("a-upper-host", get("a-upper-host", f"http://{POD.upper()}:8443{ATTACH}")),
    nr("a-trailing-dot", get("a-trailing-dot", f"http://{POD}.:8443{ATTACH}")),
    nr(
        "a-bad-dashed-ip",
        get("a-bad-dashed-ip", f"http://10-42-0-256.invocation.nvcf.svc.cluster.local:8443{ATTACH}"),
    ),
    nr(
        "a-grpc-headless",
        get("a-grpc-headless", f"http://10-42-0-41.grpc-headless.nvcf.svc.cluster.local:8443{ATTACH}"),
    ),
    nr("a-extra-label", get("a-extra-label", f"http://x.{POD}:8443{ATTACH}")),
    nr("a-ipv6", get("a-ipv6", f"http://[::1]:8443{ATTACH}")),
    dpe("a-bad-ipv6", get("a-bad-ipv6", "http://["), parsed=True),  # Envoy: 400 invalid_url
    nr("a-origin-form", get("a-origin-form", ATTACH)),  # a forward proxy routes absolute-form only
    nr("a-asterisk", req("a-asterisk", "OPTIONS * HTTP/1.1")),
    dpe("a-userinfo", get("a-userinfo", f"http://u:p@{POD}:8443{ATTACH}"), parsed=True),
    dpe("a-userinfo-user", get("a-userinfo-user", f"http://u@{POD}:8443{ATTACH}"), parsed=True),
    dpe(
        "a-userinfo-confusion",
        get("a-userinfo-confusion", f"http://{POD}:8443@example.com:8443{ATTACH}"),
        parsed=True,
    ),
    # CONNECT is off by default: every target gets 404 NR, and bytes after it are a new request.
    nr("c-pod", req("c-pod", f"CONNECT {POD}:8443 HTTP/1.1")),
    nr("c-other-host", req("c-other-host", "CONNECT example.com:443 HTTP/1.1", host="example.com:443")),
    nr("c-loopback", req("c-loopback", "CONNECT 127.0.0.1:{proxy_port} HTTP/1.1", host="127.0.0.1")),
    nr("c-pod-ip", req("c-pod-ip", "CONNECT 10.42.0.11:8443 HTTP/1.1", host="10.42.0.11:8443")),
    Case(
        "c-then-request",
        req("c-then-request", f"CONNECT {POD}:8443 HTTP/1.1", close=False)
        + get("c-then-request-2", f"http://{POD}:8443/v2/nvcf/pexec/status/x"),
        ((404, "NR"), (404, "NR")),
        forbidden_ids=("hx-c-then-request-2",),
    ),
    # Framing: request smuggling shapes.
    dpe(
        "f-cl-te",
        req(
            "f-cl-te",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Content-Length", "5"),
            ("Transfer-Encoding", "chunked"),
            body=b"0\r\n\r\n",
        ),
        parsed=True,
    ),
    dpe(
        "f-te-gzip",
        req("f-te-gzip", f"POST http://{POD}:8443{ATTACH} HTTP/1.1", ("Transfer-Encoding", "gzip")),
        status=501,
    ),
    dpe(
        "f-te-gzip-chunked",
        req(
            "f-te-gzip-chunked",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Transfer-Encoding", "gzip, chunked"),
        ),
        status=501,
    ),
    dpe(
        "f-te-identity",
        req("f-te-identity", f"POST http://{POD}:8443{ATTACH} HTTP/1.1", ("Transfer-Encoding", "identity")),
        status=501,
    ),
    dpe(
        "f-te-twice",
        req(
            "f-te-twice",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Transfer-Encoding", "chunked"),
            ("Transfer-Encoding", "chunked"),
        ),
        status=501,
    ),
    dpe(
        "f-cl-conflict",
        req(
            "f-cl-conflict",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Content-Length", "1"),
            ("Content-Length", "2"),
            body=b"xx",
        ),
    ),
    dpe(
        "f-cl-negative",
        req("f-cl-negative", f"POST http://{POD}:8443{ATTACH} HTTP/1.1", ("Content-Length", "-1")),
    ),
    # A forbidden request hidden after a chunked body's end is parsed, and routed, as its own request.
    Case(
        "f-te-smuggle",
        req(
            "f-te-smuggle",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Transfer-Encoding", "chunked"),
            close=False,
            body=b"0\r\n\r\n",
        )
        + get("f-te-smuggle-2", f"http://{POD}:8443/v2/nvcf/pexec/status/x"),
        ((401, "-"), (404, "NR")),
        allowed=("hx-f-te-smuggle",),
        forbidden_ids=("hx-f-te-smuggle-2",),
    ),
    # ... while one inside a Content-Length body is only body bytes for the allowed request.
    Case(
        "f-cl-smuggle",
        req(
            "f-cl-smuggle",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Content-Length", str(len(inner := get("f-cl-smuggle-2", f"http://{POD}:8443/x")))),
            body=inner,
        ),
        ((401, "-"),),
        allowed=("hx-f-cl-smuggle",),
        forbidden_ids=("hx-f-cl-smuggle-2",),
    ),
    # An allowed request whose chunked body is malformed: the head was already on its way to the pod (Envoy
    # streams too), but the worker gets the codec's 400 at once instead of waiting out the idle timeout.
    Case(
        "f-bad-chunk",
        req(
            "f-bad-chunk",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Transfer-Encoding", "chunked"),
            body=b"zz\r\nabc\r\n0\r\n\r\n",
        ),
        ((400, "DPE"),),
        may_reach=True,
    ),
    # A chunk size past 64 bits (h11 reads up to 20 hex digits): Envoy's codec refuses it at once.
    Case(
        "f-chunk-2e64",
        req(
            "f-chunk-2e64",
            f"POST http://{POD}:8443{ATTACH} HTTP/1.1",
            ("Transfer-Encoding", "chunked"),
            body=b"10000000000000000\r\nabc",
        ),
        ((400, "DPE"),),
        may_reach=True,
    ),
    Case(
        "f-pipelined",
        get("f-pipelined", f"http://{POD}:8443{ATTACH}", close=False)
        + get("f-pipelined-2", f"http://{POD}:8443/v2/nvcf/x/../worker/request-attach"),
        ((401, "-"), (404, "NR")),
        allowed=("hx-f-pipelined",),
        forbidden_ids=("hx-f-pipelined-2",),
    ),
    # Header limits: Envoy's max_request_headers_kb (60) and max_headers_count (100).
    dpe("h-61k", get("h-61k", f"http://{POD}:8443{ATTACH}", ("X-Big", "a" * 61 * 1024)), 431, parsed=True),
    dpe("h-70k", get("h-70k", f"http://{POD}:8443{ATTACH}", ("X-Big", "a" * 70 * 1024)), 431, parsed=None),
    dpe(
        "h-target-70k", get("h-target-70k", f"http://{POD}:8443{ATTACH}?{'a' * 70 * 1024}"), 431, parsed=None
    ),
    dpe(
        "h-101",
        get("h-101", f"http://{POD}:8443{ATTACH}", *[(f"X-H{i}", "v") for i in range(100)]),
        431,
        parsed=True,
    ),
    dpe(
        "h-no-colon",
        get("h-no-colon", f"http://{POD}:8443{ATTACH}", ("X-A", "b")).replace(b"X-A: b", b"X-A b"),
    ),
    dpe("h-space-before-colon", get("h-space-before-colon", f"http://{POD}:8443{ATTACH}", ("X-A ", "b"))),
    dpe("h-nul", get("h-nul", f"http://{POD}:8443{ATTACH}", ("X-A", "b\0c"))),
    # Bad request lines.
    dpe("r-garbage", b"HELLO\r\n\r\n"),
    dpe("r-no-version", b"GET /\r\n\r\n"),
    dpe("r-tab", get("r-tab", f"http://{POD}:8443{ATTACH}").replace(b"GET ", b"GET\t", 1)),
    dpe("r-two-spaces", get("r-two-spaces", f"http://{POD}:8443{ATTACH}").replace(b"GET ", b"GET  ", 1)),
    dpe("r-space-in-target", get("r-space-in-target", f"http://{POD}:8443{ATTACH} x")),
    dpe("r-utf8", get("r-utf8", f"http://{POD}:8443{ATTACH}").replace(b"attach", "attach\u00e9".encode(), 1)),
    # Versions: Envoy treats anything but 1.1 as HTTP/1.0 and refuses it with 426 (no response flag).
    Case("r-http10", req("r-http10", f"GET http://{POD}:8443{ATTACH} HTTP/1.0"), ((426, "-"),)),
    Case("r-http12", req("r-http12", f"GET http://{POD}:8443{ATTACH} HTTP/1.2"), ((426, "-"),)),
    Case("r-http20", req("r-http20", f"GET http://{POD}:8443{ATTACH} HTTP/2.0"), ((426, "-"),)),
    Case("r-h2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", ((426, "-"),), parsed=None),
]


# The running stack and the batch ------------------------------------------------------------------
@dataclass
class Outcome:
    data: bytes
    stalled: bool
    log: list[dict[str, str]]


def proxy_port(stack: LocalStack) -> int:
    return stack.status()["proxy"]["http"]["port"]


def access_log(stack: LocalStack) -> list[dict[str, str]]:
    return read_access_log(stack.state_dir / "logs" / "worker-callback-proxy.access.log")


def pod_events(stack: LocalStack) -> list[dict]:
    events = []
    for path in sorted((stack.state_dir / "events").glob("invocation-service-*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


@pytest.fixture(scope="module")
def batch(http_stack: tuple[LocalStack, ScenarioResult]) -> tuple[LocalStack, dict[str, Outcome]]:
    stack, result = http_stack
    assert result.ok, result.failures
    return stack, send_batch(stack, CASES)


def send_batch(stack: LocalStack, cases: list[Case]) -> dict[str, Outcome]:
    """Send every case once, each on its own connection, in order, noting the log lines it produced."""
    netmap = json.loads((stack.state_dir / "netmap.json").read_text())
    ports = {"pod_port": netmap["bindings"]["10.42.0.11:8443/tcp"], "proxy_port": proxy_port(stack)}
    ctx = client_context(stack.status()["ca"]["stack"])
    outcomes = {}
    for case in cases:
        raw = case.raw.replace(b"{pod_port}", str(ports["pod_port"]).encode()).replace(
            b"{proxy_port}", str(ports["proxy_port"]).encode()
        )
        before = len(access_log(stack))
        data, stalled = exchange(ports["proxy_port"], raw, ctx)
        outcomes[case.name] = Outcome(data, stalled, access_log(stack)[before:])
    return outcomes


def test_there_are_at_least_forty_cases() -> None:
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(case: Case, batch: tuple[LocalStack, dict[str, Outcome]]) -> None:
    check_case(case, batch[1][case.name])


def check_case(case: Case, out: Outcome) -> None:
    assert not out.stalled, f"the proxy neither answered nor closed: {out.data[:200]!r}"
    assert statuses(out.data) == [status for status, _ in case.expect], out.data[:300]
    assert [(int(rec["status"]), rec["flags"]) for rec in out.log] == list(case.expect)
    for (status, flag), rec in zip(case.expect, out.log, strict=True):
        forwarded = (flag == "-" and status == 401) or case.may_reach
        assert (rec["upstream_host"] != "-") is forwarded, rec
    if case.parsed is True:
        assert out.log[0]["request_id"] == f"hx-{case.name}"
    elif case.parsed is False:
        assert out.log[0]["request_id"] == "-"  # the codec refused it before there was a request


def test_no_forbidden_request_reached_a_pod(batch: tuple[LocalStack, dict[str, Outcome]]) -> None:
    """The pods' own events: every allowed control arrived, nothing forbidden did."""
    stack, _ = batch
    events = pod_events(stack)
    # pod.request (every request a pod parses, any path) where the pods log it; attach.* and
    # invoke.accepted (the routes that act) in any case.
    seen = {
        e.get("requestId") for e in events if e["kind"] == "pod.request" or e["kind"].startswith("attach.")
    }
    seen |= {e.get("function") for e in events if e["kind"] == "invoke.accepted"}
    allowed = {rid for c in CASES for rid in c.allowed}
    maybe = {f"hx-{c.name}" for c in CASES if c.may_reach}
    forbidden = {rid for c in CASES for rid in c.ids} - allowed - maybe
    assert allowed <= seen, f"controls missing from pod events: {sorted(allowed - seen)}"
    assert not (forbidden & seen), f"forbidden requests reached a pod: {sorted(forbidden & seen)}"
    assert {rid for rid in seen if isinstance(rid, str) and rid.startswith("hx-")} <= allowed | maybe


# TLS-level cases ---------------------------------------------------------------------------------
def test_plaintext_http_to_the_tls_port_gets_no_http_answer(http_stack) -> None:
    stack, _ = http_stack
    before = len(access_log(stack))
    with socket.create_connection(("127.0.0.1", proxy_port(stack)), timeout=SHORT) as sock:
        sock.sendall(get("t-plaintext", f"http://{POD}:8443{ATTACH}"))
        data, stalled = read_until_eof(sock)
    assert not stalled and not data.startswith(b"HTTP/")  # a TLS alert at most, then close
    assert len(access_log(stack)) == before  # Envoy logs no HTTP request for a failed handshake
    control = exchange(
        proxy_port(stack),
        get("t-plaintext-after", f"http://{POD}:8443{ATTACH}"),
        client_context(stack.status()["ca"]["stack"]),
    )
    assert statuses(control[0]) == [401]


@pytest.mark.parametrize(
    "sni", [None, "invocation.other.example", WD], ids=["no-sni", "other-domain", "apex"]
)
def test_sni_off_the_certificate_fails_the_workers_verification(http_stack, sni: str | None) -> None:
    """A worker that verifies (as every worker-utils does) refuses the session: the name is not covered.
    Without SNI the client checks the address it dialed, which the *.<workerDomain> certificate lacks."""
    stack, _ = http_stack
    ctx = client_context(stack.status()["ca"]["stack"])
    with (
        socket.create_connection(("127.0.0.1", proxy_port(stack)), timeout=SHORT) as sock,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        ctx.wrap_socket(sock, server_hostname=sni or "127.0.0.1")  # an IP literal sends no SNI


@pytest.mark.parametrize("sni", [None, "invocation.other.example"], ids=["no-sni", "other-domain"])
def test_without_verification_the_proxy_serves_its_one_certificate(http_stack, sni: str | None) -> None:
    """Envoy's listener here has one filter chain with no server_names match, so it presents the same
    frontend certificate whatever the SNI (or none) and serves the session; only the client's check
    stops a misnamed connection. The route policy still applies inside it."""
    stack, _ = http_stack
    frontend = (stack.state_dir / "certs" / "secrets").glob("*/tls.crt")
    served = []
    with (
        socket.create_connection(("127.0.0.1", proxy_port(stack)), timeout=SHORT) as sock,
        client_context(None, verify=False).wrap_socket(sock, server_hostname=sni) as tls,
    ):
        served.append(ssl.DER_cert_to_PEM_cert(tls.getpeercert(binary_form=True) or b""))
    assert any(served[0].strip() in path.read_text() for path in frontend)
    name = "no-sni" if sni is None else "other-sni"
    ok = exchange(
        proxy_port(stack),
        get(f"t-{name}-ok", f"http://{POD}:8443{ATTACH}"),
        client_context(None, verify=False),
        sni,
    )
    bad = exchange(
        proxy_port(stack),
        get(f"t-{name}-bad", f"http://{POD}:8443{ATTACH}/.."),
        client_context(None, verify=False),
        sni,
    )
    assert (statuses(ok[0]), statuses(bad[0])) == ([401], [404])
    seen = {e.get("requestId") for e in pod_events(stack)}
    assert f"hx-t-{name}-ok" in seen and f"hx-t-{name}-bad" not in seen


def test_alpn_without_http11_is_served_as_http11(http_stack) -> None:
    """A client offering only h2 gets no ALPN (the server does not fail the handshake, as Envoy/BoringSSL
    do not) and its HTTP/1.1 request is served; an h2 preface would get 426 (case r-h2-preface)."""
    stack, _ = http_stack
    ctx = client_context(stack.status()["ca"]["stack"])
    ctx.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", proxy_port(stack)), timeout=SHORT) as sock,
        ctx.wrap_socket(sock, server_hostname=SNI) as tls,
    ):
        assert tls.selected_alpn_protocol() is None
        tls.sendall(get("t-alpn-h2", f"http://{POD}:8443{ATTACH}"))
        data, _ = read_until_eof(tls)
    assert statuses(data) == [401]


# Slow clients: Envoy's stream idle timeout -----------------------------------------------------------
@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A stack whose proxy has a short stream idle timeout (the proxy reads it from its environment,
    which it inherits from this process at spawn)."""
    stack = LocalStack("hostile-slow", root=tmp_path_factory.mktemp("ncpsim-slow"))
    try:
        up_with_stream_idle(stack, IDLE)
        yield stack
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


def slow_exchange(stack: LocalStack, *parts: bytes, gap: float = 0.0) -> tuple[list[int], float, bool]:
    """Send `parts` `gap` seconds apart (the slowness under test), then read to EOF; (statuses, seconds)."""
    ctx = client_context(stack.status()["ca"]["stack"])
    started = time.monotonic()
    with (
        socket.create_connection(("127.0.0.1", proxy_port(stack)), timeout=SHORT) as sock,
        ctx.wrap_socket(sock, server_hostname=SNI) as tls,
    ):
        for i, part in enumerate(parts):
            if i:
                time.sleep(gap)
            tls.sendall(part)
        data, stalled = read_until_eof(tls)
    return statuses(data), time.monotonic() - started, stalled


def logged(records: Records, request_id: str) -> tuple[int, str]:
    """(status, flags) of the access-log line for `request_id` ("-": a head cut off before its id)."""
    rec = records.access_line(request_id=request_id)
    return int(rec["status"]), rec["flags"]


def test_slow_request_head_gets_408_si(slow_stack: LocalStack) -> None:
    """Half a request head, then silence: the stream exists once its first byte arrived."""
    head = get("s-head", f"http://{POD}:8443{ATTACH}")
    records = Records(slow_stack.state_dir)
    found, took, stalled = slow_exchange(slow_stack, head[:40])
    assert (found, stalled) == ([408], False)
    assert IDLE <= took < SHORT
    assert logged(records, "-") == (408, "SI")


def test_slow_request_body_gets_408_si(slow_stack: LocalStack) -> None:
    """An allowed POST whose body stops half-way: the pod is still waiting, so the proxy answers 408."""
    head = req("s-body", f"POST http://{POD}:8443{ATTACH} HTTP/1.1", ("Content-Length", "10"))
    records = Records(slow_stack.state_dir)
    found, took, stalled = slow_exchange(slow_stack, head + b"abc")
    assert (found, stalled) == ([408], False)
    assert IDLE <= took < SHORT
    assert logged(records, "hx-s-body") == (408, "SI")


def test_a_steady_trickle_is_not_idle(slow_stack: LocalStack) -> None:
    """A piece every TRICKLE seconds, longer than the idle timeout in all: idle means silent, not slow."""
    head = get("s-trickle", f"http://{POD}:8443{ATTACH}")
    step = len(head) // (int(IDLE / TRICKLE) + 2) + 1
    pieces = [head[i : i + step] for i in range(0, len(head), step)]
    records = Records(slow_stack.state_dir)
    found, took, _ = slow_exchange(slow_stack, *pieces, gap=TRICKLE)
    assert found == [401] and took > IDLE
    assert logged(records, "hx-s-trickle") == (401, "-")


def test_an_idle_keep_alive_connection_outlives_the_stream_timeout(slow_stack: LocalStack) -> None:
    """Between requests there is no stream; Envoy's connection idle timeout (1 h) governs, so a worker's
    pooled connection is still usable after a pause longer than the stream idle timeout."""
    first = get("s-keep-1", f"http://{POD}:8443{ATTACH}", close=False)
    second = get("s-keep-2", f"http://{POD}:8443{ATTACH}")
    found, _, stalled = slow_exchange(slow_stack, first, second, gap=2 * IDLE)
    assert (found, stalled) == ([401, 401], False)


def test_slow_stack_pods_saw_only_allowed_requests(slow_stack: LocalStack) -> None:
    seen = {e.get("requestId") for e in pod_events(slow_stack) if e["kind"].startswith("attach.")}
    assert not {rid for rid in seen if rid and rid.startswith("hx-s-head")}  # cut off before routing
    assert {"hx-s-trickle", "hx-s-keep-1", "hx-s-keep-2"} <= seen


# The HTTP/3 front (UDP 443): the SNI is the route -----------------------------------------------------
@dataclass(frozen=True)
class H3Case:
    name: str
    sni: str | None
    expect: tuple[int, str]  # (status, flag); status 0: the handshake is refused with TLS alert `flag`
    alpn: tuple[str, ...] = ("h3",)
    allowed: bool = False  # the request must reach a grpc-proxy pod (which then judges its token)


GRPC_POD = "10-42-0-41"
ALERT_UNRECOGNIZED_NAME, ALERT_NO_APPLICATION_PROTOCOL = 0x100 + 112, 0x100 + 120  # QUIC CRYPTO_ERROR + alert
H3_CASES = [
    H3Case("h3-ok", f"{GRPC_POD}.{WD}", (400, "-"), allowed=True),  # the pod's own answer to a bad request id
    H3Case("h3-other-domain", f"{GRPC_POD}.other.example", (0, "NR")),
    H3Case("h3-domain-suffix-trick", f"{GRPC_POD}.{WD}.evil.example", (0, "NR")),
    H3Case("h3-apex", WD, (0, "NR")),
    H3Case("h3-no-sni", None, (0, "NR")),
    H3Case("h3-invocation-name", f"invocation.{WD}", (404, "NR")),
    H3Case("h3-not-an-ip", f"foo.{WD}", (404, "NR")),
    H3Case("h3-octet-256", f"10-42-0-256.{WD}", (404, "NR")),
    H3Case("h3-leading-zero", f"10-42-0-041.{WD}", (404, "NR")),
    H3Case("h3-no-such-pod", f"10-42-0-99.{WD}", (503, "DF")),
    H3Case("h3-alpn-h2", f"{GRPC_POD}.{WD}", (0, "ALPN"), alpn=("h2",)),
    H3Case("h3-alpn-hq", f"{GRPC_POD}.{WD}", (0, "ALPN"), alpn=("hq-interop",)),
]


@dataclass
class H3Outcome:
    handshake_error: int | None = None
    status: int | None = None


async def h3_attempt(port: int, ca: Path, case: H3Case) -> H3Outcome:
    """One worker connection: POST /v1/proxy with a made-up token, marked with the case's request id."""
    config = h3.client_configuration(case.sni or "unused", h3.trust_pem([ca]))
    config.alpn_protocols = list(case.alpn)
    if case.sni is None:
        # No SNI at all: nothing to check the certificate against, so only the proxy's choice is tested.
        config.server_name, config.verify_mode = None, ssl.CERT_NONE
    try:
        client = await h3.connect(("127.0.0.1", port), config, timeout=SHORT)
    except h3.HandshakeFailed as exc:
        return H3Outcome(handshake_error=exc.error_code)
    try:
        stream = client.open_request(
            [
                (b":method", b"POST"),
                (b":scheme", b"https"),
                (b":authority", (case.sni or "").encode()),
                (b":path", b"/v1/proxy"),
                (b"authorization", b"Bearer " + b"a" * 64),
                (b"x-request-id", f"hx-{case.name}".encode()),
            ],
            end=True,
        )
        await asyncio.wait_for(stream.headers, SHORT)
        await asyncio.wait_for(stream.read(), SHORT)
        return H3Outcome(status=stream.status)
    finally:
        h3.close_client(client)


@pytest.fixture(scope="module")
def h3_batch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, dict[str, H3Outcome]]]:
    stack = LocalStack("hostile-h3", root=tmp_path_factory.mktemp("ncpsim-h3"))
    try:
        result = run_scenario(load_scenario("grpc-callback"), LocalBackend(stack.root), stack.name, keep=True)
        assert result.ok, result.failures
        status = stack.status()
        port, ca = status["proxy"]["h3"]["port"], Path(status["ca"]["stack"])

        async def run_all() -> dict[str, H3Outcome]:
            return {case.name: await h3_attempt(port, ca, case) for case in H3_CASES}

        yield stack, asyncio.run(run_all())
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


@pytest.mark.parametrize("case", H3_CASES, ids=[c.name for c in H3_CASES])
def test_h3_hostile_case(case: H3Case, h3_batch: tuple[LocalStack, dict[str, H3Outcome]]) -> None:
    stack, outcomes = h3_batch
    out = outcomes[case.name]
    status, flag = case.expect
    records = Records(stack.state_dir, since_start=True)  # the batch ran before this test
    if status == 0:
        alert = ALERT_NO_APPLICATION_PROTOCOL if flag == "ALPN" else ALERT_UNRECOGNIZED_NAME
        assert (out.handshake_error, out.status) == (alert, None)
        if flag == "NR":  # no filter chain matches the name: Envoy logs the connection with NR
            assert records.event("proxy.h3.refused", authority=case.sni)["flags"] == "NR"
        return
    assert (out.handshake_error, out.status) == (None, status)
    # The proxy records a stream once both sides ended, which may be just after the client has its answer.
    stream = records.event("proxy.h3.stream", requestId=f"hx-{case.name}")
    assert (stream["status"], stream["flags"]) == (status, flag)
    assert [
        e
        for e in records.events
        if e.get("requestId") == f"hx-{case.name}" and e["kind"] == "proxy.h3.stream"
    ] == [stream]
    assert (stream["upstream"] != "-") is case.allowed  # DF: the pod name never resolved


def test_h3_no_forbidden_request_reached_a_grpc_pod(
    h3_batch: tuple[LocalStack, dict[str, H3Outcome]],
) -> None:
    stack, _ = h3_batch
    seen = set()
    for path in (stack.state_dir / "events").glob("grpc-proxy-*.jsonl"):
        seen |= {json.loads(line).get("requestId") for line in path.read_text().splitlines() if line.strip()}
    allowed = {f"hx-{c.name}" for c in H3_CASES if c.allowed}
    assert allowed <= seen, "the control never reached its pod: the check below would prove nothing"
    assert {rid for rid in seen if isinstance(rid, str) and rid.startswith("hx-")} == allowed


# CONNECT switched on (workerCallbackProxy.invocation.connect.enabled): only the pod's 8443 tunnels ------
CONNECT_ON = "workerCallbackProxy:\n  invocation:\n    connect:\n      enabled: true\n"
CONNECT_CASES = [
    nr("con-other-host", req("con-other-host", "CONNECT example.com:443 HTTP/1.1", host="example.com:443")),
    nr("con-other-port", req("con-other-port", f"CONNECT {POD}:22 HTTP/1.1", host=f"{POD}:22")),
    nr("con-plain-port", req("con-plain-port", f"CONNECT {POD}:8080 HTTP/1.1", host=f"{POD}:8080")),
    nr("con-loopback", req("con-loopback", "CONNECT 127.0.0.1:{pod_port} HTTP/1.1", host="127.0.0.1")),
    nr("con-pod-ip", req("con-pod-ip", "CONNECT 10.42.0.11:8443 HTTP/1.1", host="10.42.0.11:8443")),
    nr(
        "con-grpc-pod",
        req("con-grpc-pod", "CONNECT 10-42-0-41.grpc-headless.nvcf.svc.cluster.local:8443 HTTP/1.1"),
    ),
    nr("con-upper-host", req("con-upper-host", f"CONNECT {POD.upper()}:8443 HTTP/1.1")),
    nr("con-absolute", req("con-absolute", f"CONNECT http://{POD}:8443/ HTTP/1.1")),
    nr("con-userinfo", req("con-userinfo", f"CONNECT u:p@{POD}:8443 HTTP/1.1")),
    Case(
        "con-no-such-pod",
        req("con-no-such-pod", "CONNECT 10-42-0-99.invocation.nvcf.svc.cluster.local:8443 HTTP/1.1"),
        ((503, "DF"),),
    ),
]


@pytest.fixture(scope="module")
def connect_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LocalStack, dict[str, Outcome]]]:
    root = tmp_path_factory.mktemp("ncpsim-connect")
    values = root / "connect-on.yaml"
    values.write_text(CONNECT_ON)
    stack = LocalStack("hostile-connect", root=root)
    try:
        result = run_scenario(
            load_scenario("http-callback", values), LocalBackend(stack.root), stack.name, keep=True
        )
        assert result.ok, result.failures
        yield stack, send_batch(stack, CONNECT_CASES)
    finally:
        stack.down()
        assert not stack.launcher.running(), "components still running after down"


@pytest.mark.parametrize("case", CONNECT_CASES, ids=[c.name for c in CONNECT_CASES])
def test_connect_enabled_hostile_case(
    case: Case, connect_batch: tuple[LocalStack, dict[str, Outcome]]
) -> None:
    check_case(case, connect_batch[1][case.name])


def through_tunnel(tls: ssl.SSLSocket, ctx: ssl.SSLContext, host: str, raw: bytes) -> bytes:
    """A legacy worker's own TLS session to the pod inside the CONNECT tunnel (memory BIOs over `tls`)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    inner = ctx.wrap_bio(incoming, outgoing, server_hostname=host)

    def exchange_records() -> bool:
        if data := outgoing.read():
            tls.sendall(data)
        chunk = tls.recv(65536)
        if chunk:
            incoming.write(chunk)
        else:
            incoming.write_eof()
        return bool(chunk)

    while True:
        try:
            inner.do_handshake()
            break
        except ssl.SSLWantReadError:
            exchange_records()
    inner.write(raw)
    out = b""
    while True:
        try:
            if not (chunk := inner.read(65536)):
                return out
            out += chunk
        except ssl.SSLWantReadError:
            if not exchange_records():
                return out
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return out


def test_connect_enabled_tunnel_reaches_only_the_named_pod(
    connect_batch: tuple[LocalStack, dict[str, Outcome]],
) -> None:
    """The allowed control: CONNECT to the pod's 8443 gets 200, then the worker's request inside reaches
    that pod (401, no token); none of the refused CONNECTs above reached any pod."""
    stack, _ = connect_batch
    ca = stack.status()["ca"]["stack"]
    records = Records(stack.state_dir)
    with (
        socket.create_connection(("127.0.0.1", proxy_port(stack)), timeout=SHORT) as sock,
        client_context(ca).wrap_socket(sock, server_hostname=SNI) as tls,
    ):
        tls.sendall(req("con-tunnel", f"CONNECT {POD}:8443 HTTP/1.1", close=False))
        head = b""
        while b"\r\n\r\n" not in head:
            head += tls.recv(1)  # byte by byte: nothing past the 200's head belongs to this parser
        assert head.split()[1] == b"200"
        inner = through_tunnel(tls, client_context(ca), POD, get("con-tunnel-inner", ATTACH))
    assert statuses(inner) == [401]  # the pod's own answer, through the tunnel
    rec = records.access_line(request_id="hx-con-tunnel")  # written once both sides closed
    assert (rec["method"], rec["status"], rec["flags"], rec["upstream_host"]) == (
        "CONNECT",
        "200",
        "-",
        "10.42.0.11:8443",
    )
    seen = {e.get("requestId") for e in pod_events(stack)}
    assert "hx-con-tunnel-inner" in seen
    refused = {rid for c in CONNECT_CASES for rid in c.ids}
    assert not refused & seen, f"refused CONNECTs reached a pod: {sorted(refused & seen)}"


# Last, after every stack above has taken its hostile input ---------------------------------------------------
@pytest.mark.parametrize("fixture", ["batch", "slow_stack", "connect_batch"])
def test_no_traceback_in_any_component_log(fixture: str, request: pytest.FixtureRequest) -> None:
    """Issue 16 item 6: each hostile connection ends in a logged one-line reason, never a traceback."""
    value = request.getfixturevalue(fixture)
    stack = value[0] if isinstance(value, tuple) else value
    logs = {path.name: path.read_text() for path in (stack.state_dir / "logs").glob("*.log")}
    assert "worker-callback-proxy.log" in logs
    assert [name for name, text in logs.items() if "Traceback" in text] == []
