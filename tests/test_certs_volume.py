"""Secret folders swap atomically, the way the kubelet updates a mounted Secret."""

from __future__ import annotations

import contextlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from certs.volume import DATA_LINK, FILES, load_secret, payload_dir, write_secret


def _payloads(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("..") and p.name != DATA_LINK)


def _version(n: int) -> tuple[bytes, bytes, bytes]:
    return (f"crt {n}\n".encode(), f"key {n}\n".encode(), f"ca {n}\n".encode())


def test_layout_and_swap(tmp_path: Path) -> None:
    folder = tmp_path / "secrets" / "s"
    write_secret(folder, *_version(1))
    first = _payloads(folder)
    assert len(first) == 1 and first[0].startswith("..20")
    assert load_secret(folder) == _version(1)

    write_secret(folder, *_version(2))
    assert load_secret(folder) == _version(2)
    second = _payloads(folder)
    assert len(second) == 1 and second != first  # the old payload is gone
    assert (folder / DATA_LINK).is_symlink() and os.readlink(folder / DATA_LINK) == second[0]
    assert payload_dir(folder) == folder / second[0]
    for name in FILES:
        assert (folder / name).is_symlink() and os.readlink(folder / name) == f"{DATA_LINK}/{name}"
    assert (folder / "tls.crt").read_bytes() == b"crt 2\n"
    assert stat.S_IMODE((folder / "tls.key").stat().st_mode) == 0o600
    assert not [p for p in folder.iterdir() if "_tmp" in p.name]


def test_plain_files_are_replaced_by_links(tmp_path: Path) -> None:
    for name, data in zip(FILES, _version(0), strict=True):
        (tmp_path / name).write_bytes(data)
    assert load_secret(tmp_path) == _version(0)  # a hand-made folder still loads
    write_secret(tmp_path, *_version(1))
    assert all((tmp_path / name).is_symlink() for name in FILES)
    assert load_secret(tmp_path) == _version(1)


def test_broken_material_is_written_as_given(tmp_path: Path) -> None:
    write_secret(tmp_path, b"", b"-----BEGIN GARBAGE", b"\x00")
    assert load_secret(tmp_path) == (b"", b"-----BEGIN GARBAGE", b"\x00")


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_secret(tmp_path / "nope")
    assert payload_dir(tmp_path / "nope") is None


def test_readers_never_see_a_mix(tmp_path: Path) -> None:
    """A reader racing many updates sees whole versions only, in order, and never a missing file."""
    write_secret(tmp_path, *_version(0))
    last = 149

    def writer() -> None:
        for n in range(1, last + 1):
            write_secret(tmp_path, *_version(n))

    seen: list[int] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="secret-writer") as pool:
        writing = pool.submit(writer)
        while not writing.done():
            crt, key, ca = load_secret(tmp_path)
            n = int(crt.split()[1])
            assert (crt, key, ca) == _version(n)
            # Through the user-visible link a read is whole too; but, as with the kubelet, it may find the
            # old payload already removed in the instant after a swap, which is why load_secret retries.
            with contextlib.suppress(FileNotFoundError):
                assert (tmp_path / "tls.crt").read_bytes() in {_version(m)[0] for m in range(last + 1)}
            seen.append(n)
        writing.result(timeout=5)  # re-raises anything the writer hit
    assert seen == sorted(seen)
    assert load_secret(tmp_path) == _version(last)
    assert len(_payloads(tmp_path)) == 1
