"""SSL contexts from Secret-shaped folders, reloaded when the Secret is swapped.

Kubernetes swaps a Secret volume by re-pointing its `..data` symlink; Envoy's file-based SDS notices
and uses the new material for new handshakes. ReloadingContext does the same: it checks the folder's
`..data` target (or the files' mtimes) on each use, builds a fresh context on change, and keeps the
old one, logging the error, when the new files are broken.
"""

from __future__ import annotations

import errno
import os
import ssl
from collections.abc import Callable
from pathlib import Path


def server_context(secret_dir: Path, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(secret_dir / "tls.crt", secret_dir / "tls.key")
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


class PeerChainKept(ssl.SSLObject):
    """An SSLObject that keeps, on a failed verification, the certificates the peer sent: the error gets
    them as `peer_chain` (PEM, leaf first). Go's x509 words for the failure name what the certificate is
    valid for and when it expired, which OpenSSL's error does not say (sim.protocols.go_errors).
    get_unverified_chain is private on Python 3.11 (public from 3.13); tests/test_go_errors.py guards it."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except ssl.SSLCertVerificationError as exc:
            chain = self._sslobj.get_unverified_chain() or []  # type: ignore[attr-defined]
            exc.peer_chain = [cert.public_bytes() for cert in chain]  # type: ignore[attr-defined]
            raise


def client_context(
    cafiles: list[Path],
    extra_pem: str = "",
    alpn: tuple[str, ...] = ("http/1.1",),
    check_hostname: bool = True,
    keep_peer_chain: bool = False,
) -> ssl.SSLContext:
    """A client that trusts exactly `cafiles` (and an extra PEM, as NVCF_PROXY_CA_PEM) and nothing else.
    Names are checked against subjectAltName only, as Go's crypto/x509 and Envoy do (no CN fallback).
    `keep_peer_chain`: a failed verification carries the peer's certificates (PeerChainKept)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.hostname_checks_common_name = False
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    if keep_peer_chain:
        ctx.sslobject_class = PeerChainKept
    # No cafiles and no PEM is a worker that trusts nothing: every handshake fails verification.
    for path in cafiles:
        ctx.load_verify_locations(cafile=str(path))
    if extra_pem.strip():
        ctx.load_verify_locations(cadata=extra_pem)
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx


SECRET_FILES = ("tls.crt", "tls.key", "ca.crt")
ABSENT = (errno.ENOENT, errno.ENOTDIR)  # what pathlib's exists() and is_symlink() take for "no such file"


def secret_stamp(secret_dir: Path) -> tuple:
    """What changes when a Secret is swapped: the ..data target, else the files' mtimes. Asked before every
    handshake and pooled request, so one system call a file and no pathlib: four where it made seven."""
    folder = os.fspath(secret_dir)
    try:
        return ("link", os.readlink(os.path.join(folder, "..data")))
    except OSError as exc:
        if exc.errno not in ABSENT + (errno.EINVAL,):  # EINVAL: there, but not a symlink
            raise
    stamp = []
    for name in SECRET_FILES:
        try:
            stamp.append((name, os.stat(os.path.join(folder, name)).st_mtime_ns))
        except OSError as exc:
            if exc.errno not in ABSENT:
                raise
    return tuple(stamp)


class ReloadingContext:
    """An SSLContext rebuilt by `factory(secret_dir)` whenever the Secret changes."""

    def __init__(
        self,
        secret_dir: Path,
        factory: Callable[[Path], ssl.SSLContext],
        on_error: Callable[[str], object] = lambda msg: None,
    ):
        self.secret_dir = secret_dir
        self.factory = factory
        self.on_error = on_error
        self._stamp = secret_stamp(secret_dir)
        self._ctx = factory(secret_dir)  # broken material at start-up is a hard error
        self._reported: tuple | None = None  # the stamp whose failure was last logged
        self.generation = 1

    def current(self) -> ssl.SSLContext:
        try:
            stamp = secret_stamp(self.secret_dir)
        except OSError as exc:
            self.on_error(f"cannot read {self.secret_dir}: {exc}; keeping the previous certificate")
            return self._ctx
        if stamp != self._stamp:
            try:
                self._ctx = self.factory(self.secret_dir)
            except (OSError, ssl.SSLError, ValueError) as exc:
                # Not marked as seen: a read that raced the next swap is retried on the next handshake,
                # and truly broken files keep the old material (logged once per version).
                if self._reported != stamp:
                    self._reported = stamp
                    self.on_error(f"cannot load {self.secret_dir}: {exc}; keeping the previous certificate")
                return self._ctx
            self._stamp = stamp
            self.generation += 1
        return self._ctx

    def sni_switcher(self) -> ssl.SSLContext:
        """A listener context whose handshakes switch to the current material (via the SNI callback)."""
        base = self.factory(self.secret_dir)

        def pick(sock: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            sock.context = self.current()

        base.sni_callback = pick
        return base
