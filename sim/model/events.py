"""Structured JSON-lines events, one file per component in <state>/events/, and the catalogue of the kinds
the replay engine reads.

The replay engine reads them back to check expectations and draw each callback's sequence, so every
component writes what it decided, with the request id whenever it knows one. Each kind the engine reads is
named here once, for its emitter and its readers alike; the four a callback's trace is joined from are
read into typed records (CallbackStart, CallbackResult, PodLeg, Decision), so no reader digs in the JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Event = dict[str, Any]  # one event as written and read back: ts, component, kind and its own fields

# The kinds the replay engine reads (scenarios/), each with its emitter ------------------------------------
CALLBACK_START = (
    "worker.callback.start"  # a worker begins a callback (sim.worker.http_callback, grpc_callback)
)
CALLBACK_RESULT = "worker.callback.result"  # ... and how it ended: its stage, statuses, DNS answer, error
ATTACH_GET = "attach.get"  # a request-attach GET as an invocation-service pod served it (sim.pods.invocation)
ATTACH_POST = "attach.post"  # ... the POST of the response
POD_REQUEST = "pod.request"  # every request an invocation-service pod received, routed or not
GRPC_ACCEPTED = "grpc.callback.accepted"  # a grpc-proxy pod took a worker's callback (sim.pods.grpcproxy)
GRPC_REJECTED = "grpc.callback.rejected"  # ... or refused it, with the status and message
TOKEN_MINTED = "grpc.token.minted"  # a grpc-proxy pod minted a callback token for a client's gRPC call
PROXY_DECISION = "proxy.decision"  # the proxy refused or tunnelled a request (sim.proxy.http_front)
STEP_START = "step.start"  # the replay engine begins a step (scenarios.engine), for `wait` conditions
WORKER_NATS_CONNECTED = "worker.nats.connected"  # a worker signed in to NATS (sim.worker.nats_links)
WORKER_NATS_REFUSED = "worker.nats.refused"  # ... or was refused (diagnose reads both)

ENGINE_KINDS = (  # the catalogue: tests/test_types.py holds every emitter and reader to these names
    CALLBACK_START,
    CALLBACK_RESULT,
    ATTACH_GET,
    ATTACH_POST,
    POD_REQUEST,
    GRPC_ACCEPTED,
    GRPC_REJECTED,
    TOKEN_MINTED,
    PROXY_DECISION,
    STEP_START,
    WORKER_NATS_CONNECTED,
    WORKER_NATS_REFUSED,
)
ATTACH_LEGS = (ATTACH_GET, ATTACH_POST)  # an HTTP callback's legs, traced by the worker's bearer tokens
POD_LEGS = (*ATTACH_LEGS, GRPC_ACCEPTED, GRPC_REJECTED)  # a callback as the pods saw it
PROBE_LEGS = (POD_REQUEST,)  # a probe must not reach a pod at all, whatever the path


@dataclass(frozen=True)
class CallbackStart:
    """A worker begins the callback of `request_id` (worker.callback.start)."""

    request_id: str | None
    ts: float
    callback: str | None  # http | grpc
    target: str | None  # HTTP: the pod target the worker was handed
    proxy: bool  # through the proxy (an HTTP proxyURI; a gRPC connect URL that is not the pod's own name)
    connect: bool  # a worker older than 1.3.2: CONNECT, then its own TLS to the pod
    tokens: tuple[str, ...]  # fingerprints of the bearer tokens it was handed (HTTP)

    @classmethod
    def read(cls, event: Event) -> CallbackStart:
        return cls(
            event.get("requestId"),
            float(event.get("ts", 0.0)),
            event.get("callback"),
            event.get("target"),
            bool(event.get("proxy")),
            bool(event.get("connect")),
            tuple(t for t in event.get("tokens") or () if t),
        )


@dataclass(frozen=True)
class CallbackResult:
    """How the worker's callback of `request_id` ended (worker.callback.result)."""

    request_id: str | None
    ts: float
    worker: str | None
    ok: bool
    stage: str | None  # how far it got: dns, tls, get, post, done (HTTP); the attempt's stage (gRPC)
    statuses: tuple[int, ...]  # the HTTP statuses it got, leg by leg
    dns: dict[str, Any]  # the last DNS answer it got (answer or rcode)
    connections: tuple[str, ...]  # per leg or attempt: "new" (dialed) or "reused" (kept alive)
    error: str | None  # as the worker logs it (Go's words)
    cause: str | None  # ncpsim's own account of the failure

    @classmethod
    def read(cls, event: Event) -> CallbackResult:
        return cls(
            event.get("requestId"),
            float(event.get("ts", 0.0)),
            event.get("worker"),
            bool(event.get("ok")),
            event.get("stage"),
            tuple(event.get("statuses") or ()),
            event.get("dns") or {},
            tuple(event.get("connections") or ()),
            event.get("error"),
            event.get("cause"),
        )


@dataclass(frozen=True)
class PodLeg:
    """A request as a pod saw it: a request-attach leg, a gRPC callback, or any request (pod.request)."""

    kind: str
    request_id: str | None
    pod: str | None
    status: int | None  # None: a bare pod.request, answered after it was recorded
    reason: str | None
    path: str | None
    x_request_id: str | None  # the proxy's id for the request (workers send none), as its access log shows it
    token: str | None  # the fingerprint of the bearer the leg carried

    @classmethod
    def read(cls, event: Event) -> PodLeg:
        kind = str(event["kind"])
        return cls(
            kind,
            event.get("requestId"),
            event.get("pod"),
            event.get("status", None if kind == POD_REQUEST else 200),
            event.get("reason"),
            event.get("path"),
            event.get("xRequestId"),
            event.get("token"),
        )

    def as_dict(self) -> dict[str, Any]:
        """The leg as a trace reports it."""
        return {
            "kind": self.kind,
            "pod": self.pod,
            "status": self.status,
            "reason": self.reason,
            "path": self.path,
        }


@dataclass(frozen=True)
class Decision:
    """The proxy's decision on a request it did not forward (proxy.decision)."""

    request_id: str | None
    method: str | None
    target: str | None
    decision: str | None  # Reject | Tunnel
    status: int | None
    flag: str | None  # Envoy's response flag (NR, DPE, ...)
    reason: str | None

    @classmethod
    def read(cls, event: Event) -> Decision:
        return cls(
            event.get("requestId"),
            event.get("method"),
            event.get("target"),
            event.get("decision"),
            event.get("status"),
            event.get("flag"),
            event.get("reason"),
        )

    def as_dict(self) -> dict[str, Any]:
        """The decision as a trace reports it, with its reasons."""
        return {
            "method": self.method,
            "target": self.target,
            "decision": self.decision,
            "status": self.status,
            "flag": self.flag,
            "reason": self.reason,
        }


MAX_BYTES = 16 * 1024 * 1024  # per component: a flood of events must not fill the disk


def _line_encoder() -> Any:
    """What json.dumps(event, sort_keys=True, default=str) writes, with its C encoder built once: dumps
    builds a JSONEncoder and a C encoder for every call, a third of an event's cost at a pod writing
    nine a callback. json's own pure-Python encoder where the C one is missing (another interpreter)."""
    encoder = json.JSONEncoder(sort_keys=True, default=str)
    make = getattr(json.encoder, "c_make_encoder", None)  # CPython's _json; not in json's typed interface
    if make is None:
        return encoder.encode
    c_encode = make(
        None,  # no circular check: an event is made of its fields, never of itself
        encoder.default,
        json.encoder.encode_basestring_ascii,
        None,  # no indent
        encoder.key_separator,
        encoder.item_separator,
        True,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    return lambda event: "".join(c_encode(event, 0))


_encode = _line_encoder()


class EventLog:
    """One component's events, capped at `max_bytes`; past the cap events are counted, not written, and
    the count is written as one `events.dropped` record when the log closes.

    Each event is one write(2) of its whole line to a file opened for appending: a crashed (SIGKILLed)
    component leaves every event it wrote, and a reader sees whole lines or, at the very end, a part."""

    def __init__(self, state_dir: Path, component: str, max_bytes: int = MAX_BYTES):
        self.component, self.max_bytes = component, max_bytes
        folder = state_dir / "events"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{component}.jsonl"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.written = os.fstat(self._fd).st_size
        self.dropped = 0
        self.failed: OSError | None = (
            None  # a write refused (a full disk): later events are counted, not written
        )

    def emit(self, kind: str, /, **fields: Any) -> dict[str, Any]:
        if "kind" in fields:
            raise ValueError("'kind' names the event type; call the field something else (e.g. 'callback')")
        event = {"ts": time.time(), "component": self.component, "kind": kind, **fields}
        self._append((_encode(event) + "\n").encode(), event["ts"])
        return event

    def _append(self, line: bytes, ts: float) -> None:
        if self.written + len(line) > self.max_bytes:
            if not self.dropped:
                self._write(
                    {
                        "ts": ts,
                        "component": self.component,
                        "kind": "events.capped",
                        "maxBytes": self.max_bytes,
                    }
                )
            self.dropped += 1
            return
        self._write_line(line)

    def _write(self, event: dict[str, Any]) -> None:
        self._write_line((_encode(event) + "\n").encode())

    def _write_line(self, line: bytes) -> None:
        """A component keeps serving whatever its disk does: a refused write (ENOSPC, EIO) stops the log,
        says so once on stderr (the component's log, if that disk still takes it), and counts what follows."""
        if self._fd < 0:
            raise ValueError(f"event log {self.path} is closed")
        if self.failed is not None:
            self.dropped += 1
            return
        try:
            written = os.write(self._fd, line)
            while written < len(line):  # a regular file takes a line whole unless the disk fills under it
                written += os.write(self._fd, line[written:])
        except OSError as exc:
            self.failed, self.dropped = exc, self.dropped + 1
            with contextlib.suppress(OSError, ValueError):
                print(
                    f"events: cannot write {self.path}: {exc.strerror or exc}; later events are not kept",
                    file=sys.stderr,
                    flush=True,
                )
            return
        self.written += len(line)

    def close(self) -> None:
        if self._fd < 0:
            return
        if self.dropped and self.failed is None:
            self._write(
                {
                    "ts": time.time(),
                    "component": self.component,
                    "kind": "events.dropped",
                    "count": self.dropped,
                }
            )
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = -1


def read_events(state_dir: Path, since: float = 0.0) -> list[Event]:
    """All components' events, oldest first. Partial trailing lines (a writer mid-line) are skipped."""
    events: list[Event] = []
    for path in sorted((state_dir / "events").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("ts", 0) >= since:
                events.append(event)
    events.sort(key=lambda e: e["ts"])
    return events


def of_kind(events: list[Event], kind: str, **match: Any) -> list[Event]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]
