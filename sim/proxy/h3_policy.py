"""The HTTP/3 front's routing decision, as the rendered Envoy config (clusters.render.envoy_quic) makes it.

Pure: the decoded header list of one request stream and the workerDomain in, a decision out; the asyncio
front only moves bytes. The SNI counts only at the handshake (decide_sni): a name no filter chain covers
is refused there; after it, a worker may ask for any pod on any connection. Envoy's order of checks on a
stream:

1. The HTTP/3 codec (quiche, EnvoyQuicServerStream). A header list over ``max_request_headers_kb``
   (60 KiB, each field counted as name + value + 32, as QPACK counts it) or over ``max_headers_count``
   (100 fields) resets the stream with H3_EXCESSIVE_LOAD. A malformed request -- a pseudo-header
   missing, repeated, unknown or after a regular field; an upper-case or connection-specific field name;
   an empty or relative ``:path``; a CONNECT carrying ``:scheme`` or ``:path``; ``:protocol`` (extended
   CONNECT is off); a ``:method`` or ``:authority`` that is not a token or an authority -- resets the
   stream with H3_MESSAGE_ERROR (RFC 9114 section 4.1.2). Either way there is no HTTP response, the
   connection and its other streams live on, and the access log records the stream with flag DPE. (The
   codes are RFC 9114's; quiche may name some of these resets H3_GENERAL_PROTOCOL_ERROR. What a worker
   sees is the same: its stream reset, nothing forwarded.)
2. The route table. The virtual host is chosen by ``:authority`` (domains ``*.<wd>`` and ``*.<wd>:443``),
   then the one route: prefix ``/`` (a CONNECT has no path, so it never matches) and the header match
   ``^<dashed-ip>\\.<wd>(:443)?$`` on the raw ``:authority``, case-sensitive. No match: 404 ``NR``.
3. The pod. The Lua filter takes the dashed label of ``:authority`` and the dynamic forward proxy dials
   ``<label>.grpc-headless.nvcf.svc.cluster.local:10084``, the ``:authority`` the pod then sees
   (host_rewrite_header). Whether that name resolves, and answers, is decided at dial time (DF, UF).
4. The session. The connection pool picks the upstream session the stream goes on (``pick_session``):
   one with room among the pod's sessions, else a new one, else 503 ``UO`` (sim.proxy.h3_pool moves the bytes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dns.rule import dashed_ip, normalize_name, undash
from sim.proxy.policy import MAX_HEADERS_BYTES, MAX_HEADERS_COUNT, Forward, Reject
from sim.wire import GRPC_CALLBACK_PORT, GRPC_SUFFIX, PROXY_H3_PORT

H3_EXCESSIVE_LOAD = 0x107  # RFC 9114 section 8.1
H3_MESSAGE_ERROR = 0x10E
FIELD_OVERHEAD = 32  # RFC 9204 section 3.2.1: a field's size is its name, its value and 32
REGULAR = (":method", ":scheme", ":authority", ":path")  # every pseudo-header a plain request carries
CONNECTION_SPECIFIC = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}
TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 section 5.6.2
FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")  # a token, lower case (RFC 9114 section 4.2)
AUTHORITY = re.compile(r"[A-Za-z0-9\-._~%!$&'()*+,;=:@\[\]]+")  # what Envoy's authorityIsValid accepts
FORBIDDEN_VALUE = re.compile(r"[\x00\r\n]|^[ \t]|[ \t]$")


# -- the handshake -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PodRoute:
    pod_ip: str

    @property
    def upstream_name(self) -> str:
        return f"{dashed_ip(self.pod_ip)}.{GRPC_SUFFIX}"


@dataclass(frozen=True)
class Refusal:
    status: int  # 0: refuse the handshake itself
    flag: str
    reason: str


def decide_sni(sni: str | None, worker_domain: str) -> PodRoute | Refusal:
    """What the SNI names. Only a refused handshake (status 0) is acted on: once it succeeds, every request
    is routed on its own `:authority` (decide, below), whatever pod the SNI named."""
    name, domain = normalize_name(sni or ""), normalize_name(worker_domain) or ""
    if name is None or not name.endswith("." + domain):
        return Refusal(0, "NR", f"no filter chain matches server name {sni!r}")
    ip = undash(name[: -len(domain) - 1])
    if ip is None:
        return Refusal(404, "NR", "route_not_found")
    return PodRoute(ip)


@dataclass(frozen=True)
class H3Request:
    """One request stream's decoded field lines, in order (pseudo-headers first on a valid request)."""

    fields: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, headers: list[tuple[bytes, bytes]]) -> H3Request:
        return cls(tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers))

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.fields if k == name), None)


@dataclass(frozen=True)
class Reset:
    """A stream error: the stream is reset with `error_code`, no response; the connection lives on."""

    error_code: int
    flag: str
    reason: str


H3Decision = Forward | Reject | Reset


def upstream_name(pod_ip: str) -> str:
    return f"{pod_ip.replace('.', '-')}.{GRPC_SUFFIX}"


def limits_error(request: H3Request) -> Reset | None:
    if len(request.fields) > MAX_HEADERS_COUNT:
        return Reset(H3_EXCESSIVE_LOAD, "DPE", f"too many headers ({len(request.fields)})")
    size = sum(len(k) + len(v) + FIELD_OVERHEAD for k, v in request.fields)
    if size > MAX_HEADERS_BYTES:
        return Reset(H3_EXCESSIVE_LOAD, "DPE", f"headers too large ({size} bytes)")
    return None


def field_error(request: H3Request) -> str | None:
    """RFC 9114 section 4.2 and 4.3 on each field line; the reason a stream is malformed, if it is."""
    seen: set[str] = set()
    regular = False
    for name, value in request.fields:
        if FORBIDDEN_VALUE.search(value):
            return f"invalid value in {name!r}"
        if not name.startswith(":"):
            regular = True
            if not FIELD_NAME.fullmatch(name):
                return f"invalid header name {name!r}"
            if name in CONNECTION_SPECIFIC or (name == "te" and value.lower() != "trailers"):
                return f"connection-specific header {name!r}"
            continue
        if regular:
            return f"pseudo-header {name!r} after a regular header"
        if name not in REGULAR:
            return f"pseudo-header {name!r} is not allowed"  # :protocol included: extended CONNECT is off
        if name in seen:
            return f"pseudo-header {name!r} repeated"
        seen.add(name)
    return None


def message_error(request: H3Request) -> str | None:
    """The codec's checks of the request as a whole: pseudo-headers present and well formed."""
    error = field_error(request)
    if error is not None:
        return error
    present = {name for name, _ in request.fields if name.startswith(":")}
    method = request.get(":method")
    if method is None or not TOKEN.fullmatch(method):
        return "missing or invalid :method"
    authority = request.get(":authority")
    if method == "CONNECT":  # RFC 9114 section 4.4: only :method and :authority
        if present != {":method", ":authority"}:
            return "CONNECT with :scheme or :path"
    elif missing := [name for name in REGULAR if name not in present]:
        return f"missing pseudo-header {', '.join(missing)}"
    if not authority or not AUTHORITY.fullmatch(authority):
        return "missing or invalid :authority"
    path = request.get(":path")
    if path is not None and not (path.startswith("/") or (path == "*" and method == "OPTIONS")):
        return "invalid :path"
    return None


def route(request: H3Request, worker_domain: str) -> Forward | Reject:
    """The rendered route: prefix "/" and :authority exactly <dashed-ip>.<workerDomain>, port 443 at most."""
    authority, path = request.get(":authority") or "", request.get(":path")
    if path is None or not path.startswith("/"):
        return Reject(404, "NR", "route_not_found: no path (CONNECT) or not under /")
    host, _, port = authority.partition(":")
    label, dot, domain = host.partition(".")
    if (":" in authority and port != str(PROXY_H3_PORT)) or not dot or domain != worker_domain:
        return Reject(404, "NR", f"route_not_found: authority {authority!r}")
    ip = undash(label)
    if ip is None:
        return Reject(404, "NR", f"route_not_found: {label!r} is not a dashed pod IP")
    return Forward(host=upstream_name(ip), port=GRPC_CALLBACK_PORT, path=path, tls=True)


def decide(request: H3Request, worker_domain: str) -> H3Decision:
    limits = limits_error(request)
    if limits is not None:
        return limits
    error = message_error(request)
    if error is not None:
        return Reset(H3_MESSAGE_ERROR, "DPE", error)
    return route(request, worker_domain)


# -- the upstream pool ---------------------------------------------------------------------------------------
# Envoy's HTTP/3 connection pool to a host, as the rendered cluster leaves it (no limits set, so its defaults):
# a session carries at most quic_protocol_options.max_concurrent_streams (100) streams, and fewer if the pod's
# MAX_STREAMS allows fewer; a stream no session has room for opens a new session, up to the cluster's circuit
# breaker max_connections (1024), counted over every pod.
MAX_CONCURRENT_STREAMS = 100
MAX_CONNECTIONS = 1024


@dataclass(frozen=True)
class SessionLoad:
    """One pooled session as the pool sees it."""

    active: int  # request streams that chose it and have not finished (a dial in progress counts its own)
    peer_credit: int | None = None  # more streams the pod's MAX_STREAMS lets it open; None while dialing


@dataclass(frozen=True)
class UseSession:
    index: int


@dataclass(frozen=True)
class OpenSession:
    pass


@dataclass(frozen=True)
class Overflow:
    """No session has room and the circuit breaker allows no more: Envoy's 503 UO."""

    reason: str


PoolDecision = UseSession | OpenSession | Overflow


def room(load: SessionLoad, max_streams: int = MAX_CONCURRENT_STREAMS) -> int:
    """How many more streams a session takes: Envoy's limit, and the pod's, whichever is lower."""
    left = max_streams - load.active
    return left if load.peer_credit is None else min(left, load.peer_credit)


def pick_session(
    sessions: Sequence[SessionLoad],
    open_in_cluster: int,
    max_streams: int = MAX_CONCURRENT_STREAMS,
    max_connections: int = MAX_CONNECTIONS,
) -> PoolDecision:
    """The session a new stream to one pod goes on: the oldest with room, else a new one if the breaker lets
    it. (Envoy would hold the stream as pending while max_pending_requests allows; ncpsim answers UO at once.)"""
    for index, load in enumerate(sessions):
        if room(load, max_streams) > 0:
            return UseSession(index)
    if open_in_cluster >= max_connections:
        return Overflow(f"{open_in_cluster} upstream connections open, max_connections is {max_connections}")
    return OpenSession()
