"""Plain HTTP/1.1 heads: the common shape of a message, recognised by one regular expression, so a relay can
forward it without a full codec pass.

A plain head is a strict subset of what h11 accepts: CRLF line ends, an upper-case method (not CONNECT or
HEAD), visible ASCII throughout, HTTP/1.1, one Host (requests), at most one Content-Length of digits, and none
of the fields that change a message's framing or the connection's course (Transfer-Encoding, Expect, Upgrade,
a Connection other than close or keep-alive). For a plain head, these functions give exactly what h11 gives
(names lower case, values without surrounding whitespace; tests/test_h1plain.py holds them to it); for anything
else they give None, and the caller hands the bytes to h11, which judges them as before. Pure: bytes in,
values out.
"""

from __future__ import annotations

import re
from typing import NamedTuple

TOKEN = r"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
FIELDS = r"((?:" + TOKEN + r":[\t -~]*\r\n)*)\r\n"
REQUEST = re.compile(r"([A-Z]+) ([!-~]+) HTTP/1\.1\r\n" + FIELDS)
RESPONSE = re.compile(r"HTTP/1\.1 ([0-9]{3}) [\t -~]*\r\n" + FIELDS)
FIELD = re.compile(r"([^:]+):[\t ]*([^\r]*)\r\n")  # within FIELDS: name, value (but its trailing OWS)
HEAD_END = re.compile(rb"\n\r?\n")  # where h11 ends a head, CRLF or bare LF
LENGTH = re.compile(r"[0-9]{1,20}")  # h11 refuses a Content-Length of more than 20 digits
NAME = re.compile(TOKEN)
VALUE = re.compile(r"(?:[!-~](?:[\t -~]*[!-~])?)?")  # what h11 writes as given: no obs-text, no outer blanks
# Fields that change framing or the connection's course: h11's handling of them stays the judge.
FRAMING = frozenset({"transfer-encoding", "expect", "upgrade"})
SPECIAL = FRAMING | {"host", "content-length", "connection"}
# CONNECT turns the connection into a tunnel (h11 pauses on it); a HEAD's response has no body whatever its
# fields say: neither is relayed by length.
NOT_BY_LENGTH = frozenset({"CONNECT", "HEAD"})
NO_BODY_STATUS = frozenset({204, 304})  # and 1xx: a response without a body whatever its fields say

Fields = tuple[tuple[str, str], ...]


class PlainRequest(NamedTuple):
    method: str
    target: str
    headers: Fields  # names lower case, values as h11 gives them
    length: int  # body bytes (Content-Length; 0 when there is none)
    content_lengths: tuple[str, ...]  # the Content-Length field values as sent (none or one)
    keep_alive: bool  # no `close` in Connection
    size: int  # bytes of the head, its blank line included


class PlainResponse(NamedTuple):
    status: int
    headers: Fields
    length: int
    keep_alive: bool
    size: int


def head_end(buffer: bytes | bytearray, start: int = 0) -> int:
    """The length of the head at the start of `buffer` (through its blank line), or -1 while incomplete.
    `start`: where an earlier search left off (a head arriving in pieces is not searched again whole)."""
    found = HEAD_END.search(buffer, max(start - 2, 0))
    return found.end() if found else -1


def _fields(block: str) -> tuple[Fields, dict[str, list[str]]] | None:
    """Each field line of `block` as (name, value), and the values of the names that decide framing."""
    if " \r" in block or "\t\r" in block:  # a value with trailing whitespace (rare)
        fields = tuple([(name.lower(), value.rstrip(" \t")) for name, value in FIELD.findall(block)])
    else:
        fields = tuple([(name.lower(), value) for name, value in FIELD.findall(block)])
    special: dict[str, list[str]] = {}
    for name, value in fields:
        if name in SPECIAL:
            if name in FRAMING:
                return None
            special.setdefault(name, []).append(value)
    return fields, special


def _framing(special: dict[str, list[str]]) -> tuple[int, bool] | None:
    """(body length, keep-alive) as h11 reads them, or None when h11 must read them itself."""
    lengths = special.get("content-length", ())
    if len(lengths) > 1 or (lengths and not LENGTH.fullmatch(lengths[0])):
        return None
    keep_alive = True
    for value in special.get("connection", ()):
        for token in value.lower().split(","):
            token = token.strip()
            if token == "close":
                keep_alive = False
            elif token != "keep-alive":
                return None
    return (int(lengths[0]) if lengths else 0), keep_alive


def plain_request(head: bytes) -> PlainRequest | None:
    """`head`, a whole request head (see head_end), read as h11 reads it, if it is plain."""
    try:
        match = REQUEST.fullmatch(head.decode("ascii"))
    except UnicodeDecodeError:
        return None
    if match is None or match[1] in NOT_BY_LENGTH or (parsed := _fields(match[3])) is None:
        return None
    fields, special = parsed
    framing = _framing(special)
    if framing is None or len(special.get("host", ())) != 1:  # h11: one Host, exactly
        return None
    return PlainRequest(
        match[1],
        match[2],
        fields,
        framing[0],
        tuple(special.get("content-length", ())),
        framing[1],
        len(head),
    )


def plain_response(head: bytes) -> PlainResponse | None:
    """`head`, a whole response head, if it is plain and its body is framed by Content-Length."""
    try:
        match = RESPONSE.fullmatch(head.decode("ascii"))
    except UnicodeDecodeError:
        return None
    if match is None or (parsed := _fields(match[2])) is None:
        return None
    status = int(match[1])
    fields, special = parsed
    framing = _framing(special)
    if framing is None or status < 200 or status in NO_BODY_STATUS or "content-length" not in special:
        return None  # an interim or bodiless response, or one read to the close: h11's to frame
    return PlainResponse(status, fields, framing[0], framing[1], len(head))


def plain_fields(fields: list[tuple[str, str]]) -> bool:
    """Fields a writer may put on the wire as they are, in the bytes h11 would write (response_bytes): valid
    names and visible-ASCII values, none that decides framing or the connection's course (nor Host, which h11
    would move first). Anything else is h11's to validate and write."""
    return all(NAME.fullmatch(k) and VALUE.fullmatch(v) and k.lower() not in SPECIAL for k, v in fields)


METHOD = re.compile(r"[A-Z]+")
TARGET = re.compile(r"[!-~]+")  # h11's request-target: visible ASCII


def plain_request_out(method: str, target: str, fields: list[tuple[str, str]], body: int) -> bool:
    """A request a client may write as it is (request_bytes) with a `body`-byte body, in the bytes h11 would
    write: an upper-case method that is not HEAD or CONNECT, a target of visible ASCII, one Host, a
    Content-Length that says the body's length (none for no body), and plain fields beside them. Anything
    else is h11's to validate and write (or to refuse: a declared length the body does not have)."""
    if method in NOT_BY_LENGTH or not METHOD.fullmatch(method) or not TARGET.fullmatch(target):
        return False
    hosts = [(k, v) for k, v in fields if k.lower() == "host"]
    lengths = [(k, v) for k, v in fields if k.lower() == "content-length"]
    rest = [(k, v) for k, v in fields if k.lower() not in ("host", "content-length")]
    return (
        len(hosts) == 1
        and hosts[0][0] == "host"  # (request_bytes moves it first as h11 does, by this name)
        and bool(VALUE.fullmatch(hosts[0][1]))
        and ([v for k, v in lengths if NAME.fullmatch(k)] == [str(body)] if lengths else body == 0)
        and plain_fields(rest)
    )


def _field_lines(fields: list[tuple[str, str]] | Fields) -> str:
    """Field lines as h11 writes them: Host first (RFC 9110 7.2), then the rest in order."""
    names = [k for k, _ in fields]
    if "host" in names and (names[0] != "host" or names.count("host") > 1):
        fields = [f for f in fields if f[0] == "host"] + [f for f in fields if f[0] != "host"]
    return "".join([f"{k}: {v}\r\n" for k, v in fields])


def request_bytes(method: str, target: str, fields: list[tuple[str, str]]) -> bytes:
    """The request head h11 writes for h11.Request(method, target, fields)."""
    return f"{method} {target} HTTP/1.1\r\n{_field_lines(fields)}\r\n".encode("latin-1")


def response_bytes(status: int, reason: bytes, fields: list[tuple[str, str]]) -> bytes:
    """The response head h11 writes for h11.Response(status, fields, reason) on a connection whose
    request asked to keep it (a `close` request gets its `Connection: close` from the caller)."""
    return b"HTTP/1.1 %d %s\r\n%s\r\n" % (status, reason, _field_lines(fields).encode("latin-1"))
