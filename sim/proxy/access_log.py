"""Envoy's default access-log format, so ncpsim's log reads like `kubectl logs deploy/worker-callback-proxy`.

[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE%
%RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%
"%REQ(X-FORWARDED-FOR)%" "%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"

As Envoy fills them: BYTES_RECEIVED and BYTES_SENT count body bytes only (a local reply's body too, none
on HEAD; a CONNECT tunnel's payload each way); X-REQUEST-ID is the client's if it sent one, else the id
the proxy generated (HTTP workers send none); UPSTREAM_HOST is the pod address dialed, also on UF, and "-"
when no address was chosen (NR, DF, codec errors).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from sim.proxy.policy import RequestHead

ACCESS_LOG = "worker-callback-proxy.access.log"  # under <state>/logs


@dataclass
class AccessRecord:
    start: float  # epoch seconds
    method: str = "-"
    path: str = "-"
    protocol: str = "HTTP/1.1"
    status: int = 0
    flags: str = "-"
    bytes_received: int = 0
    bytes_sent: int = 0
    duration_ms: int = 0
    upstream_service_time: str = "-"
    forwarded_for: str = "-"
    user_agent: str = "-"
    request_id: str = "-"
    authority: str = "-"
    upstream_host: str = "-"

    def describe(self, head: RequestHead) -> None:
        """The fields taken from the request, but its id: the path and authority as Envoy logs them (from the
        absolute-form target a forward proxy gets, else from Host; CONNECT's authority is its target)."""
        self.method, self.protocol = head.method, f"HTTP/{head.http_version}"
        if head.method == "CONNECT":
            self.path, self.authority = "-", head.target
        elif "://" in head.target:
            try:
                parts = urlsplit(head.target)
                self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                self.authority = parts.netloc
            except ValueError:  # "http://[": logged as sent; decide() answers it 400
                self.path, self.authority = head.target, "-"
        else:
            self.path, self.authority = head.target, head.header("host") or "-"
        self.user_agent = head.header("user-agent") or "-"

    def finish(self, now: float | None = None) -> None:
        self.duration_ms = int(((now or time.time()) - self.start) * 1000)


@lru_cache(maxsize=2)
def _second(second: int) -> str:
    """START_TIME up to its milliseconds: the same for every line of a second, so made once a second."""
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")


def format_record(r: AccessRecord) -> str:
    millis = int(r.start * 1000)
    return (
        f'[{_second(millis // 1000)}{millis % 1000:03d}Z] "{r.method} {r.path} {r.protocol}" {r.status} '
        f"{r.flags} {r.bytes_received} {r.bytes_sent} {r.duration_ms} {r.upstream_service_time} "
        f'"{r.forwarded_for or "-"}" "{r.user_agent or "-"}" "{r.request_id or "-"}" "{r.authority or "-"}" '
        f'"{r.upstream_host or "-"}"'
    )


LINE = re.compile(
    r'^\[(?P<start>[^\]]+)\] "(?P<method>\S+) (?P<path>\S+) (?P<protocol>\S+)" (?P<status>\d+) '
    r"(?P<flags>\S+) (?P<rx>\d+) (?P<tx>\d+) (?P<duration>\d+) (?P<ust>\S+) "
    r'"(?P<xff>[^"]*)" "(?P<ua>[^"]*)" "(?P<request_id>[^"]*)" "(?P<authority>[^"]*)" '
    r'"(?P<upstream_host>[^"]*)"$'
)


def parse_line(line: str) -> dict[str, str] | None:
    """Read one access-log line back (for expectations and traces)."""
    m = LINE.match(line.strip())
    return m.groupdict() if m else None


MAX_BYTES = 64 * 1024 * 1024  # a flood of hostile requests must not fill the disk (kubelet would rotate)


class AccessLog:
    """The proxy's access log, capped at `max_bytes`: past the cap lines are counted, not written, and one
    comment line (which no access-log parser takes for a record) says so, another the count at close."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.max_bytes = path, max_bytes
        # Each line goes out in one write as the request ends (a reader sees it once the response is out),
        # without a text layer's buffering and flush around it.
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.written, self.dropped = os.fstat(self._fd).st_size, 0

    def write(self, record: AccessRecord) -> str:
        line = format_record(record)
        if self.written + len(line) + 1 > self.max_bytes:
            if not self.dropped:
                self._put(f"# ncpsim: access log capped at {self.max_bytes} bytes; later lines are counted")
            self.dropped += 1
            return line
        self.written += self._put(line)
        return line

    def _put(self, line: str) -> int:
        return os.write(self._fd, (line + "\n").encode("utf-8", "surrogateescape"))

    def close(self) -> None:
        if self._fd < 0:
            return
        if self.dropped:
            self._put(f"# ncpsim: {self.dropped} access-log lines dropped past the cap")
        os.close(self._fd)
        self._fd = -1


def read_access_log(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    return [rec for line in path.read_text().splitlines() if (rec := parse_line(line))]


def start_time(record: dict[str, str]) -> float:
    """A parsed line's START_TIME as epoch seconds (0.0 when it cannot be read)."""
    try:
        return (
            datetime.strptime(record.get("start", ""), "%Y-%m-%dT%H:%M:%S.%fZ")
            .replace(tzinfo=UTC)
            .timestamp()
        )
    except ValueError:
        return 0.0
