"""Redelivery on the real nats-server: 1,000 invocations while 10 workers are SIGKILLed mid-callback
(bench/redelivery.py). Long: it runs a 16-worker stack for about 20 s."""

from __future__ import annotations

import pytest

from bench.redelivery import KILLED_CLUSTERS, WORKERS_PER_CLUSTER, run

INVOCATIONS = 1000


@pytest.mark.long
@pytest.mark.timeout(600)
def test_nothing_lost_nothing_twice_when_workers_die_mid_callback() -> None:
    figures = run(INVOCATIONS, concurrency=100)
    assert figures["killed_workers"] == KILLED_CLUSTERS * WORKERS_PER_CLUSTER
    assert figures["callbacks_in_flight_on_killed_workers"] > 0  # they died mid-callback
    assert figures["lost"] == 0, figures["lost_examples"]
    assert figures["answered_twice"] == 0
    assert figures["answered"] + figures["documented_error"] == INVOCATIONS
    assert figures["answered_after_redelivery"] > 0  # redelivered work was answered by the survivors
