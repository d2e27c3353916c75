"""Properties of the proxy's routing decision: whatever arrives, nothing leaves outside the allowed form.

The one promise that matters (DESIGN.md sections 1 and 3): a Forward names
`http://<dashed-ip>.invocation.nvcf.svc.cluster.local:<upstream port>/v2/nvcf/worker/request-attach[?query]`
and nothing else, and no Tunnel exists while CONNECT is off. The oracle below is written independently of
policy.py (a regex and a literal rebuild of the target), so a bug shared by both would need two mistakes.

Two levels: generated RequestHeads straight into decide(), and generated request-head bytes through h11
exactly as the HTTP front parses them (sim.proxy.http_front.request_head), fed whole or in pieces.
The default suite runs a few hundred examples; `-m long` runs 100,000 inputs.
"""

from __future__ import annotations

import ipaddress
import re

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.protocols.reads import MAX_HEAD
from sim.proxy.http_front import request_head
from sim.proxy.policy import (
    MAX_HEADERS_BYTES,
    MAX_HEADERS_COUNT,
    Forward,
    ProxyPolicy,
    Reject,
    RequestHead,
    Tunnel,
    decide,
)

ATTACH = "/v2/nvcf/worker/request-attach"
SUFFIX = ".invocation.nvcf.svc.cluster.local"
POD_NAME = re.compile(r"(\d{1,3})-(\d{1,3})-(\d{1,3})-(\d{1,3})" + re.escape(SUFFIX))
ALLOWED_PATH = re.compile(re.escape(ATTACH) + r"(\?[^#]*)?")
REJECT_STATUSES = {400: {"DPE"}, 404: {"NR"}, 426: {"-"}, 431: {"DPE"}, 501: {"DPE"}}
DEFAULT_EXAMPLES = 300  # per property: fast enough for every run (the long test does 100,000 in all)
LONG_EXAMPLES = 50_000  # per property in the long test: two properties, 100,000 inputs


# The oracle ----------------------------------------------------------------------------------
def is_pod_name(host: str) -> bool:
    """`<dashed IPv4>.invocation.nvcf.svc.cluster.local`, octets canonical (no 010, nothing over 255)."""
    m = POD_NAME.fullmatch(host)
    if not m:
        return False
    octets = m.groups()
    return all(o == str(int(o)) and int(o) <= 255 for o in octets) and bool(
        ipaddress.IPv4Address(".".join(octets))
    )


def check_decision(head: RequestHead, policy: ProxyPolicy) -> None:
    decision = decide(head, policy)  # must not raise, whatever the input
    if isinstance(decision, Forward):
        assert is_pod_name(decision.host), decision
        assert (decision.port, decision.tls) == (policy.upstream_port, policy.upstream_tls), decision
        assert ALLOWED_PATH.fullmatch(decision.path), decision
        # The worker's own target, literally: no normalising, decoding or re-spelling on the way out.
        # (Only the scheme's case may differ: Envoy lower-cases it, so HTTP:// routes as http://.)
        rebuilt = f"http://{decision.host}:{decision.port}{decision.path}"
        target = head.target[:7].lower() + head.target[7:]
        assert target in (rebuilt, rebuilt + "?"), (head.target, decision)
        assert head.method != "CONNECT" and head.http_version == "1.1", head
        transfer = [v.strip().lower() for k, v in head.headers if k.lower() == "transfer-encoding"]
        assert transfer in ([], ["chunked"]), head.headers
        assert not (transfer and any(k.lower() == "content-length" for k, _ in head.headers))
        assert len(head.headers) <= MAX_HEADERS_COUNT
        assert sum(len(k) + len(v) for k, v in head.headers) <= MAX_HEADERS_BYTES
    elif isinstance(decision, Tunnel):
        assert policy.connect_enabled, (head, decision)
        assert head.method == "CONNECT" and is_pod_name(decision.host) and decision.port == 8443
        assert head.target == f"{decision.host}:8443"
    else:
        assert isinstance(decision, Reject), decision
        assert decision.flag in REJECT_STATUSES.get(decision.status, set()), decision


# Strategies ------------------------------------------------------------------------------------
# Targets are the exact allowed form, the allowed form with a few targeted mutations (where escapes
# hide), or wild; uniformly random text alone would almost never be forwarded at all.
octet = st.one_of(st.integers(0, 255).map(str), st.sampled_from(["256", "010", "00", "-1", "1e1", ""]))
good_dashed = st.tuples(*[st.integers(0, 255)] * 4).map(lambda o: "-".join(map(str, o)))
dashed = st.one_of(good_dashed, st.lists(octet, min_size=3, max_size=5).map("-".join))
wild_host = st.one_of(
    st.tuples(
        dashed,
        st.sampled_from(
            [
                SUFFIX,
                SUFFIX.upper(),
                SUFFIX + ".",
                ".invocation.nvcf.svc",
                "",
                ".grpc-headless.nvcf.svc.cluster.local",
                ".example.com",
            ]
        ),
    ).map("".join),
    st.sampled_from(["example.com", "127.0.0.1", "10.42.0.11", "[::1]", "localhost", ""]),
    st.text(st.characters(codec="ascii", exclude_characters="\r\n "), max_size=20),
)
port = st.one_of(
    st.sampled_from(["8443", "8080"]),
    st.sampled_from(["08443", "443", "", "8443:8443", "65536", "-1", " 8443"]),
    st.integers(0, 70000).map(str),
)
query = st.one_of(
    st.just(""),
    st.just("?"),
    st.text(st.characters(codec="ascii", exclude_characters="\r\n #"), max_size=15).map("?".__add__),
)
allowed_target = st.builds(
    lambda d, p, q: f"http://{d}{SUFFIX}:{p}{ATTACH}{q}",
    good_dashed,
    st.sampled_from(["8443", "8080"]),
    query,
)
# Mutations at any position: the tricks of DESIGN.md section 3 and the bytes that end or escape a field.
TRICKS = [
    "/",
    "//",
    "..",
    ".",
    "%2e%2e",
    "%2E",
    "%2f",
    "%2F",
    ";",
    ";a=b",
    "#",
    "?",
    "?a=1",
    "%00",
    "\\",
    "A",
    "%",
    "/./",
    "/../",
    "@",
    ":",
    ":8443",
    "u:p@",
    "http://",
    "HTTP",
    "s",
    " ",
    "\t",
    "\x80",
    "\xff",
]


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    text = draw(base)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 2))
        text = text[:at] + draw(st.sampled_from(TRICKS) | st.sampled_from(["", ""])) + text[at + cut :]
    return text


scheme = st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "http:/", "http:", "//", ""])
userinfo = st.sampled_from(["", "", "", "u@", "u:p@", ":@", f"10-42-0-11{SUFFIX}:8443@"])
wild_path = st.one_of(
    st.sampled_from([ATTACH, ATTACH.upper(), ATTACH + "/", "/" + ATTACH, "", "/x"]),
    st.text(st.characters(codec="latin-1", exclude_characters="\r\n "), max_size=40),
)
wild_target = st.one_of(
    st.builds(
        lambda s, u, h, p, pa, q: f"{s}{u}{h}{':' + p if p else ''}{pa}{q}",
        scheme,
        userinfo,
        wild_host,
        port,
        wild_path,
        query,
    ),
    st.builds(lambda d, p: f"{d}{SUFFIX}:{p}", dashed, port),  # authority-form, as CONNECT sends
    st.text(st.characters(codec="latin-1", exclude_characters="\r\n "), max_size=60),
)
# Listed twice: hypothesis picks a one_of branch uniformly, and forwards are where an escape would be.
target = st.one_of(
    allowed_target, allowed_target, mutated(allowed_target), mutated(allowed_target), wild_target
)
method = st.one_of(
    st.sampled_from(["GET", "POST"]),
    st.sampled_from(["CONNECT", "connect", "get", "PUT", "OPTIONS", "PRI", "HEAD"]),
    st.text(st.characters(codec="ascii", categories=["Lu", "Ll"]), min_size=1, max_size=8),
)
version = st.one_of(
    st.just("1.1"), st.just("1.1"), st.sampled_from(["1.0", "1.2", "2.0", "0.9", "1.1", "11"])
)
header_name = st.one_of(
    st.sampled_from(["x-request-id", "authorization", "accept", "user-agent"]),
    st.sampled_from(["content-length", "transfer-encoding", "Transfer-Encoding", "Content-Length"]),
    st.text(st.characters(codec="ascii", categories=["Ll"]), min_size=1, max_size=10),
)
header_value = st.one_of(
    st.sampled_from(["chunked", "0", "5", "Bearer x", "application/octet-stream"]),
    st.sampled_from(["gzip", "gzip, chunked", " chunked", "Chunked", "identity", "-1", ""]),
    st.text(st.characters(codec="latin-1", exclude_characters="\r\n"), max_size=20),
)
headers = st.one_of(st.just(()), st.lists(st.tuples(header_name, header_value), max_size=6).map(tuple))
policy = st.builds(ProxyPolicy, upstream_tls=st.booleans(), connect_enabled=st.booleans())
heads = st.builds(RequestHead, method=method, target=target, http_version=version, headers=headers)


@st.composite
def head_bytes(draw: st.DrawFn) -> bytes:
    """A request head on the wire, sometimes mangled at the byte level (what a fuzzer would send)."""
    h = draw(heads)
    line = f"{h.method} {h.target} HTTP/{h.http_version}\r\n"
    host = draw(st.sampled_from([[("Host", "x")], [("Host", "x")], []]))  # h11 requires Host on HTTP/1.1
    text = line + "".join(f"{k}: {v}\r\n" for k, v in [*host, *h.headers]) + "\r\n"
    data = bytearray(text.encode("latin-1", errors="replace"))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "delete", "flip"]))
        byte = draw(
            st.sampled_from([0, 9, 10, 13, 32, 35, 37, 47, 58, 59, 63, 0x7F, 0xFF]) | st.integers(0, 255)
        )
        if op == "insert":
            data[at:at] = bytes([byte])
        elif data and at < len(data):
            if op == "delete":
                del data[at]
            else:
                data[at] = byte
    return bytes(data)


def check_wire(data: bytes, cuts: list[int], policy: ProxyPolicy) -> None:
    """Parse as the HTTP front does (h11 server, same size limit), pieces at `cuts`, then decide."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    try:
        event: object = h11.NEED_DATA
        for piece in pieces:
            conn.receive_data(piece)
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                break
    except h11.RemoteProtocolError as exc:
        # The front answers these itself (400/431/501 DPE); they never reach decide() or a pod.
        assert exc.error_status_hint in (400, 431, 501), exc
        return
    if isinstance(event, h11.Request):
        check_decision(request_head(event), policy)


wire = st.tuples(head_bytes(), st.lists(st.integers(0, 400), max_size=4).map(sorted), policy)


def _check_wire_case(case: tuple[bytes, list[int], ProxyPolicy]) -> None:
    data, cuts, pol = case
    check_wire(data, [c for c in cuts if c <= len(data)], pol)


# Default suite ---------------------------------------------------------------------------------
@settings(max_examples=DEFAULT_EXAMPLES, deadline=None)
@given(heads, policy)
def test_decide_never_forwards_outside_the_allowed_form(head: RequestHead, pol: ProxyPolicy) -> None:
    check_decision(head, pol)


@settings(max_examples=DEFAULT_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wire)
def test_wire_bytes_through_h11_never_forward_outside_the_allowed_form(
    case: tuple[bytes, list[int], ProxyPolicy],
) -> None:
    _check_wire_case(case)


def test_the_oracle_accepts_the_allowed_form_and_rejects_a_near_miss() -> None:
    """Negative control: the oracle is not vacuous -- a Forward happens, and a wrong one would be caught."""
    pod = "10-42-0-11" + SUFFIX
    assert isinstance(decide(RequestHead("GET", f"http://{pod}:8443{ATTACH}?a=1"), ProxyPolicy()), Forward)
    check_decision(RequestHead("GET", f"http://{pod}:8443{ATTACH}?a=1"), ProxyPolicy())
    assert not is_pod_name("10-42-0-011" + SUFFIX) and not is_pod_name("10-42-0-256" + SUFFIX)
    assert not ALLOWED_PATH.fullmatch(ATTACH + "/") and not ALLOWED_PATH.fullmatch(ATTACH + ";x")


@pytest.mark.parametrize("version", ["1.0", "1.2", "2.0", "0.9"])
def test_every_version_but_http11_gets_426(version: str) -> None:
    """Found by these properties: HTTP/1.2 and HTTP/2.0 request lines used to be forwarded to the pod."""
    pod = "10-42-0-11" + SUFFIX
    decision = decide(RequestHead("GET", f"http://{pod}:8443{ATTACH}", http_version=version), ProxyPolicy())
    assert isinstance(decision, Reject) and (decision.status, decision.flag) == (426, "-")


def test_an_oversize_target_counts_toward_the_header_limit() -> None:
    """Found by the hostile batch: a 70 KiB query was forwarded; Envoy counts :path in its 60 KiB."""
    pod = "10-42-0-11" + SUFFIX
    target = f"http://{pod}:8443{ATTACH}?{'a' * MAX_HEADERS_BYTES}"
    decision = decide(RequestHead("GET", target), ProxyPolicy())
    assert isinstance(decision, Reject) and (decision.status, decision.flag) == (431, "DPE")


@pytest.mark.parametrize(
    "target",
    [
        "http://[",
        "http://]/x",
        f"http://10-42-0-11{SUFFIX}:84\t43{ATTACH}",
        f"\x00http://10-42-0-11{SUFFIX}:8443{ATTACH}",
        "http://a\u00e9/",
    ],
)
def test_malformed_targets_are_refused_not_crashed_on(target: str) -> None:
    """Found by the long fuzz run: "http://[" made urlsplit raise inside decide() (the front then dropped
    the connection with no answer); urlsplit also silently deletes tabs, which could re-spell a target."""
    decision = decide(RequestHead("GET", target), ProxyPolicy())
    assert isinstance(decision, Reject) and (decision.status, decision.flag) == (400, "DPE")


# Long run: 100,000 inputs ------------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.timeout(1800)  # 50,000 inputs take minutes; the suite's 120 s limit is for normal tests
@settings(max_examples=LONG_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(heads, policy)
def test_long_decide_fuzz(head: RequestHead, pol: ProxyPolicy) -> None:
    check_decision(head, pol)


@pytest.mark.long
@pytest.mark.timeout(1800)  # 50,000 inputs take minutes; the suite's 120 s limit is for normal tests
@settings(max_examples=LONG_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(wire)
def test_long_wire_fuzz(case: tuple[bytes, list[int], ProxyPolicy]) -> None:
    _check_wire_case(case)
