"""A support bundle read safely: a folder or a .tar.gz, into memory, within bounds, writing nothing.

A bundle comes from outside (a ticket's attachment), so it is read as hostile input:
- a tar member with an absolute path or a `..` component, a symbolic or hard link, a device file or a
  FIFO is refused, not skipped: a bundle the collector wrote has none;
- the archive, the member count, each member and the whole are bounded, and the decompressed stream
  itself is counted (a gzip bomb, or a pax header claiming a gigabyte, stops at the bound, unread);
- a folder is walked without following links, each file opened with O_NOFOLLOW and checked with fstat.
Every refusal is one ConfigError line naming the bundle and the member. Nothing is extracted: the
members are bytes in a Bundle, so nothing can land outside the working folder.
"""

from __future__ import annotations

import errno
import gzip
import os
import stat
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from scenarios.terminal import safe
from sim.errors import ConfigError
from sim.model.untrusted import MAX_BYTES

MAX_ARCHIVE = 64 << 20  # a bundle's .tar.gz: logs of 2,000 lines and a few YAML files are a few MiB
MAX_MEMBERS = 512  # files and folders: a bundle has 6 files plus 2 per compute cluster
MAX_TOTAL = 64 << 20  # all members together, decompressed
MAX_LOG = 8 << 20  # one log file (2,000 lines of Envoy access log are under 1 MiB)
MAX_YAML = 8 * MAX_BYTES  # a bundle's YAML (a compute cluster's function pods run long)
HEADROOM = 1 << 20  # tar headers and padding counted against the stream's bound


@dataclass(frozen=True)
class Bundle:
    """The files of one bundle by their path inside it (`control-plane/services.yaml`, ...)."""

    source: str  # the folder or archive as the user named it
    files: Mapping[str, bytes]

    def text(self, path: str) -> str | None:
        raw = self.files.get(path)
        return None if raw is None else raw.decode("utf-8", errors="replace")

    def folders(self, under: str) -> list[str]:
        """The sub-folders of `under` that hold files (e.g. each compute cluster's context folder)."""
        prefix = f"{under}/"
        return sorted(
            {
                p[len(prefix) :].split("/")[0]
                for p in self.files
                if p.startswith(prefix) and "/" in p[len(prefix) :]
            }
        )


def read_bundle(path: Path) -> Bundle:
    """The bundle at `path` (a folder, or a .tar.gz the collector wrote), or a one-line ConfigError."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ConfigError(
            f"--bundle {path}: cannot read it ({exc.strerror or exc}); check the path"
        ) from None
    if stat.S_ISLNK(info.st_mode):
        raise ConfigError(f"--bundle {path}: is a symbolic link; give the bundle's folder or .tar.gz itself")
    files = _unique(path, _folder(path) if stat.S_ISDIR(info.st_mode) else _archive(path, info))
    if "meta.yaml" not in files and "environment.yaml" not in files:
        raise ConfigError(
            f"--bundle {path}: no meta.yaml or environment.yaml in it; is it a bundle from "
            f"`ncpsim collect-script`?"
        )
    return Bundle(str(path), files)


def _unique(path: Path, members: Iterator[tuple[str, bytes]]) -> dict[str, bytes]:
    """Every file once, by a plain name. The collector writes each name once and never a control character:
    a second `environment.yaml` would silently replace the first (tar's last-wins, which `tar tf` does not
    show), and a name with an escape or a newline would reach the report and the terminal."""
    files: dict[str, bytes] = {}
    for name, data in members:
        if safe(name, one_line=True) != name:
            raise _refuse(path, name, "a name with a control character (the collector writes plain names)")
        if name in files:
            raise _refuse(path, name, "in the bundle twice (which one is the customer's?)")
        files[name] = data
    return files


def _limit(name: str) -> int:
    return MAX_LOG if name.endswith(".log") else MAX_YAML


def _refuse(path: Path, member: str, why: str) -> ConfigError:
    shown = safe(member[:200], one_line=True)  # a member's name is the bundle's text, not ours
    return ConfigError(
        f"--bundle {safe(path, one_line=True)}: {shown}: {why}; refusing the bundle (read nothing from it)"
    )


# -- a folder -------------------------------------------------------------------------------------------
def _folder(root: Path) -> Iterator[tuple[str, bytes]]:
    count, total = 0, 0
    pending = [PurePosixPath()]
    while pending:
        here = pending.pop()
        with os.scandir(root / here) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = here / entry.name
                count += 1
                if count > MAX_MEMBERS:
                    raise _refuse(root, str(rel), f"more than {MAX_MEMBERS} files and folders")
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    pending.append(rel)
                    continue
                _check_kind(root, str(rel), mode)
                data = _read_file(root, root / rel, str(rel))
                total += len(data)
                if total > MAX_TOTAL:
                    raise _refuse(root, str(rel), f"the files add up to more than {MAX_TOTAL:,} bytes")
                yield str(rel), data


def _check_kind(root: Path, member: str, mode: int) -> None:
    if stat.S_ISLNK(mode):
        raise _refuse(root, member, "a symbolic link")
    if not stat.S_ISREG(mode):
        raise _refuse(root, member, "not a regular file (a device, FIFO or socket)")


def _read_file(root: Path, path: Path, member: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else f"cannot read it ({exc.strerror})"
        raise _refuse(root, member, why) from None
    try:
        info = os.fstat(fd)
        _check_kind(root, member, info.st_mode)
        limit = _limit(member)
        if info.st_size > limit:
            raise _refuse(
                root, member, f"{info.st_size:,} bytes, more than the {limit:,} a bundle file may have"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _refuse(root, member, f"more than the {limit:,} bytes a bundle file may have")
    return data


# -- a .tar.gz ------------------------------------------------------------------------------------------
class _Bounded:
    """A read-only stream that fails past `limit` bytes: the decompressed archive cannot run away."""

    def __init__(self, stream: IO[bytes] | gzip.GzipFile, limit: int):
        self.stream, self.left = stream, limit

    def read(self, size: int = -1) -> bytes:
        want = self.left + 1 if size < 0 else min(size, self.left + 1)
        data = self.stream.read(want)
        self.left -= len(data)
        if self.left < 0:
            raise OverflowError("decompressed archive past its bound")
        return data


def _archive(path: Path, info: os.stat_result) -> Iterator[tuple[str, bytes]]:
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"--bundle {path}: not a folder or a regular file; give the bundle's .tar.gz")
    if info.st_size > MAX_ARCHIVE:
        raise ConfigError(f"--bundle {path}: {info.st_size:,} bytes, more than a bundle's {MAX_ARCHIVE:,}")
    with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as unzipped:
        stream = _Bounded(unzipped, MAX_TOTAL + HEADROOM)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
                yield from _members(path, tar)
        except OverflowError:
            raise _refuse(
                path, "(archive)", f"decompresses to more than {MAX_TOTAL:,} bytes (a bomb?)"
            ) from None
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise ConfigError(
                f"--bundle {path}: not a readable .tar.gz ({' '.join(str(exc).split())[:120]}); "
                f"give the folder or the .tar.gz the collector wrote"
            ) from None


def _members(path: Path, tar: tarfile.TarFile) -> Iterator[tuple[str, bytes]]:
    count, total, top = 0, 0, None
    for member in tar:
        count += 1
        if count > MAX_MEMBERS:
            raise _refuse(path, member.name, f"more than {MAX_MEMBERS} members")
        name = _member_name(path, member.name)
        top = top or name.parts[0]
        if member.isdir():
            continue
        if member.issym() or member.islnk():
            raise _refuse(path, member.name, f"a link (to {member.linkname[:80]!r})")
        if not member.isreg():
            raise _refuse(path, member.name, "not a regular file (a device, FIFO or socket)")
        limit = _limit(member.name)
        if member.size > limit:
            raise _refuse(
                path, member.name, f"{member.size:,} bytes, more than the {limit:,} a bundle file may have"
            )
        total += member.size
        if total > MAX_TOTAL:
            raise _refuse(path, member.name, f"the members add up to more than {MAX_TOTAL:,} bytes")
        handle = tar.extractfile(member)
        data = handle.read() if handle is not None else b""
        yield _inside(name, top), data


def _member_name(path: Path, raw: str) -> PurePosixPath:
    name = PurePosixPath(raw)
    if name.is_absolute() or raw.startswith(("/", "\\")) or "\\" in raw:
        raise _refuse(path, raw, "an absolute path")
    if ".." in name.parts or not name.parts or "\x00" in raw:
        raise _refuse(path, raw, "a path that climbs out of the bundle (..)")
    parts = [p for p in name.parts if p != "."]
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _inside(name: PurePosixPath, top: str) -> str:
    """The path inside the bundle: the collector tars one top folder (its --out), which is dropped."""
    parts = name.parts
    if len(parts) > 1 and parts[0] == top and top not in ("control-plane", "compute"):
        parts = parts[1:]
    return "/".join(parts)
