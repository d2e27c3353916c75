"""Reading a file a user hands ncpsim (a customer's values file, a scenario, a step) with bounds.

A customer's file is untrusted input: the README's own workflow runs `ncpsim up -f` on whatever a ticket
attached. Everything here is bounded before it is used, so a hostile file costs at most a fraction of a
second and a few megabytes, and every refusal is one line naming the file (a ConfigError):
- only a regular file is read (a FIFO would block forever, /dev/zero never ends, a folder is no file),
  opened without blocking and checked with fstat on the open descriptor, then read to at most `limit`;
- UTF-8 text without the characters YAML forbids (a NUL byte: a binary file);
- YAML composed with limits on nesting (a 5,000-deep list overflows Python's stack), on the number of
  nodes, and on the size and depth the aliases expand to: a 400-byte alias bomb names a billion values,
  which key-path tracking (`sim.model.values_file`), merging and validation would each walk;
- keys are plain strings (Helm's values are JSON objects), integers at most 64 digits long.
Limits are generous for any real values file or scenario (hundreds of keys, a few levels deep).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any, NoReturn

import yaml

from sim.errors import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB: a values file or scenario is a few KiB
MAX_DEPTH = 64  # nesting, aliases expanded: real files are under 10 deep; Python's stack needs ~1,000 frames
MAX_NODES = (
    10_000  # values as written, and as the aliases expand them (a real file has hundreds; the pure-Python
)
# reader takes about 50 ms a thousand, so this also bounds the time a 1 MiB file of tiny values costs)
MAX_INT_DIGITS = 64  # a port, a count, a duration: Python refuses to print ints past 4,300 digits

_INT, _STR, _MERGE = "tag:yaml.org,2002:int", "tag:yaml.org,2002:str", "tag:yaml.org,2002:merge"
_PLAIN = {
    f"tag:yaml.org,2002:{kind}"
    for kind in ("str", "int", "float", "bool", "null", "seq", "map", "merge", "timestamp")
}
_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


class Refused(Exception):
    """One bound a file broke: the 1-based line (if known) and what to tell the user."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line, self.message = line, message


def read_text(path: os.PathLike[str] | str, what: str = "values file", limit: int = MAX_BYTES) -> str:
    """The text of a regular file of at most `limit` bytes, or a one-line ConfigError naming it."""
    raw = read_bytes(path, what, limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text; save the {what} as UTF-8") from None


def read_bytes(path: os.PathLike[str] | str, what: str = "file", limit: int = MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or a one-line ConfigError naming it."""
    name = str(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; O_NOCTTY: a terminal device is not adopted.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the {what} ({exc.strerror or exc}); check the path") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
            raise ConfigError(f"{name}: is {kind}, not a regular file; give the {what} as a file")
        if info.st_size > limit:
            raise ConfigError(
                f"{name}: {info.st_size:,} bytes is too large for a {what} "
                f"(at most {limit:,}); is it the right file?"
            )
        raw = _read_at_most(fd, limit + 1)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the {what} ({exc.strerror or exc}); check the path") from None
    finally:
        os.close(fd)
    if len(raw) > limit:  # it grew after the fstat (or /proc lies about its size)
        raise ConfigError(
            f"{name}: more than {limit:,} bytes is too large for a {what}; is it the right file?"
        )
    return raw


def _read_at_most(fd: int, count: int) -> bytes:
    chunks, left = [], count
    while left > 0:
        try:
            chunk = os.read(fd, min(left, 1 << 16))
        except BlockingIOError:  # a regular file never blocks; anything else is not what we read
            raise OSError(errno.EAGAIN, "would block") from None
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts nodes and nesting as it goes (it recurses once per level)."""

    def __init__(self, text: str, max_nodes: int = MAX_NODES):
        self._depth = self._nodes = 0
        self._max_nodes = max_nodes
        self.constructing: yaml.Node | None = None  # the node being built, for the line of a failure
        super().__init__(text)

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # The scanner runs ahead of the composer and keeps a possible key per open bracket: stop it at the bound.
        if self.flow_level >= MAX_DEPTH:
            _refuse(self.line + 1, f"nested more than {MAX_DEPTH} levels deep; flatten it")
        super().fetch_flow_collection_start(token_class)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        self.constructing = node
        return super().construct_object(node, deep)

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        if self._depth > MAX_DEPTH or self._nodes > self._max_nodes:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
            if self._depth > MAX_DEPTH:
                _refuse(mark.line + 1, f"nested more than {MAX_DEPTH} levels deep; flatten it")
            _refuse(mark.line + 1, f"more than {self._max_nodes:,} values; is it the right file?")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _refuse(line: int | None, message: str) -> NoReturn:
    raise Refused(line, message)


def _as_written(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return loader.construct_scalar(node)


# A date stays the text written, as Helm reads it (YAML to JSON), instead of a datetime nothing expects.
_BoundedLoader.add_constructor("tag:yaml.org,2002:timestamp", _as_written)


def parse(text: str, max_nodes: int = MAX_NODES) -> tuple[yaml.Node | None, Any]:
    """(node graph, data) of one YAML document, checked before anything walks it. Raises Refused for a
    broken bound or a value that cannot be built, yaml.YAMLError for bad syntax (with its marks).
    `max_nodes` widens the node bound for a file known to be long (a support bundle's list of pods)."""
    loader = _BoundedLoader(text, max_nodes)  # the reader checks the characters here: inside the caller's try
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        measure(node, max_nodes)
        try:
            return node, loader.construct_document(node)
        except (ValueError, TypeError, ArithmeticError, RecursionError) as exc:
            where = loader.constructing or node
            _refuse(
                where.start_mark.line + 1,
                f"cannot read {str(where.value)[:40]!r}: {' '.join(str(exc).split())[:120]}",
            )
    finally:
        loader.dispose()


def measure(node: yaml.Node, max_nodes: int = MAX_NODES) -> int:
    """How many values the graph names with its aliases expanded; Refused past the limits, or for an
    alias inside itself, or for a key that is not a plain string, or an integer too long to be a number."""
    return _measure(node, 1, {}, set(), max_nodes)[0]


def _measure(
    node: yaml.Node, depth: int, memo: dict[int, tuple[int, int]], active: set[int], max_nodes: int
) -> tuple[int, int]:
    """(expanded size, height) of `node`, each shared node measured once: linear in the file's size."""
    line = node.start_mark.line + 1
    if id(node) in memo:
        size, height = memo[id(node)]
        if depth + height > MAX_DEPTH:
            _refuse(line, f"its aliases nest more than {MAX_DEPTH} levels deep; write the values out")
        return size, height
    if id(node) in active:
        _refuse(line, "an alias refers to the value that contains it; write the values out")
    if depth > MAX_DEPTH:
        _refuse(line, f"its aliases nest more than {MAX_DEPTH} levels deep; write the values out")
    if node.tag not in _PLAIN:
        _refuse(
            line,
            f"{node.tag.replace('tag:yaml.org,2002:', '!!')} values are not supported; values are "
            f"text, numbers, true/false, null, lists and mappings",
        )
    if isinstance(node, yaml.ScalarNode):
        _check_scalar(node, line)
        memo[id(node)] = (1, 0)
        return 1, 0
    active.add(id(node))
    size, height = 1, 0
    for child in _children(node):
        child_size, child_height = _measure(child, depth + 1, memo, active, max_nodes)
        size += child_size
        height = max(height, child_height + 1)
        if size > max_nodes:
            _refuse(
                line,
                f"its aliases expand to more than {max_nodes:,} values (an alias bomb?); "
                f"write the values out",
            )
    active.discard(id(node))
    memo[id(node)] = (size, height)
    return size, height


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    out = []
    for key, value in node.value:
        if key.tag != _MERGE:
            _check_key(key)
        out += [key, value]
    return out


def _check_key(key: yaml.Node) -> None:
    line = key.start_mark.line + 1
    if not isinstance(key, yaml.ScalarNode):
        _refuse(line, "a key must be a plain word, not a list or mapping")
    shown = json.dumps(key.value[:40], ensure_ascii=False)  # one line, whatever the key holds
    if key.tag != _STR:
        _refuse(line, f"key {shown} is read as {key.tag.rsplit(':', 1)[-1]}, not text; quote it ({shown}:)")
    if any(ord(c) < 0x20 or c in "\x7f\x85\u2028\u2029" for c in key.value):
        _refuse(line, f"key {shown} holds a line break or control character; a key is one plain word")


def _check_scalar(node: yaml.ScalarNode, line: int) -> None:
    if node.tag == _INT and len(node.value) > MAX_INT_DIGITS:
        _refuse(
            line,
            f"an integer {len(node.value):,} characters long (at most {MAX_INT_DIGITS}); "
            f"quote it if it is text",
        )


def value(text: str) -> Any:
    """A `--set key=VALUE` read as YAML, within the same bounds (Refused, or yaml.YAMLError)."""
    return parse(text)[1]
