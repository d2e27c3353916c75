"""A flood of events is capped per component, and what was dropped is counted; a
restarted component appends to its events file, and mints from another seed for it."""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path

import pytest

from sim.model import events
from sim.model.events import EventLog, read_events
from sim.model.parts import CONTROL_CLUSTER
from sim.model.topology import build
from sim.model.values import DEFAULTS, deep_merge
from sim.runtime.component import Context


def test_events_past_the_cap_are_counted_not_written(tmp_path: Path) -> None:
    log = EventLog(tmp_path, "proxy", max_bytes=4096)
    for n in range(1000):
        log.emit("proxy.refused", target=f"10-42-0-{n % 250}.grpc-worker.example.com", reason="NR")
    log.close()
    size = (tmp_path / "events" / "proxy.jsonl").stat().st_size
    assert size < 4096 + 512  # the cap, plus the two records that say so
    kinds = [e["kind"] for e in read_events(tmp_path)]
    assert kinds.count("events.capped") == 1
    dropped = [e for e in read_events(tmp_path) if e["kind"] == "events.dropped"]
    assert len(dropped) == 1
    assert dropped[0]["count"] == 1000 - kinds.count("proxy.refused")
    assert dropped[0]["count"] > 900


class Stage(enum.Enum):
    TLS = "tls"


class Status(enum.IntEnum):
    OK = 200


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"requestId": "4f1c2a9e", "status": 200, "ms": 12.5, "ok": True, "error": None},
        {"z": 1, "a": {"y": [1, 2, {"b": 3, "a": 4}], "x": ()}},  # nested keys sorted too
        {"name": "nœud-é", "path": Path("/tmp/x"), "stage": Stage.TLS, "status": Status.OK},  # default=str
        {"nan": math.nan, "inf": -math.inf, "big": 10**30, "keys": {2: "a", 1: "b"}},
    ],
)
def test_an_event_line_is_what_json_dumps_writes(tmp_path: Path, fields: dict) -> None:
    log = EventLog(tmp_path, "pod")
    event = log.emit("pod.request", **fields)
    log.close()
    line = (tmp_path / "events" / "pod.jsonl").read_text()
    assert line == json.dumps(event, sort_keys=True, default=str) + "\n"


def test_without_the_c_encoder_a_line_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    event = {"z": 1, "a": {"y": Path("/x"), "x": "é"}, "kind": "pod.request"}
    fast = events._line_encoder()(event)
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)  # an interpreter without _json
    assert events._line_encoder()(event) == fast == json.dumps(event, sort_keys=True, default=str)


def test_a_closed_log_refuses_an_event(tmp_path: Path) -> None:
    log = EventLog(tmp_path, "pod")
    log.close()
    log.close()  # twice is harmless
    with pytest.raises(ValueError, match="closed"):
        log.emit("pod.request")


def test_a_reopened_log_keeps_counting_from_its_size(tmp_path: Path) -> None:
    first = EventLog(tmp_path, "proxy", max_bytes=600)
    first.emit("proxy.refused", reason="x" * 300)
    first.close()
    second = EventLog(tmp_path, "proxy", max_bytes=600)
    second.emit("proxy.refused", reason="y" * 300)  # would cross the cap with what the first wrote
    second.close()
    lines = [json.loads(line) for line in (tmp_path / "events" / "proxy.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in lines] == ["proxy.refused", "events.capped", "events.dropped"]


def test_under_the_cap_nothing_is_dropped(tmp_path: Path) -> None:
    log = EventLog(tmp_path, "proxy")
    log.emit("proxy.refused", reason="route_not_found")
    log.close()
    assert [e["kind"] for e in read_events(tmp_path)] == ["proxy.refused"]


def test_the_access_log_is_capped_and_says_how_many_lines_it_dropped(tmp_path: Path) -> None:
    from sim.proxy.access_log import AccessLog, AccessRecord, read_access_log

    log = AccessLog(tmp_path / "access.log", max_bytes=2048)
    for n in range(200):
        log.write(
            AccessRecord(start=1_764_500_000.0 + n, method="GET", path=f"/x{n}", status=404, flags="NR")
        )
    log.close()
    text = (tmp_path / "access.log").read_text()
    assert len(text) < 2048 + 200
    kept = read_access_log(tmp_path / "access.log")
    assert 0 < len(kept) < 200 and all(
        r["path"].startswith("/x") for r in kept
    )  # the comments parse as nothing
    assert text.splitlines()[-1] == f"# ncpsim: {200 - len(kept)} access-log lines dropped past the cap"


def test_a_restarted_pod_mints_other_request_ids(tmp_path: Path) -> None:
    """The first start of a pod mints what it minted in every replay; its restart (the same name, the
    events file already written to) mints anew, so no request id is handed out twice."""
    topology = build("ids", deep_merge(DEFAULTS, {}))
    first = Context(tmp_path, topology, "invocation-service-0", CONTROL_CLUSTER)
    again = Context(tmp_path / "other", topology, "invocation-service-0", CONTROL_CLUSTER)
    assert first.mint_seed == again.mint_seed  # reproducible: nothing earlier in either
    first.events.emit("component.ready")
    first.events.close()
    restarted = Context(tmp_path, topology, "invocation-service-0", CONTROL_CLUSTER)
    assert restarted.mint_seed != first.mint_seed
    restarted.events.close()
    again.events.close()
