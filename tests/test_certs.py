"""Profiles, issuance, the three CAs and the wildcard rule, checked with cryptography, ssl and openssl."""

from __future__ import annotations

import shutil
import socket
import ssl
import stat
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from certs import inspect
from certs.profiles import (
    FRONTEND_SECRET,
    GRPC_SECRET,
    INVOCATION_SECRET,
    PUBLIC,
    PUBLIC_FRONTEND_SECRET,
    STACK,
    Profile,
    frontend_profile,
    grpc_profile,
    invocation_profile,
    stack_profiles,
)
from certs.store import CertStore, describe_text
from sim.errors import ConfigError

WD = "grpc-worker.example.com"
SHORT_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def issued(tmp_path_factory: pytest.TempPathFactory) -> CertStore:
    """One store with every stack profile issued; read-only for the tests that use it."""
    store = CertStore(tmp_path_factory.mktemp("certs"))
    store.ensure_cas()
    for profile in stack_profiles(WD):
        store.issue(profile)
    return store


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- profiles -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("profile", "secret", "identities", "issuer"),
    [
        (frontend_profile(WD), FRONTEND_SECRET, (f"*.{WD}",), STACK),
        (frontend_profile(WD, PUBLIC), PUBLIC_FRONTEND_SECRET, (f"*.{WD}",), PUBLIC),
        (frontend_profile("W.Example.org."), FRONTEND_SECRET, ("*.w.example.org",), STACK),
        (frontend_profile(WD, PUBLIC, secret="my-tls"), "my-tls", (f"*.{WD}",), PUBLIC),
        (invocation_profile(), INVOCATION_SECRET, ("*.invocation.nvcf.svc.cluster.local",), STACK),
        (grpc_profile(), GRPC_SECRET, ("*.grpc-headless.nvcf.svc.cluster.local",), STACK),
    ],
)
def test_profiles(profile: Profile, secret: str, identities: tuple[str, ...], issuer: str) -> None:
    assert (profile.secret, profile.identities, profile.issuer) == (secret, identities, issuer)


def test_stack_profiles_cover_every_secret() -> None:
    profiles = stack_profiles(WD)
    secrets = [FRONTEND_SECRET, INVOCATION_SECRET, GRPC_SECRET, PUBLIC_FRONTEND_SECRET]
    assert [p.secret for p in profiles] == secrets
    assert [p.issuer for p in profiles] == [STACK, STACK, STACK, PUBLIC]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Profile("x", ("a.b",), "letsencrypt"),
        lambda: Profile("x", (), STACK),
        lambda: frontend_profile(""),
        lambda: frontend_profile(WD, "openbao"),
    ],
)
def test_bad_profiles_raise(make) -> None:
    with pytest.raises(ValueError):
        make()


# -- issuance -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", stack_profiles(WD), ids=lambda p: p.secret)
def test_issued_sans_and_chain(issued: CertStore, profile: Profile) -> None:
    folder = issued.secret_dir(profile.secret)
    crt = (folder / "tls.crt").read_bytes()
    assert inspect.sans(crt) == list(profile.identities)
    leaf = _cert(folder / "tls.crt")
    leaf.verify_directly_issued_by(_cert(issued.ca_path(profile.issuer)))
    other = PUBLIC if profile.issuer == STACK else STACK
    with pytest.raises((ValueError, InvalidSignature)):  # negative control: the other CA did not sign it
        leaf.verify_directly_issued_by(_cert(issued.ca_path(other)))
    assert (folder / "ca.crt").read_bytes() == issued.ca_path(profile.issuer).read_bytes()


def _handshake(folder: Path, cafile: Path, server_hostname: str) -> None:
    """TLS over a real 127.0.0.1 socket; raises the client's ssl error if verification fails."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    client_ctx = ssl.create_default_context(cafile=str(cafile))  # only this CA, no system roots

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(SHORT_TIMEOUT)

        def serve() -> None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.settimeout(SHORT_TIMEOUT)
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)  # until the client closes
            except (ssl.SSLError, OSError):
                pass  # the client rejected us; its error is what the test checks
            finally:
                conn.close()

        server = threading.Thread(target=serve, name="tls-test-server")
        server.start()
        try:
            with (
                socket.create_connection(listener.getsockname(), timeout=SHORT_TIMEOUT) as raw,
                client_ctx.wrap_socket(raw, server_hostname=server_hostname),
            ):
                pass
        finally:
            server.join(SHORT_TIMEOUT)
            assert not server.is_alive(), "test TLS server did not finish"


INV_POD = "10-42-0-17.invocation.nvcf.svc.cluster.local"
GRPC_POD = "10-42-0-9.grpc-headless.nvcf.svc.cluster.local"


@pytest.mark.parametrize(
    ("secret", "trust", "hostname", "failure"),
    [
        (INVOCATION_SECRET, STACK, INV_POD, None),
        (INVOCATION_SECRET, PUBLIC, INV_POD, "unable to get local issuer"),
        (INVOCATION_SECRET, STACK, "x.grpc-headless.nvcf.svc.cluster.local", "mismatch"),
        (INVOCATION_SECRET, STACK, "a.10-42-0-17.invocation.nvcf.svc.cluster.local", "mismatch"),
        (GRPC_SECRET, STACK, GRPC_POD, None),
        (GRPC_SECRET, STACK, INV_POD, "mismatch"),
        (FRONTEND_SECRET, STACK, f"invocation.{WD}", None),
        (FRONTEND_SECRET, STACK, f"10-42-0-17.{WD}", None),
        (FRONTEND_SECRET, STACK, WD, "mismatch"),
        (FRONTEND_SECRET, STACK, f"a.b.{WD}", "mismatch"),
        (FRONTEND_SECRET, PUBLIC, f"invocation.{WD}", "unable to get local issuer"),
        (PUBLIC_FRONTEND_SECRET, PUBLIC, f"invocation.{WD}", None),
        (PUBLIC_FRONTEND_SECRET, STACK, f"invocation.{WD}", "unable to get local issuer"),
    ],
)
def test_tls_handshake_on_loopback(
    issued: CertStore, secret: str, trust: str, hostname: str, failure: str | None
) -> None:
    folder, cafile = issued.secret_dir(secret), issued.ca_path(trust)
    if failure is None:
        _handshake(folder, cafile, hostname)
        return
    with pytest.raises(ssl.SSLCertVerificationError) as caught:
        _handshake(folder, cafile, hostname)
    assert failure in caught.value.verify_message


def test_modes(issued: CertStore) -> None:
    for issuer in (STACK, PUBLIC):
        assert _mode(issued.ca_dir(issuer) / "ca.key") == 0o600
    for profile in stack_profiles(WD):
        folder = issued.secret_dir(profile.secret)
        assert _mode(folder / "tls.key") == 0o600  # follows the symlink to the payload file
        assert _mode(folder / "tls.crt") == 0o644


def test_validity_window_is_passed_through(tmp_path: Path) -> None:
    store = CertStore(tmp_path)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)
    end = start + timedelta(days=1)
    folder = store.issue(invocation_profile(), not_before=start, not_after=end)
    leaf = _cert(folder / "tls.crt")
    assert (leaf.not_valid_before_utc, leaf.not_valid_after_utc) == (start, end)
    assert inspect.not_after((folder / "tls.crt").read_bytes()) == end


# -- CAs ------------------------------------------------------------------------------------------------
def test_ensure_cas_is_idempotent(tmp_path: Path) -> None:
    store = CertStore(tmp_path)
    store.ensure_cas()
    first = [info.sha256 for info in store.describe()]
    store.ensure_cas()
    CertStore(tmp_path).ensure_cas()  # a second process on the same state folder
    assert [info.sha256 for info in store.describe()] == first
    assert len(set(first)) == 3  # stack, public-style and private CAs
    org = x509.NameOID.ORGANIZATION_NAME
    orgs = {
        issuer: _cert(store.ca_path(issuer)).subject.get_attributes_for_oid(org)[0].value
        for issuer in (STACK, PUBLIC)
    }
    assert orgs == {STACK: "ncpsim stack CA (OpenBao PKI)", PUBLIC: "ncpsim public-style CA"}


def test_concurrent_ensure_cas_agree(tmp_path: Path) -> None:
    stores = [CertStore(tmp_path) for _ in range(4)]
    threads = [threading.Thread(target=s.ensure_cas, name=f"ensure-{i}") for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SHORT_TIMEOUT)
    pem = stores[0].ca_path(STACK).read_bytes()
    issued = stores[3].issue(invocation_profile())
    _cert(issued / "tls.crt").verify_directly_issued_by(x509.load_pem_x509_certificate(pem))


def test_rotate_ca(tmp_path: Path) -> None:
    store = CertStore(tmp_path)
    store.ensure_cas()
    old_folder = store.issue(invocation_profile())
    old_ca = store.ca_path(STACK).read_bytes()
    old_leaf = (old_folder / "tls.crt").read_bytes()
    store.rotate_ca(STACK)
    assert (store.ca_dir(STACK) / "ca.prev.crt").read_bytes() == old_ca
    assert store.ca_path(STACK).read_bytes() != old_ca
    assert _mode(store.ca_dir(STACK) / "ca.key") == 0o600
    new_folder = store.issue(invocation_profile())
    _cert(new_folder / "tls.crt").verify_directly_issued_by(_cert(store.ca_path(STACK)))
    x509.load_pem_x509_certificate(old_leaf).verify_directly_issued_by(x509.load_pem_x509_certificate(old_ca))
    names = [info.name for info in store.describe()]
    assert names == ["stack", "stack previous", "public", "private"]


def test_describe_text(tmp_path: Path) -> None:
    store = CertStore(tmp_path)
    assert "no CAs yet" in describe_text(store.describe())
    store.ensure_cas()
    text = describe_text(store.describe())
    for info in store.describe():
        assert f"SHA256 Fingerprint={info.sha256}" in text
        assert str(info.path) in text
    assert "notAfter=3000-01-01T00:00:00Z" in text


@pytest.mark.parametrize("damage", ["missing-key", "garbage"])
def test_damaged_ca_is_a_config_error(tmp_path: Path, damage: str) -> None:
    store = CertStore(tmp_path)
    store.ensure_cas()
    key = store.ca_dir(STACK) / "ca.key"
    if damage == "missing-key":
        key.unlink()
    else:
        key.write_bytes(b"not a key")
    with pytest.raises(ConfigError, match="remove .*stack"):
        store.ensure_cas()


# -- openssl agrees -------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not on PATH")
def test_openssl_agrees(issued: CertStore) -> None:
    for issuer in (STACK, PUBLIC):
        path = issued.ca_path(issuer)
        out = subprocess.run(
            ["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", str(path)],
            capture_output=True,
            text=True,
            check=True,
            timeout=SHORT_TIMEOUT,
        ).stdout
        assert out.strip().split("=", 1)[1] == inspect.fingerprint_sha256(path.read_bytes())
    folder = issued.secret_dir(INVOCATION_SECRET)

    def verify(cafile: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["openssl", "verify", "-CAfile", str(cafile), str(folder / "tls.crt")],
            capture_output=True,
            text=True,
            timeout=SHORT_TIMEOUT,
            check=False,
        )

    ok = verify(folder / "ca.crt")
    assert ok.returncode == 0, ok.stderr
    assert verify(issued.ca_path(PUBLIC)).returncode != 0  # negative control


# -- the wildcard rule ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pattern", "hostname", "expected"),
    [
        ("*.grpc-worker.example.com", "invocation.grpc-worker.example.com", True),
        ("*.grpc-worker.example.com", "10-42-0-17.grpc-worker.example.com", True),
        ("*.grpc-worker.example.com", "INVOCATION.Grpc-Worker.Example.com.", True),
        ("*.grpc-worker.example.com", "grpc-worker.example.com", False),
        ("*.grpc-worker.example.com", "a.b.grpc-worker.example.com", False),
        ("*.grpc-worker.example.com", ".grpc-worker.example.com", False),
        ("*.grpc-worker.example.com", "invocation.grpc-worker.example.org", False),
        ("*.invocation.nvcf.svc.cluster.local", "10-42-0-17.invocation.nvcf.svc.cluster.local", True),
        ("*.invocation.nvcf.svc.cluster.local", "x.grpc-headless.nvcf.svc.cluster.local", False),
        ("invocation.example.com", "invocation.example.com", True),
        ("invocation.example.com", "x.invocation.example.com", False),
        ("f*.example.com", "foo.example.com", False),
        ("*.*.example.com", "a.b.example.com", False),
        ("a.*.example.com", "a.b.example.com", False),
        ("*.com", "example.com", False),
        ("*", "localhost", False),
        ("*.example.com", "*.example.com", False),
        ("127.0.0.1", "127.0.0.1", True),
        ("*.0.0.1", "127.0.0.1", False),
        ("::1", "0:0::1", True),
        ("", "a.example.com", False),
    ],
)
def test_covers(pattern: str, hostname: str, expected: bool) -> None:
    assert inspect.covers(pattern, hostname) is expected


def test_inspect_without_san(issued: CertStore) -> None:
    assert inspect.sans(issued.ca_path(STACK).read_bytes()) == []
