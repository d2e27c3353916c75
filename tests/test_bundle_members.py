"""A support bundle's member names (issue 31, round three): a name twice, or a name with a control character
(an escape, a newline, a bidi override), is refused in one line that shows the name escaped; plain names
in any script, and a gzip stream with trailing bytes after the archive (as `gzip -d` reads it), are read.

The rows that read are the negative control: the refusal is the name's, not the archive's.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest
from test_bundle_archive import META, regular, tar_gz

from scenarios.bundle.archive import read_bundle
from sim.errors import ConfigError

ENV = b"workerCallbackProxy: {enabled: true}\n"

REFUSED = [
    (
        "environment-twice",
        [("bundle/environment.yaml", ENV), ("bundle/environment.yaml", b"x: 2\n")],
        "twice",
    ),
    ("meta-twice", [("bundle/meta.yaml", b"collector: evil\n")], "twice"),
    ("twice-through-dot", [("bundle/environment.yaml", ENV), ("bundle/./environment.yaml", ENV)], "twice"),
    ("escape", [("bundle/\x1b[31mred.yaml", ENV)], "control character"),
    ("newline", [("bundle/env\nironment.yaml", ENV)], "control character"),
    ("carriage-return", [("bundle/logs/a\r.log", b"")], "control character"),
    ("bidi-override", [("bundle/logs/evil\u202egol.yaml", b"")], "control character"),
    ("zero-width", [("bundle/environment\u200b.yaml", ENV)], "control character"),
]
READ = [
    ("plain", [("bundle/environment.yaml", ENV)]),
    ("any-script", [("bundle/logs/café-中文.log", b"ok\n")]),
]


def bundle(tmp_path: Path, members: list[tuple[str, bytes]]) -> Path:
    return tar_gz(tmp_path / "b.tar.gz", lambda tar: [regular(tar, name, data) for name, data in members])


@pytest.mark.parametrize(("case", "members", "why"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_hostile_member_name_is_refused_in_one_line(
    tmp_path: Path, case: str, members: list[tuple[str, bytes]], why: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        read_bundle(bundle(tmp_path, members))
    line = str(refused.value)
    assert why in line and "refusing the bundle" in line
    assert line.isprintable() and "\u202e" not in line and "\u200b" not in line, repr(line)


@pytest.mark.parametrize(("case", "members"), READ, ids=[r[0] for r in READ])
def test_plain_names_are_read(tmp_path: Path, case: str, members: list[tuple[str, bytes]]) -> None:
    files = read_bundle(bundle(tmp_path, members)).files
    assert {name.removeprefix("bundle/") for name, _ in members} <= set(files)


def test_trailing_bytes_after_the_gzip_stream_are_read_as_gzip_reads_them(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        regular(tar, "bundle/meta.yaml", META)
    path = tmp_path / "b.tar.gz"
    path.write_bytes(gzip.compress(buffer.getvalue()) + b"\0" * 1024)
    assert read_bundle(path).files["meta.yaml"] == META
