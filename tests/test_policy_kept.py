"""What the proxy keeps instead of computing per request: answers that cannot differ (sim/proxy/policy.py,
sim/proxy/access_log.py). Each kept value equals the computed one, and the keeping is bounded."""

from __future__ import annotations

from email.utils import formatdate

import pytest

from sim.proxy import policy
from sim.proxy.access_log import AccessRecord, format_record
from sim.proxy.policy import KEPT_TARGET, ProxyPolicy, RequestHead, http_date, route_forward, route_target

POD = "10-42-0-11.invocation.nvcf.svc.cluster.local"
TARGETS = [
    f"http://{POD}:8443/v2/nvcf/worker/request-attach",
    f"http://{POD}:8443/v2/nvcf/worker/request-attach?a=1",
    f"HTTP://{POD}:8443/v2/nvcf/worker/request-attach",
    f"http://{POD}:8080/v2/nvcf/worker/request-attach",
    f"http://{POD}:8443/v2/nvcf/x",
    f"http://u@{POD}:8443/v2/nvcf/worker/request-attach",
    "http://[",
    "/v2/nvcf/worker/request-attach",
    f"http://{POD}:8443/v2/nvcf/worker/request-attach?" + "a" * KEPT_TARGET,
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pol", [ProxyPolicy(), ProxyPolicy(upstream_tls=False)])
def test_a_kept_route_is_the_computed_one(target: str, pol: ProxyPolicy) -> None:
    for _ in range(2):  # the second time from what was kept
        assert route_forward(RequestHead("GET", target), pol) == route_target(target, pol)


def test_only_short_targets_are_kept() -> None:
    """A flood of long distinct targets must not fill memory: the negative control is a short one, kept."""
    policy._kept_route.cache_clear()
    short, long = TARGETS[0], TARGETS[-1]
    route_forward(RequestHead("GET", long), ProxyPolicy())
    assert policy._kept_route.cache_info().currsize == 0
    route_forward(RequestHead("GET", short), ProxyPolicy())
    assert policy._kept_route.cache_info().currsize == 1


@pytest.mark.parametrize("epoch", [0.0, 1767225600.0, 1767225600.999, 1767225601.0, 1796305702.395])
def test_the_date_kept_for_a_second_is_that_seconds(epoch: float) -> None:
    assert http_date(epoch) == formatdate(epoch, usegmt=True)


@pytest.mark.parametrize(
    ("start", "stamp"),
    [
        (1767225600.0, "2026-01-01T00:00:00.000Z"),
        (1767225600.123, "2026-01-01T00:00:00.123Z"),
        (1767225600.999, "2026-01-01T00:00:00.999Z"),
        (1767225661.5, "2026-01-01T00:01:01.500Z"),
    ],
)
def test_start_time_from_the_kept_second(start: float, stamp: str) -> None:
    assert format_record(AccessRecord(start=start)).startswith(f"[{stamp}] ")
