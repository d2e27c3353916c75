"""`ncpsim replay --jobs N`'s argument. The replays themselves, side by side, each isolated, reported in the
order given, none left running: test_catalogue, whose module fixture replays the catalogue two at a time."""

from __future__ import annotations

import os

import pytest

from scenarios.load import load_scenario
from scenarios.replay import SLOWEST_FIRST, jobs_arg, start_order
from sim.errors import ConfigError


@pytest.mark.parametrize(("given", "jobs"), [(None, 1), ("1", 1), ("3", 3), (2, 2)])
def test_jobs_argument(given: object, jobs: int) -> None:
    assert jobs_arg(given) == jobs  # type: ignore[arg-type]


def test_auto_is_one_more_than_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert jobs_arg("auto") == 3


def test_the_slowest_start_first_and_the_rest_keep_their_order() -> None:
    scenarios = [load_scenario(name) for name in ("http-callback", "cert-rotation", "wrong-path")]
    scenarios += [load_scenario("nats-rolling-restart")]
    assert [scenarios[i].name for i in start_order(scenarios)] == [
        "nats-rolling-restart",
        "cert-rotation",
        "http-callback",
        "wrong-path",
    ]


def test_the_slowest_are_in_the_catalogue() -> None:
    assert all(load_scenario(name).name == name for name in SLOWEST_FIRST)  # a renamed one would be missed


@pytest.mark.parametrize("bad", ["0", "-1", "many"])
def test_bad_jobs_argument_is_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match="--jobs"):
        jobs_arg(bad)
