"""The words a Go worker logs when a callback fails: worker-utils on net/http, crypto/tls and quic-go.

Customers paste these lines into tickets, so simulated workers speak them (DESIGN.md, "No silent green");
ncpsim's own account of the failure stays beside them in the events (`cause`). Pure: what the worker was
doing and what went wrong in, Go's line out. The texts follow Go's error types:

- net.DNSError: `lookup NAME on SERVER: no such host` (NXDOMAIN, and NOERROR without an A record),
  `server misbehaving` (SERVFAIL, REFUSED, ...), `i/o timeout` (no answer in time).
- net.OpError from a dial: `dial tcp ADDR: connect: connection refused`, `...: connect: no route to host`;
  a name that did not resolve has no address yet: `dial tcp: lookup ...`.
- net/http: a failure dialing or handshaking with the forward proxy is `proxyconnect tcp: ...`, and the
  request's error is url.Error, `Get "URL": ...`; a CONNECT answered otherwise than 200 is the status text.
- crypto/tls: `tls: failed to verify certificate: ` and crypto/x509's reason. x509's Verify checks the
  leaf's validity period, then the host name, then the chain (OpenSSL checks the chain first), so a
  certificate both expired and for other names reports the expiry, as Go does.
- quic-go: a local TLS failure is `CRYPTO_ERROR 0x12a (local): tls: ...` (0x100 + bad_certificate, the
  alert crypto/tls sends on any verification failure); a peer that never answers, `timeout: no recent
  network activity` (its handshake idle timeout; ICMP port unreachable is ignored on UDP).
- worker-utils (worker/httpstream, libraries/go/worker): `failed to send GET request: ...`, `GET request
  failed with status code N: BODY`, `unexpected status N from CONNECT proxy: BODY`, and for a
  NVCF_PROXY_CA_PEM with no certificate, `ca: no valid PEM certs in $NVCF_PROXY_CA_PEM`.
"""

from __future__ import annotations

import ipaddress
import json
import re
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from certs.inspect import is_ip
from dns.client import NameNotResolved
from sim.model.netmap import Unreachable

UNKNOWN_AUTHORITY = "x509: certificate signed by unknown authority"
VERIFY_FAILED = "tls: failed to verify certificate: "
QUIC_IDLE = "timeout: no recent network activity"
CANCELED = "context canceled"  # worker-utils cancels a GET that has no answer after 5 s
PROXY_CA_ENV = "NVCF_PROXY_CA_PEM"
NO_PROXY_CA = f"ca: no valid PEM certs in ${PROXY_CA_ENV}"
BAD_CERTIFICATE = 42  # the TLS alert crypto/tls sends when verification fails
DNS_REASONS = {"NXDOMAIN": "no such host", "NODATA": "no such host", "TIMEOUT": "i/o timeout"}
# OpenSSL's reasons for a handshake the peer refused or that was no TLS at all, as crypto/tls words them.
TLS_ALERTS = {
    "TLSV1_UNRECOGNIZED_NAME": "remote error: tls: unrecognized name",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "remote error: tls: handshake failure",
    "TLSV1_ALERT_INTERNAL_ERROR": "remote error: tls: internal error",
    "TLSV1_ALERT_PROTOCOL_VERSION": "remote error: tls: protocol version not supported",
    "TLSV1_ALERT_NO_APPLICATION_PROTOCOL": "remote error: tls: no application protocol",
    "WRONG_VERSION_NUMBER": "tls: first record does not look like a TLS handshake",
}


# -- the certificate as crypto/x509 reads it ------------------------------------------------------
@dataclass(frozen=True)
class Leaf:
    """What Go's x509 looks at in the served leaf certificate."""

    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    common_name: str = ""
    has_san: bool = True
    not_before: datetime | None = None
    not_after: datetime | None = None

    @classmethod
    def of(cls, cert: x509.Certificate) -> Leaf:
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            san = None
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return cls(
            dns_names=tuple(san.get_values_for_type(x509.DNSName)) if san else (),
            ip_addresses=tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress)) if san else (),
            common_name=str(names[0].value) if names else "",
            has_san=san is not None,
            not_before=cert.not_valid_before_utc,
            not_after=cert.not_valid_after_utc,
        )

    @classmethod
    def from_pem(cls, pem: str | bytes) -> Leaf:
        return cls.of(x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem))


def go_time(moment: datetime) -> str:
    """time.RFC3339 in UTC, as Go prints certificate times (a pod's clock is UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def matches_hostname(pattern: str, host: str) -> bool:
    """crypto/x509's matchHostnames: a `*` left-most label stands for exactly one label."""
    pattern, host = pattern.lower(), host.lower().removesuffix(".")
    if not pattern or not host:
        return False
    want, got = pattern.split("."), host.split(".")
    if len(want) != len(got):
        return False
    return all((i == 0 and part == "*") or part == got[i] for i, part in enumerate(want))


def hostname_error(host: str, leaf: Leaf) -> str:
    """x509.HostnameError's text: the names the certificate is valid for, and the one that was wanted."""
    if not leaf.has_san and matches_hostname(leaf.common_name, host):
        return "x509: certificate relies on legacy Common Name field, use SANs instead"
    if is_ip(host):
        if not leaf.ip_addresses:
            return f"x509: cannot validate certificate for {host} because it doesn't contain any IP SANs"
        valid = ", ".join(leaf.ip_addresses)
    else:
        valid = ", ".join(leaf.dns_names)
    if not valid:
        return f"x509: certificate is not valid for any names, but wanted to match {host}"
    return f"x509: certificate is valid for {valid}, not {host}"


def covers(leaf: Leaf, host: str) -> bool:
    """Certificate.VerifyHostname's verdict."""
    if is_ip(host):
        return any(ipaddress.ip_address(ip) == ipaddress.ip_address(host) for ip in leaf.ip_addresses)
    return any(matches_hostname(name, host) for name in leaf.dns_names)


def x509_reason(host: str, leaf: Leaf | None, now: datetime, chain_reason: str = UNKNOWN_AUTHORITY) -> str:
    """Why Go's x509.Verify refuses `leaf` for `host` at `now`, in the order Go checks; `chain_reason` is the
    verdict on the chain once the leaf itself passed (the TLS stack that ran the handshake said the chain
    failed)."""
    if leaf is not None:
        if leaf.not_before is not None and now < leaf.not_before:
            return _expired(f"current time {go_time(now)} is before {go_time(leaf.not_before)}")
        if leaf.not_after is not None and now > leaf.not_after:
            return _expired(f"current time {go_time(now)} is after {go_time(leaf.not_after)}")
        if not covers(leaf, host):
            return hostname_error(host, leaf)
    return chain_reason


def _expired(detail: str) -> str:
    return f"x509: certificate has expired or is not yet valid: {detail}"


# -- NVCF_PROXY_CA_PEM, as ca.ProxyCAs reads it ----------------------------------------------------
PEM_BLOCK = re.compile(r"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.DOTALL)


def proxy_ca_certs(pem: str) -> str:
    """The certificates x509.CertPool.AppendCertsFromPEM takes from `pem` (other blocks and certificates it
    cannot parse are skipped), as PEM; "" when there are none."""
    good = []
    for block in PEM_BLOCK.findall(pem):
        try:
            good.append(x509.load_pem_x509_certificate(block.encode()).public_bytes(Encoding.PEM).decode())
        except ValueError:
            continue
    return "".join(good)


# -- what the worker was doing, and the line for each failure ------------------------------------
@dataclass(frozen=True)
class Dial:
    """One dial of a worker: the name it resolves and verifies, and where it goes.

    `url`/`method`: the HTTP request the dial serves (net/http wraps the error as url.Error); empty for
    the gRPC callback's QUIC dial, whose error worker-utils logs as it is. `proxied`: net/http dials the
    forward proxy (proxyconnect). `addr`: the virtual ip:port, once resolved. `dns_server`: the cluster
    DNS Service, ip:53."""

    host: str
    dns_server: str
    addr: str = ""
    method: str = ""
    url: str = ""
    proxied: bool = False
    quic: bool = False


def dns_error(name: str, server: str, rcode: str) -> str:
    return f"lookup {name} on {server}: {DNS_REASONS.get(rcode, 'server misbehaving')}"


def url_error(method: str, url: str, err: str) -> str:
    """url.Error: the method as net/http capitalises it, the URL quoted."""
    return f'{method[:1].upper()}{method[1:].lower()} "{url}": {err}'


def tcp_dial_error(dial: Dial, exc: BaseException) -> str:
    """The net.OpError of a TCP dial that failed before TLS."""
    if isinstance(exc, NameNotResolved):
        return f"dial tcp: {dns_error(exc.name, dial.dns_server, exc.rcode)}"
    if isinstance(exc, TimeoutError):
        return f"dial tcp {dial.addr}: i/o timeout"
    if isinstance(exc, Unreachable):
        return f"dial tcp {dial.addr}: connect: no route to host"
    return f"dial tcp {dial.addr}: connect: connection refused"


def tls_error(dial: Dial, exc: ssl.SSLError, now: datetime) -> str:
    """crypto/tls's error for a handshake Python's ssl refused or that failed."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        chain = getattr(exc, "peer_chain", None) or []
        leaf = Leaf.from_pem(chain[0]) if chain else None
        return VERIFY_FAILED + x509_reason(dial.host, leaf, now, _chain_reason(exc, dial.host, leaf))
    if isinstance(exc, ssl.SSLEOFError):
        return "EOF"
    return TLS_ALERTS.get(str(getattr(exc, "reason", "") or ""), "remote error: tls: handshake failure")


def _chain_reason(exc: ssl.SSLCertVerificationError, host: str, leaf: Leaf | None) -> str:
    if exc.verify_code == 62 and leaf is None:  # a name mismatch Python saw without the certificate
        return f"x509: certificate is not valid for any names, but wanted to match {host}"
    return UNKNOWN_AUTHORITY


def http_dial_line(dial: Dial, exc: BaseException, now: datetime) -> str:
    """What worker-utils logs when a callback leg's connection could not be made (DNS, TCP or TLS)."""
    if isinstance(exc, TimeoutError) and dial.method == "GET":
        err = CANCELED  # worker-utils gives the GET 5 s, then cancels its context
        return f"failed to send GET request: {url_error(dial.method, dial.url, err)}"
    err = tls_error(dial, exc, now) if isinstance(exc, ssl.SSLError) else tcp_dial_error(dial, exc)
    if dial.proxied:
        err = f"proxyconnect tcp: {err}"
    return f"failed to send {dial.method} request: {url_error(dial.method, dial.url, err)}"


def leg_status_line(method: str, status: int, body: str) -> str:
    """worker-utils' error for a callback leg answered otherwise than 200 (the body cut at 1 KiB)."""
    return f"{method} request failed with status code {status}: {body[:1024]}"


def leg_broken_line(method: str, url: str, why: str) -> str:
    """A callback leg whose connection broke before its whole answer: net/http's words for `why`
    ("closed": nothing came back; "cut": the body ended early; "malformed"; "timeout")."""
    err = {
        "closed": "EOF",
        "cut": "unexpected EOF",
        "malformed": "net/http: HTTP/1.x transport connection broken: malformed HTTP response",
        "timeout": CANCELED,
    }[why]
    return f"failed to send {method} request: {url_error(method, url, err)}"


def connect_status_line(method: str, url: str, status: int) -> str:
    """A legacy worker's CONNECT answered otherwise than 200: net/http returns the status text."""
    from http import HTTPStatus

    try:
        text = HTTPStatus(status).phrase
    except ValueError:
        text = "unknown status code"
    return f"failed to send {method} request: {url_error(method, url, text)}"


# -- quic-go --------------------------------------------------------------------------------------
def quic_crypto_error(alert: int, message: str, remote: bool = False) -> str:
    """quic-go's TransportError for a TLS alert: CRYPTO_ERROR 0x1XX (local|remote): message."""
    return f"CRYPTO_ERROR {0x100 + alert:#x} ({'remote' if remote else 'local'}): {message}"


def quic_dial_line(
    dial: Dial, exc: BaseException, now: datetime, *, leaf: Leaf | None = None, alert: int | None = None
) -> str:
    """What the worker library logs when its QUIC dial to the proxy failed (the dial error as it is).

    `leaf`: the certificate the proxy showed, when the handshake got that far; `alert`: the TLS alert of
    a handshake the proxy refused (remote)."""
    if isinstance(exc, NameNotResolved):
        return dns_error(exc.name, dial.dns_server, exc.rcode)
    if alert is not None:  # the proxy (Envoy's quiche) refused the ClientHello; quic-go prints its details
        details = f"TLS handshake failure (ENCRYPTION_INITIAL) {alert}: {_alert_name(alert)}"
        return quic_crypto_error(alert, details, remote=True)
    if leaf is not None or getattr(exc, "certificate_rejected", False):
        return quic_crypto_error(BAD_CERTIFICATE, VERIFY_FAILED + x509_reason(dial.host, leaf, now))
    return QUIC_IDLE  # no route, nothing listening, packets dropped: quic-go hears nothing and gives up


def _alert_name(alert: int) -> str:
    return {112: "unrecognized name", 40: "handshake failure", 80: "internal error"}.get(alert, "alert")


def quic_status_line(status: int, body: str) -> str:
    return f"unexpected status {status} from CONNECT proxy: {body}"


def zap_error(ts: float, msg: str, error: str, request_id: str, worker: str) -> str:
    """worker-utils' log line for a request it failed (zap's production JSON). One worker host logs for
    many worker pods, so the line also names the pod (`worker`), which a pod's own log would not."""
    return json.dumps(
        {"level": "error", "ts": ts, "msg": msg, "error": error, "req id": request_id, "worker": worker}
    )
