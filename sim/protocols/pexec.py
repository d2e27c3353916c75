"""The NVCF client API's checks of an invocation, before any work is published: pure, tested from tables.

What NVIDIA/nvcf's http-invocation does (src/invocation-plane-services/http-invocation/crates/server/src/
routes/post_pexec.rs and get_pexec.rs), in its order:

1. The route. `POST /v2/nvcf/pexec/functions/{function_id}[/versions/{version_id}]` and
   `GET /v2/nvcf/pexec/status/{request_id}`; axum percent-decodes a path parameter, and an empty segment
   matches no route (404). The id is a `Uuid`: one that does not parse is axum's own rejection, 400 with a
   text/plain body `Invalid URL: ...`.
2. The function. The NVCF API says whether the caller may invoke it; one it does not know is 404 problem+json
   (title `Not Found`; the service's tests expect the detail `function not found`).
3. `NVCF-POLL-SECONDS`. Read as a u64 (Rust's `u64::from_str`: digits with at most a leading `+`); anything
   else (`abc`, `nan`, an empty value, `-1`, `1.5`) and anything over 3600 is 400 problem+json with the detail
   `failed to parse poll duration`; a value that is not visible ASCII is read as no header at all
   (HeaderValue::to_str fails), so the default 60 s applies. The service raises 0 to its 1 s minimum; ncpsim
   does not model that minimum: its own client and the benchmarks send 0 to get the request id back at once
   (MIN_POLL), and a client that sends 0 here is answered at once, where the field waits a second.

Before all of it, hyper (axum's server) reads the request head within its limits and answers what it cannot
read with an empty body and closes: a head not complete within its read buffer (8 KiB + 100 x 4 KiB) or with
more than 100 fields is 431, a target longer than 65534 bytes 414, any other malformed head 400.

Only then is the work published. ncpsim's function ids are the catalogue's names (`http-echo`), where NVCF's
are UUIDs: an id is well formed here when it is such a name (letters, digits, `-`, `_`) or a UUID, and what
is not is answered with axum's 400 in ncpsim's words (the uuid crate's own message would not fit a name).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote

DEFAULT_POLL, MAX_POLL = 60, 3600  # seconds, as poll_duration() has them
MIN_POLL = 0  # the service's is 1 s; 0 is ncpsim's "answer at once" (see above)
DEFAULT_STREAM_POLL = 20 * 60
POLL_HEADER = "nvcf-poll-seconds"
POLL_DETAIL = "failed to parse poll duration"  # anyhow's outermost context is all err.to_string() shows
NOT_FOUND_DETAIL = "function not found"
_U64 = re.compile(r"\+?[0-9]+")
_VISIBLE_ASCII = re.compile(r"[\t\x20-\x7e]*")  # what http's HeaderValue::to_str accepts
_FUNCTION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # a catalogue name; a UUID is one too
_SHOWN = 80  # characters of a hostile id a message or a log line repeats


HEAD_BUFFER = 8192 + 4096 * 100  # hyper's DEFAULT_MAX_BUFFER_SIZE: the most of a head it holds unparsed
HEAD_FIELDS = 100  # hyper's default header count
URI_MAX = 65534  # hyper's MAX_URI_LEN (u16::MAX - 1)


def head_size(method: str, target: str, fields: Collection[tuple[str, str]]) -> int:
    """The bytes of a head as sent with single spaces (what h11 hands over keeps no more), from its text
    (latin-1: a character a byte)."""
    return (
        len(method) + len(target) + len(b"  HTTP/1.1\r\n\r\n") + sum(len(k) + len(v) + 4 for k, v in fields)
    )


def head_refusal(size: int, target: str, fields: int) -> int | None:
    """hyper's answer to a head that parsed but is past its limits (431, 414), or None: it goes on. hyper
    never holds more than its buffer, so a head longer than that is 431 however it arrived."""
    if size > HEAD_BUFFER or fields > HEAD_FIELDS:
        return 431
    if len(target) > URI_MAX:
        return 414
    return None


def unreadable_head(hint: int) -> int:
    """hyper's answer to a head it could not read (h11's status hint: 431 for a head past the buffer)."""
    return 431 if hint == 431 else 400


@dataclass(frozen=True)
class Problem:
    """The API's refusal: a status and its detail; `plain` for axum's own text/plain rejection."""

    status: int
    detail: str
    plain: bool = False

    @property
    def title(self) -> str:
        return HTTPStatus(self.status).phrase


NO_ROUTE = Problem(404, "Not Found")


def shown(text: str) -> str:
    """A hostile value as a message repeats it: quoted, control characters escaped, cut short."""
    return repr(text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...")


def function_id(rest: str, functions: Collection[str]) -> str | Problem:
    """The function the path after `/v2/nvcf/pexec/functions/` names, or the API's refusal."""
    parts = rest.split("/")
    if len(parts) not in (1, 3) or (len(parts) == 3 and (parts[1] != "versions" or not parts[2])):
        return NO_ROUTE
    try:
        raw = unquote(parts[0], errors="strict")
    except UnicodeDecodeError:
        return Problem(400, "Invalid UTF-8 in `function_id`", plain=True)
    if not raw:
        return NO_ROUTE  # axum: a capture never matches an empty segment
    if raw in functions:
        return raw
    if not _FUNCTION_ID.fullmatch(raw):
        return Problem(400, f"Invalid URL: function id {shown(raw)} is not a function's id", plain=True)
    return Problem(404, NOT_FOUND_DETAIL)


def poll_seconds(headers: Mapping[str, str]) -> int | Problem:
    """How long the API holds the client's request for the worker's answer, or the 400 it answers."""
    value = headers.get(POLL_HEADER)
    if value is None or not _VISIBLE_ASCII.fullmatch(value):
        # No header: 20 minutes for an event stream, else a minute (the service keeps this for old clients).
        return DEFAULT_STREAM_POLL if headers.get("accept") == "text/event-stream" else DEFAULT_POLL
    if not _U64.fullmatch(value):
        return Problem(400, POLL_DETAIL)
    digits = value.lstrip("+").lstrip("0") or "0"  # as u64::from_str reads them, however many zeros lead
    if len(digits) > len(str(MAX_POLL)) or int(digits) > MAX_POLL:  # past u64 or past the hour: both 400
        return Problem(400, POLL_DETAIL)
    return max(int(digits), MIN_POLL)
