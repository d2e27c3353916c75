"""Secret-shaped folders, written the way the kubelet updates a Secret volume.

Layout of ``<dir>`` (as in a mounted ``kubernetes.io/tls`` Secret)::

    ..2026_01_31_12_00_00.abc123/   the current payload (tls.crt, tls.key, ca.crt)
    ..data -> ..2026_01_31_12_00_00.abc123
    tls.crt -> ..data/tls.crt        (likewise tls.key, ca.crt)

A new payload goes into a fresh hidden directory and becomes visible in one step, when a temporary
symlink is renamed over ``..data``. A reader therefore sees the old or the new folder, never a half-written
file, which is what lets the proxy hot-reload certificates the way Envoy does with SDS. As with the
kubelet, the old payload is removed right after the swap, so a path-based read racing it can get ENOENT;
``load_secret`` and ``payload_dir`` give readers a consistent view.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

DATA_LINK = "..data"
CRT, KEY, CA = "tls.crt", "tls.key", "ca.crt"
FILES = (CRT, KEY, CA)
# The kubelet's own mode for a Secret volume is 0644; the private key is tightened to owner-only.
MODES = {CRT: 0o644, KEY: 0o600, CA: 0o644}
_READ_ATTEMPTS = 20


def _timestamp_prefix() -> str:
    # Same shape as the kubelet's atomic writer ("..2006_01_02_15_04_05."), so folders look familiar.
    return time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())


def _write_file(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)  # the umask must not change what a Secret volume would show
        handle.write(data)


def _replace_symlink(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` in one rename, whatever ``link`` was before."""
    tmp = link.with_name(f"{link.name}_tmp.{os.getpid()}.{time.monotonic_ns()}")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _current_payload(directory: Path) -> str | None:
    try:
        return os.readlink(directory / DATA_LINK)
    except OSError:  # missing, or not a symlink
        return None


def payload_dir(directory: Path) -> Path | None:
    """The payload ``..data`` points at now, for readers that load files by path (ssl contexts).

    Reading ``tls.crt`` and ``tls.key`` through the top-level links can straddle a swap (or, as with a
    real Secret volume, find the old payload gone for an instant); reading both from this directory
    cannot mix two updates, and a FileNotFoundError means "resolve again".
    """
    payload = _current_payload(Path(directory))
    return Path(directory) / payload if payload else None


def write_secret(directory: Path, crt: bytes, key: bytes, ca: bytes) -> Path:
    """Atomically replace the Secret folder's content; returns ``directory``.

    The bytes are not checked, so tests can publish deliberately broken material.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    previous = _current_payload(directory)
    payload = Path(tempfile.mkdtemp(prefix=_timestamp_prefix(), dir=directory))
    os.chmod(payload, 0o755)
    for name, data in zip(FILES, (crt, key, ca), strict=True):
        _write_file(payload / name, bytes(data), MODES[name])
    _replace_symlink(directory / DATA_LINK, payload.name)
    for name in FILES:
        # Only touch the user-visible links when they are not already right, so an unchanged link
        # never disappears for a reader, even for an instant.
        link = directory / name
        wanted = f"{DATA_LINK}/{name}"
        if not (link.is_symlink() and os.readlink(link) == wanted):
            _replace_symlink(link, wanted)
    if previous and previous != payload.name and previous.startswith(".."):
        shutil.rmtree(directory / previous, ignore_errors=True)
    return directory


def load_secret(directory: Path) -> tuple[bytes, bytes, bytes]:
    """Read ``(tls.crt, tls.key, ca.crt)`` from one payload, never a mix of two updates.

    ``..data`` is resolved once and all three files are read from that payload; if a concurrent update
    removes it mid-read, the read starts again from the new one.
    """
    directory = Path(directory)
    for _ in range(_READ_ATTEMPTS):
        payload = _current_payload(directory)
        if payload is None:
            break
        try:
            crt, key, ca = ((directory / payload / name).read_bytes() for name in FILES)
        except FileNotFoundError:
            continue
        return crt, key, ca
    if not (directory / DATA_LINK).exists():
        # A plain folder (e.g. copied by hand) is still accepted, without the consistency guarantee.
        if all((directory / name).is_file() for name in FILES):
            crt, key, ca = ((directory / name).read_bytes() for name in FILES)
            return crt, key, ca
        raise FileNotFoundError(f"{directory}: not a Secret folder (no {DATA_LINK} and no {CRT}/{KEY}/{CA})")
    raise OSError(f"{directory}: payload kept changing while reading; try again")
