"""A support bundle is hostile input (scenarios/bundle/archive.py): path traversal, links, device files,
a tar bomb and a 1 GiB member are each refused in one line, and nothing is written anywhere."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import ncpsim

from scenarios.bundle.archive import MAX_MEMBERS, read_bundle
from sim.errors import ConfigError

META = b"collector: ncpsim-collect\nversion: 1\n"


def tar_gz(path: Path, add: Callable[[tarfile.TarFile], None], top: str = "bundle") -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        regular(tar, f"{top}/meta.yaml", META)
        add(tar)
    path.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=1))
    return path


def regular(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def special(name: str, kind: bytes, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, linkname
        tar.addfile(info)

    return add


def header_only(name: str, size: int) -> bytes:
    """A tar stream whose member claims `size` bytes and stops: the claim alone must be refused."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf() + b"\0" * 512


HOSTILE = [
    ("traversal", lambda t: regular(t, "bundle/../../evil.yaml", b"x: 1\n"), "climbs out"),
    ("absolute", lambda t: regular(t, "/tmp/evil.yaml", b"x: 1\n"), "absolute path"),
    ("symlink", special("bundle/environment.yaml", tarfile.SYMTYPE, "/etc/passwd"), "a link"),
    ("hardlink", special("bundle/environment.yaml", tarfile.LNKTYPE, "/etc/passwd"), "a link"),
    ("char-device", special("bundle/environment.yaml", tarfile.CHRTYPE), "not a regular file"),
    ("fifo", special("bundle/environment.yaml", tarfile.FIFOTYPE), "not a regular file"),
    (
        "too-many-members",
        lambda t: [regular(t, f"bundle/x/{n}.log", b"") for n in range(MAX_MEMBERS + 1)],
        f"more than {MAX_MEMBERS} members",
    ),
]


@pytest.mark.parametrize(("name", "add", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_archive_is_refused_in_one_line(tmp_path: Path, name: str, add, why: str) -> None:
    archive = tar_gz(tmp_path / f"{name}.tar.gz", add)
    # where an extraction would land: the archive's folder, and its parent for a member that climbs out
    # (the whole base folder's listing grew with every earlier test: 4.7 s of the suite)
    before = set(tmp_path.rglob("*")) | set(tmp_path.parent.iterdir())
    with pytest.raises(ConfigError, match=why) as refused:
        read_bundle(archive)
    assert "\n" not in str(refused.value) and str(archive) in str(refused.value)
    assert set(tmp_path.rglob("*")) | set(tmp_path.parent.iterdir()) == before  # nothing written, in or out
    assert not (Path("/tmp/evil.yaml").exists() or (tmp_path.parent / "evil.yaml").exists())


def test_a_1_gib_member_is_refused_from_its_header(tmp_path: Path) -> None:
    stream = header_only("bundle/meta.yaml", 1 << 30)
    archive = tmp_path / "huge.tar.gz"
    archive.write_bytes(gzip.compress(stream))
    with pytest.raises(ConfigError, match="1,073,741,824 bytes, more than"):
        read_bundle(archive)


def test_a_tar_bomb_stops_at_the_bound(tmp_path: Path) -> None:
    """Members small enough one by one, 70 MiB of zeros together (70 KiB compressed)."""

    def add(tar: tarfile.TarFile) -> None:
        for n in range(10):
            info = tarfile.TarInfo(f"bundle/control-plane/logs/{n}.log")
            info.size = 7 << 20
            tar.addfile(info, io.BytesIO(bytes(info.size)))

    archive = tar_gz(tmp_path / "bomb.tar.gz", add)
    assert archive.stat().st_size < 1 << 20
    with pytest.raises(ConfigError, match="add up to more than|decompresses to more than"):
        read_bundle(archive)


def test_a_pax_header_claiming_a_gigabyte_is_not_read(tmp_path: Path) -> None:
    """tarfile reads a pax header's whole claimed size into memory: the stream's bound stops it."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = 1 << 30
    stream = info.tobuf() + bytes(70 << 20)  # what follows the header is read, up to the bound
    archive = tmp_path / "pax.tar.gz"
    archive.write_bytes(gzip.compress(stream, compresslevel=1))
    with pytest.raises(ConfigError, match="decompresses to more than|not a readable"):
        read_bundle(archive)


def test_not_an_archive_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text("workerCallbackProxy: {enabled: true}\n")
    with pytest.raises(ConfigError, match="not a readable .tar.gz"):
        read_bundle(path)


def test_a_folder_bundle_with_a_link_or_a_fifo_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "bundle"
    (folder / "control-plane").mkdir(parents=True)
    (folder / "meta.yaml").write_bytes(META)
    assert read_bundle(folder).files["meta.yaml"] == META  # the control: a plain folder reads
    (folder / "control-plane" / "secrets.yaml").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="symbolic link"):
        read_bundle(folder)
    (folder / "control-plane" / "secrets.yaml").unlink()
    os.mkfifo(folder / "environment.yaml")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_bundle(folder)


def test_a_good_archive_reads_without_its_top_folder(tmp_path: Path) -> None:
    archive = tar_gz(
        tmp_path / "ok.tar.gz", lambda t: regular(t, "bundle/control-plane/services.yaml", b"{}\n")
    )
    bundle = read_bundle(archive)
    assert set(bundle.files) == {"meta.yaml", "control-plane/services.yaml"}


def test_diagnose_refuses_a_hostile_bundle_with_exit_2(tmp_path: Path) -> None:
    archive = tar_gz(tmp_path / "evil.tar.gz", HOSTILE[0][1])
    done = ncpsim("diagnose", "--bundle", str(archive), home=tmp_path / "home", env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "climbs out" in done.stderr and "Traceback" not in done.stderr


def test_a_bundle_file_past_the_yaml_bounds_is_one_line(tmp_path: Path) -> None:
    """The bounds of a values file hold inside a bundle (sim/model/untrusted.py): an alias bomb in
    environment.yaml is refused naming it, before anything walks it."""
    from scenarios.bundle.world import read_world

    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefg", "bcdefgh", strict=True)
    )
    archive = tar_gz(tmp_path / "bomb.tar.gz", lambda t: regular(t, "bundle/environment.yaml", bomb.encode()))
    with pytest.raises(ConfigError, match=r"^environment.yaml:\d+: .*alias bomb") as refused:
        read_world(read_bundle(archive))
    assert "\n" not in str(refused.value)
