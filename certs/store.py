"""The stack's three CAs and the Secret folders they sign, under one state folder.

Layout under ``root`` (e.g. ``.ncpsim/<stack>/certs``)::

    ca/stack/{ca.crt,ca.key[,ca.prev.crt]}    plays the OpenBao PKI behind ClusterIssuer/nvcf-openbao-pki
    ca/public/{ca.crt,ca.key[,ca.prev.crt]}   plays a public CA; simulated workers trust it as system roots
    ca/private/{ca.crt,ca.key}                plays a customer's corporate CA; no worker trusts it by default
    secrets/<secret name>/                    Secret-shaped folders, see certs.volume

Several processes of one stack may share the folder, so CA creation and rotation happen under an
advisory lock: two processes starting at once must not mint two different CAs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import trustme

from certs import inspect
from certs.names import secret_name_problem
from certs.profiles import ISSUERS, PRIVATE, PUBLIC, STACK, Profile
from certs.volume import load_secret, write_secret
from sim.errors import ConfigError

SECRET_FILE = "stack.secret"  # the stack's own randomness (stack_secret), owner-only

__all__ = ["CaInfo", "CertStore", "describe_text", "load_secret", "write_secret"]

CA_ORGANIZATIONS = {
    STACK: "ncpsim stack CA (OpenBao PKI)",
    PUBLIC: "ncpsim public-style CA",
    PRIVATE: "ncpsim private CA (a customer's corporate CA)",
}
LEAF_ORGANIZATION = "ncpsim"
_CN_MAX = 64  # X.520 upper bound; longer names stay in the SAN only


@dataclass(frozen=True)
class CaInfo:
    """One CA certificate as ``ncpsim certs`` shows it."""

    name: str
    path: Path
    sha256: str  # colon-separated upper-case hex, as ``openssl x509 -fingerprint -sha256`` prints
    not_after: datetime


def _check_issuer(issuer: str) -> None:
    if issuer not in ISSUERS:
        raise ValueError(f"issuer must be one of {ISSUERS}, got {issuer!r}")


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write via a temporary file and rename, so a reader never sees a partial PEM."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CertStore:
    """Creates, loads and rotates the CAs and issues profiles into Secret folders."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # -- paths -------------------------------------------------------------------------------------
    def ca_dir(self, issuer: str) -> Path:
        _check_issuer(issuer)
        return self.root / "ca" / issuer

    def ca_path(self, issuer: str) -> Path:
        """PEM of that CA's current certificate (what a client puts in its trust store)."""
        return self.ca_dir(issuer) / "ca.crt"

    def secret_dir(self, secret: str) -> Path:
        if secret_name_problem(secret):  # a folder of ours: callers check first, with the user's key
            raise ValueError(f"not a Secret name: {secret[:80]!r}")
        return self.root / "secrets" / secret

    # -- CAs ---------------------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        lock_dir = self.root / "ca"
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / ".lock", "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def ensure_cas(self) -> None:
        """Create every CA, or keep the ones already on disk (so restarts keep workers' trust)."""
        with self._locked():
            for issuer in ISSUERS:
                self._load_or_create(issuer)

    def rotate_ca(self, issuer: str) -> None:
        """Replace a CA for future issues; the old certificate stays beside it as ``ca.prev.crt``.

        Existing Secret folders are not reissued: a rotation scenario decides when each one moves.
        """
        with self._locked():
            old = self._load_or_create(issuer)
            directory = self.ca_dir(issuer)
            _atomic_write(directory / "ca.prev.crt", old.cert_pem.bytes(), 0o644)
            self._save(issuer, self._new_ca(issuer))

    def _new_ca(self, issuer: str) -> trustme.CA:
        # A random OU keeps successive CAs' subjects distinct, so a bundle of old and new CA is
        # unambiguous to OpenSSL's issuer lookup during a rotation.
        unit = f"ncpsim {issuer} CA #{secrets.token_hex(4)}"
        return trustme.CA(organization_name=CA_ORGANIZATIONS[issuer], organization_unit_name=unit)

    def _save(self, issuer: str, ca: trustme.CA) -> None:
        directory = self.ca_dir(issuer)
        directory.mkdir(parents=True, exist_ok=True)
        # Key first: a ca.crt on disk always has its key beside it.
        _atomic_write(directory / "ca.key", ca.private_key_pem.bytes(), 0o600)
        _atomic_write(directory / "ca.crt", ca.cert_pem.bytes(), 0o644)

    def _load_or_create(self, issuer: str) -> trustme.CA:
        """Caller holds the lock."""
        directory = self.ca_dir(issuer)
        crt, key = directory / "ca.crt", directory / "ca.key"
        if crt.exists() and key.exists():
            try:
                return trustme.CA.from_pem(crt.read_bytes(), key.read_bytes())
            except ValueError as exc:
                raise ConfigError(
                    f"{crt}: cannot load the {issuer} CA ({exc}); remove {directory} to create a new one"
                ) from exc
        if crt.exists():
            raise ConfigError(f"{key}: missing beside ca.crt; remove {directory} to create a new {issuer} CA")
        ca = self._new_ca(issuer)
        self._save(issuer, ca)
        return ca

    # -- leaves ------------------------------------------------------------------------------------
    def issue(
        self,
        profile: Profile,
        *,
        not_before: datetime | None = None,
        not_after: datetime | None = None,
    ) -> Path:
        """Issue ``profile`` from its CA into its Secret folder (atomic swap); returns the folder."""
        with self._locked():
            ca = self._load_or_create(profile.issuer)
        first = profile.identities[0]
        leaf = ca.issue_cert(
            *profile.identities,
            common_name=first if len(first) <= _CN_MAX else None,
            organization_name=LEAF_ORGANIZATION,
            not_before=not_before,
            not_after=not_after,
        )
        chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)  # leaf, then any intermediates
        return write_secret(
            self.secret_dir(profile.secret), chain, leaf.private_key_pem.bytes(), ca.cert_pem.bytes()
        )

    def issue_all(self, profiles: list[Profile]) -> list[Path]:
        return [self.issue(profile) for profile in profiles]

    # -- reporting ---------------------------------------------------------------------------------
    def stack_secret(self) -> str:
        """The stack's own secret (hex, 32 bytes of OS randomness), made the first time it is asked for and
        kept owner-only beside the CAs, as long as they are: every NATS key of the stack derives from it.
        Two processes asking at once agree: the file takes its name by a link, which fails if it exists."""
        path = self.root / SECRET_FILE
        if not path.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.root, prefix=".stack-secret.")
            try:
                os.write(fd, secrets.token_hex(32).encode())
                os.close(fd)
                with contextlib.suppress(FileExistsError):
                    os.link(temporary, path)
            finally:
                os.unlink(temporary)
        return path.read_text().strip()

    def issuer_of(self, pem: bytes) -> str:
        """stack, public or private when one of this store's CAs issued the leaf; else the issuer's name."""
        for issuer in ISSUERS:
            try:
                if inspect.issued_by(pem, self.ca_path(issuer).read_bytes()):
                    return issuer
            except (OSError, ValueError):
                continue
        return inspect.issuer_name(pem)

    def describe(self) -> list[CaInfo]:
        """Current CAs (and any previous one kept by a rotation), for ``ncpsim certs``."""
        infos: list[CaInfo] = []
        for issuer in ISSUERS:
            directory = self.ca_dir(issuer)
            current, previous = directory / "ca.crt", directory / "ca.prev.crt"
            for name, path in ((issuer, current), (f"{issuer} previous", previous)):
                if path.exists():
                    pem = path.read_bytes()
                    infos.append(CaInfo(name, path, inspect.fingerprint_sha256(pem), inspect.not_after(pem)))
        return infos


def describe_secrets(store: CertStore) -> list[str]:
    """Each Secret's leaf certificate: names, issuer (which of the stack's CAs, else its own name), expiry."""
    lines: list[str] = []
    root = store.root / "secrets"
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        try:
            pem = (folder / "tls.crt").read_bytes()
            names, expiry = inspect.sans(pem), inspect.not_after(pem)
        except (OSError, ValueError):
            lines.append(f"Secret {folder.name}: no readable tls.crt")
            continue
        issuer = next(
            (
                i
                for i in ISSUERS
                if store.ca_path(i).exists() and inspect.issued_by(pem, store.ca_path(i).read_bytes())
            ),
            inspect.issuer_name(pem),
        )
        lines.append(f"Secret {folder.name}: {folder / 'tls.crt'}")
        lines.append(f"  names={', '.join(names) or '(none)'}  issuer={issuer}")
        lines.append(f"  SHA256 Fingerprint={inspect.fingerprint_sha256(pem)}")
        lines.append(f"  notAfter={expiry.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    return lines


def describe_text(infos: list[CaInfo]) -> str:
    """Plain lines, in the vocabulary of ``openssl x509 -noout -fingerprint -enddate``."""
    if not infos:
        return "no CAs yet: they are created when the stack comes up"
    lines: list[str] = []
    for info in infos:
        lines.append(f"{info.name} CA: {info.path}")
        lines.append(f"  SHA256 Fingerprint={info.sha256}")
        lines.append(f"  notAfter={info.not_after.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    return "\n".join(lines)
