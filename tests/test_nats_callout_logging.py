"""The auth callout's logging as the seed describes it: zap's level and sampler, from
``natsAuthCalloutService.serviceConfig.logging``, on the live callout of a running stack.

The sampler from tables (time passed in); then one stack of 150 token-mode workers (300 sign-ins, one
per worker and function) whose burst the default sampling trims to about 100 lines a tick, and the same
stack after `setValues` turns sampling off and debug on (the callout restarts; redeployed workers sign
in again): every login logged, and each webhook request in a debug line. The second burst is the
negative control: it shows the first one was big enough for the sampler to act on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from clusters.local.plan import NATS_CALLOUT
from sim.errors import ConfigError
from sim.nats.callout import log_line
from sim.nats.zaplog import LogSettings, Sampler
from sim.pods.nats.callout_component import ZapSampling
from sim.runbooks.nats_auth import callout_config, callout_restart_reasons

OK = "Authentication successful"


def logging_values(**logging: Any) -> dict[str, Any]:
    return {"natsAuthCalloutService": {"serviceConfig": {"logging": logging, "port": 9999, "replicas": 3}}}


@pytest.mark.parametrize(
    ("values", "settings"),
    [
        ({}, LogSettings("info", 100, 100)),
        (logging_values(level="debug", sampling={"initial": 0}), LogSettings("debug", 0, 100)),
        (logging_values(sampling={"thereafter": 10}), LogSettings("info", 100, 10)),
        (logging_values(level="WARN"), LogSettings("warn", 100, 100)),
    ],
)
def test_only_service_config_logging_reaches_the_callout(
    values: dict[str, Any], settings: LogSettings
) -> None:
    assert LogSettings.from_values(values) == settings  # serviceConfig.port and .replicas change nothing


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (logging_values(level="verbose"), "logging.level: 'verbose' is not a zap level"),
        (logging_values(sampling={"initial": -1}), "logging.sampling.initial: must be a whole number"),
        (logging_values(sampling={"thereafter": "1"}), "logging.sampling.thereafter: must be a whole number"),
    ],
)
def test_logging_values_zap_cannot_read_are_refused(values: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        LogSettings.from_values(values)


@pytest.mark.parametrize(
    ("settings", "burst", "kept"),
    [
        (LogSettings(), 100, 100),
        (LogSettings(), 300, 102),  # the first 100, then the 200th and the 300th
        (LogSettings(), 1000, 109),
        (LogSettings(initial=0), 300, 300),  # the seed's "log every login"
        (LogSettings(initial=10, thereafter=1), 50, 50),
        (LogSettings(initial=10, thereafter=0), 50, 10),  # zap: nothing after the first ones
    ],
)
def test_the_sampler_keeps_the_first_ones_a_tick_then_one_in_thereafter(
    settings: LogSettings, burst: int, kept: int
) -> None:
    sampler = Sampler(settings)
    assert sum(sampler.allow("info", OK, 5.5) for _ in range(burst)) == kept


def test_a_tick_opens_at_its_first_line_per_level_and_message() -> None:
    sampler = Sampler(LogSettings(initial=1, thereafter=100))
    seen = [
        sampler.allow("info", "a", 0.6),  # opens a's tick, until 1.6
        sampler.allow("info", "a", 1.1),  # same tick (a wall-clock second would have reset here)
        sampler.allow("info", "b", 1.1),  # another message, its own count
        sampler.allow("error", "a", 1.1),  # another level, its own count
        sampler.allow("info", "a", 1.6),  # a new tick
    ]
    assert seen == [True, False, True, True, True]


def test_levels_below_the_setting_are_never_written() -> None:
    assert not Sampler(LogSettings("info")).allow("debug", "Sending webhook request", 1.0)
    assert Sampler(LogSettings("debug")).allow("debug", "Sending webhook request", 1.0)
    assert not Sampler(LogSettings("error")).allow("warn", "Authentication denied", 1.0)


def test_the_live_callouts_logger_samples_by_message() -> None:
    records: list[str] = []
    logger = logging.getLogger("test.zap.sampling")
    logger.propagate, logger.handlers = False, []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    handler.addFilter(ZapSampling(LogSettings()))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    for n in range(300):
        log_line(logger, logging.INFO, OK, client_name=f"worker-{n}")
    log_line(logger, logging.INFO, "Auth request received", client_name="other")
    assert len([r for r in records if r.startswith(OK)]) == 102  # one tick: the burst took well under 1 s
    assert records[-1].startswith("Auth request received")


def test_a_logging_change_restarts_the_callout() -> None:
    old, new = callout_config({}), callout_config(logging_values(level="debug"))
    assert callout_restart_reasons(old, new) == ["natsAuthCalloutService.serviceConfig.logging changed"]
    assert callout_restart_reasons(old, callout_config(logging_values(port=1))) == []


# -- on a running stack ------------------------------------------------------------------------------------
def ticks(lines: list[str]) -> list[int]:
    """How many lines each sampling tick wrote: a tick opens at the first line after the last one closed
    (a line that opens a tick is always written), and lasts one second."""
    return per_tick(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() for line in lines)


def per_tick(times: Iterable[float]) -> list[int]:
    """How many of `times` (seconds, in order) fall in each one-second tick, ticks opened as ticks() says."""
    counts: list[int] = []
    ends = None
    for at in times:
        if ends is None or at >= ends:
            counts.append(0)
            ends = at + 1.0
        counts[-1] += 1
    return counts


def callout_lines(state_dir: Path, since: int = 0) -> list[str]:
    return (state_dir / "logs" / f"{NATS_CALLOUT}.log").read_text().splitlines()[since:]


def test_150_workers_at_once_leave_about_100_lines_a_second_until_sampling_is_off(
    ncpsim_stack: Callable[..., Any],
) -> None:
    stack = ncpsim_stack(
        values={
            "workerCallbackProxy": {"enabled": True, "service": {"type": "LoadBalancer"}},
            "nats": {"workerAuth": "token", "config": {"cluster": {"enabled": False}}},
        },
        topology={
            "invocationReplicas": 1,
            "grpcProxyReplicas": 0,
            "computeClusters": [{"workers": [{"count": 75, "trust": "stack"}]} for _ in range(2)],
        },
    )
    signed_in = stack.events("nats.callout.login", outcome="successful")
    logins = len(signed_in)
    assert logins == 300  # 150 workers, each signed in once per function version
    sampled = [line for line in callout_lines(stack.state_dir) if f"INFO {OK}" in line]
    assert max(ticks(sampled)) <= 102
    # How dense the burst was is the machine's: on a busy one the 300 sign-ins spread over seconds. The
    # sampler drops lines only past 100 in a tick, so the judgement follows the burst the events show.
    burst = max(per_tick(sorted(event["ts"] for event in signed_in)))
    if burst > 110:
        assert len(sampled) < logins, f"{burst} sign-ins in one second, none dropped"
    elif burst < 90:
        assert len(sampled) == logins, f"at most {burst} sign-ins a second, yet lines were dropped"
    assert not any(" DEBUG " in line for line in callout_lines(stack.state_dir))

    seen = len(callout_lines(stack.state_dir))
    stack.set_values(logging_values(level="debug", sampling={"initial": 0}), redeploy="workers")
    assert len(stack.events("component.ready", component=NATS_CALLOUT)) == 2  # the change restarted it
    assert len(stack.events("nats.callout.login", outcome="successful")) == 2 * logins  # all signed in again
    after = callout_lines(stack.state_dir, seen)
    every = [line for line in after if f"INFO {OK}" in line]
    assert len(every) == logins  # sampling off: every login logged, however dense the burst
    requests = [line for line in after if "DEBUG Sending webhook request" in line]
    assert len(requests) == logins and all(
        '"url": "http://api.nvcf.svc.cluster.local:8080/' in r for r in requests
    )
