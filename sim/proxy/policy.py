"""The worker callback proxy's routing decision, as Envoy's listener, HCM and route table would make it.

Pure: a parsed request head and the policy in, a decision out. The asyncio front only moves bytes.
The order of checks follows Envoy: codec-level protocol errors first (400/426/431/501, flag DPE),
then the route table (404 NR when nothing matches), then the upstream (UF/DF, decided at dial time).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.utils import formatdate
from functools import lru_cache
from itertools import chain
from urllib.parse import urlsplit

from dns.rule import undash
from sim.wire import (
    ATTACH_PATH,
    CONNECT_TIMEOUT,
    INVOCATION_SUFFIX,
    INVOCATION_TLS_PORT,
    LOCAL_FAILURE,
    REMOTE_FAILURE,
    TLS_VERIFY_FAILED,
    invocation_port,
    reset_body,
)

CALLBACK_PATH = ATTACH_PATH
POD_SUFFIX = "." + INVOCATION_SUFFIX
MAX_HEADERS_BYTES = 60 * 1024  # Envoy max_request_headers_kb default
MAX_HEADERS_COUNT = 100  # Envoy max_headers_count default
VISIBLE_ASCII = re.compile(r"[!-~]+")


@dataclass(frozen=True)
class ProxyPolicy:
    upstream_tls: bool = True
    connect_enabled: bool = False

    @property
    def upstream_port(self) -> int:
        return invocation_port(self.upstream_tls)


@dataclass(frozen=True)
class RequestHead:
    method: str
    target: str
    http_version: str = "1.1"
    headers: tuple[tuple[str, str], ...] = ()
    # Every Content-Length field line as the client sent it. h11 folds repeats of one value into one
    # header before we see the request, where Envoy's codec refuses any repeat; None: take `headers`.
    content_lengths: tuple[str, ...] | None = None

    # Each field's values under its lower-case name, made once: the checks ask for several.
    _by_name: dict[str, list[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, list[str]] = {}
        for k, v in self.headers:
            by_name.setdefault(k.lower(), []).append(v)
        object.__setattr__(self, "_by_name", by_name)

    def header(self, name: str) -> str | None:
        values = self._by_name.get(name)
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        return list(self._by_name.get(name, ()))


@dataclass(frozen=True)
class Forward:
    host: str  # pod name, e.g. 10-42-0-11.invocation.nvcf.svc.cluster.local
    port: int
    path: str  # origin-form, query kept
    tls: bool  # re-encrypt to the pod (SNI and SAN check = host)

    authority: str = field(init=False, repr=False, compare=False)  # host:port, made once

    def __post_init__(self) -> None:
        object.__setattr__(self, "authority", f"{self.host}:{self.port}")


@dataclass(frozen=True)
class Tunnel:
    host: str
    port: int


@dataclass(frozen=True)
class Reject:
    status: int
    flag: str  # Envoy response flag: NR, DPE, ...
    reason: str
    close: bool = False  # protocol errors end the connection, as Envoy's codec does


Decision = Forward | Tunnel | Reject


def pod_host(authority: str, port: int) -> str | None:
    """The pod name if `authority` is exactly <dashed-ip>.invocation.nvcf.svc.cluster.local:<port>."""
    host, sep, port_text = authority.rpartition(":")
    if not sep or port_text != str(port):
        return None
    if host != host.lower() or not host.endswith(POD_SUFFIX):
        return None
    label = host[: -len(POD_SUFFIX)]
    return host if undash(label) is not None else None


def protocol_error(head: RequestHead) -> Reject | None:
    """Codec checks Envoy makes before routing."""
    if head.http_version != "1.1":
        # Envoy's HTTP/1 codec treats every version but 1.1 as HTTP/1.0 ("basically anything which is not
        # HTTP/1.1") and refuses HTTP/1.0 with 426; HTTP/1.2 or HTTP/2.0 must never reach a pod.
        return Reject(426, "-", f"HTTP/{head.http_version} is not allowed", close=True)
    if not head.method.isupper():
        # Methods are case-sensitive tokens; Envoy's codec refuses `get` rather than forward it.
        return Reject(400, "DPE", f"invalid method {head.method!r}", close=True)
    transfer = [v.strip().lower() for v in head.all("transfer-encoding")]
    lengths = head.all("content-length") if head.content_lengths is None else list(head.content_lengths)
    if transfer and lengths:
        return Reject(400, "DPE", "Content-Length with Transfer-Encoding", close=True)
    if transfer and transfer != ["chunked"]:
        return Reject(501, "DPE", "unsupported Transfer-Encoding", close=True)
    if len(lengths) > 1 or any("," in v for v in lengths):
        return Reject(400, "DPE", "duplicate Content-Length", close=True)
    if head.method == "CONNECT" and (transfer or any(v.strip() != "0" for v in lengths)):
        # A CONNECT body has no meaning (RFC 9110 9.3.6); Envoy's codec refuses one rather than tunnel it.
        return Reject(400, "DPE", "CONNECT with a body", close=True)
    if len(head.headers) > MAX_HEADERS_COUNT:
        return Reject(431, "DPE", "too many headers", close=True)
    # Envoy's limit counts the header map, which holds the request target as :path (or :authority), so a
    # 70 KiB query is as oversize as a 70 KiB header.
    size = len(head.method) + len(head.target) + sum(map(len, chain.from_iterable(head.headers)))
    size += 4 * len(head.headers)  # ": " and CRLF
    if size > MAX_HEADERS_BYTES:
        return Reject(431, "DPE", "headers too large", close=True)
    if not VISIBLE_ASCII.fullmatch(head.target):
        # RFC 9112's request-target is visible ASCII and Envoy's codec refuses anything else; checking here
        # also stops urlsplit from silently dropping tabs or leading control bytes before routing.
        return Reject(400, "DPE", "invalid character in request target", close=True)
    if "#" in head.target:
        return Reject(400, "DPE", "fragment in request target", close=True)
    return None


def expects_continue(head: RequestHead) -> bool:
    """Envoy answers `Expect: 100-continue` itself (100 Continue, before routing) and strips the header."""
    return (head.header("expect") or "").strip().lower() == "100-continue"


def has_body(head: RequestHead) -> bool:
    """Does a body follow the head? Envoy's codec then delivers the head without end of stream, so a reply
    sent at once (a local reply) goes out before the request is complete: Envoy closes the HTTP/1.1
    connection after it (Connection: close) rather than read the rest."""
    if head.all("transfer-encoding"):
        return True
    length = head.header("content-length")
    return length is not None and length.strip().isdigit() and int(length) > 0


def raw_field_values(raw_head: bytes, name: str) -> tuple[str, ...]:
    """The value of every `name` field line in a raw request head, as sent (no folding of repeats)."""
    wanted = name.lower().encode() + b":"
    values = []
    for line in raw_head.split(b"\n")[1:]:
        line = line.rstrip(b"\r")
        if not line:
            break  # the end of the head: what follows is body
        if line[: len(wanted)].lower() == wanted:
            values.append(line[len(wanted) :].strip().decode("latin-1"))
    return tuple(values)


def with_host_from_url(raw_head: bytes) -> bytes | None:
    """An absolute-form request head without Host, with `Host: <authority of the URL>` added.

    Envoy takes :authority from an absolute URL and forwards such a request; h11 refuses an HTTP/1.1
    request without Host. None when the head is anything else (h11's refusal then stands)."""
    line, sep, rest = raw_head.partition(b"\n")
    parts = line.rstrip(b"\r").split(b" ")
    if not sep or len(parts) != 3 or parts[1][:7].lower() != b"http://" or raw_field_values(raw_head, "host"):
        return None
    try:
        authority = urlsplit(parts[1].decode("latin-1")).netloc
    except ValueError:
        return None
    if not authority or not VISIBLE_ASCII.fullmatch(authority):
        return None
    return line + sep + b"Host: " + authority.encode("latin-1") + b"\r\n" + rest


def route_forward(head: RequestHead, policy: ProxyPolicy) -> Decision:
    """Absolute-form http:// request to a pod name on the worker port, callback path only.

    The answer depends on the target alone, and workers ask for the same few (one per pod) again and again:
    answers for targets of a callback's size are kept (a bounded number of short ones, so a flood of long
    distinct targets costs no memory)."""
    if len(head.target) <= KEPT_TARGET:
        return _kept_route(head.target, policy)
    return route_target(head.target, policy)


KEPT_TARGET = 256  # characters: a pod target with the callback path and a short query


def route_target(target: str, policy: ProxyPolicy) -> Decision:
    # Envoy's HTTP/1 codec lower-cases an absolute URL's scheme before routing: HTTP:// is http://.
    if target[:7].lower() != "http://":
        return Reject(404, "NR", "not an absolute http:// target")
    try:
        parts = urlsplit(target)
    except ValueError:  # "http://[": Envoy's URL parser refuses it too (400, invalid_url)
        return Reject(400, "DPE", "invalid URL in request target", close=True)
    if parts.username is not None or parts.password is not None:
        return Reject(400, "DPE", "user-info in request target", close=True)
    host = pod_host(parts.netloc, policy.upstream_port)
    if host is None:
        return Reject(404, "NR", f"no route for authority {parts.netloc}")
    if parts.path != CALLBACK_PATH:
        return Reject(404, "NR", f"no route for path {parts.path or '/'}")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return Forward(host=host, port=policy.upstream_port, path=path, tls=policy.upstream_tls)


_kept_route = lru_cache(maxsize=4096)(route_target)


def route_connect(head: RequestHead, policy: ProxyPolicy) -> Decision:
    if not policy.connect_enabled:
        return Reject(404, "NR", "CONNECT is disabled")
    host = pod_host(head.target, INVOCATION_TLS_PORT)
    if host is None:
        return Reject(404, "NR", f"no route for CONNECT {head.target}")
    return Tunnel(host=host, port=INVOCATION_TLS_PORT)


def decide(head: RequestHead, policy: ProxyPolicy) -> Decision:
    error = protocol_error(head)
    if error is not None:
        return error
    if head.method == "CONNECT":
        return route_connect(head, policy)
    return route_forward(head, policy)


# -- what Envoy says when the pod could not be reached, and when it answers itself -----------------
# quiche closes a QUIC handshake whose certificate the verifier refused with its default alert,
# certificate_unknown; the SSL error stack newer quiche appends to these details is not modelled.
QUIC_CERT_REFUSED = "QUIC_TLS_CERTIFICATE_UNKNOWN with details: TLS handshake failure (ENCRYPTION_HANDSHAKE) 46: certificate unknown"


def upstream_reset(failure: str, detail: str = "") -> str:
    """The body of Envoy's 503 UF when its connection to a pod failed. `failure`: refused (nothing listens),
    unreachable (no route), timeout (no answer within connect_timeout), tls (the pod's certificate was
    refused; `detail`, the validator's words, e.g. "verify cert failed: verify SAN list"), quic-tls (the
    same over QUIC), quic (a QUIC session that ended before it was up)."""
    if failure == "refused":
        return reset_body(REMOTE_FAILURE, "delayed connect error: Connection refused")
    if failure == "unreachable":
        return reset_body(REMOTE_FAILURE, "delayed connect error: No route to host")
    if failure == "timeout":
        return reset_body(CONNECT_TIMEOUT)
    if failure == "tls":
        return reset_body(
            REMOTE_FAILURE, f"{TLS_VERIFY_FAILED}{':' + detail if detail else ''}:TLS_error_end"
        )
    if failure == "quic-tls":
        return reset_body(LOCAL_FAILURE, QUIC_CERT_REFUSED)
    return reset_body(REMOTE_FAILURE)


def http_date(epoch: float) -> str:
    """The Date header Envoy's connection manager puts on every response it sends (IMF-fixdate, GMT)."""
    return _date_of_second(int(epoch))


@lru_cache(maxsize=2)
def _date_of_second(second: int) -> str:
    # IMF-fixdate names whole seconds; like Envoy's date provider, write it once a second, not per response.
    return formatdate(second, usegmt=True)
