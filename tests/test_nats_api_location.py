"""Where the NVCF API runs: its namespace and Service are values, and the auth callout's webhook URL is
resolved and dialed like any in-cluster name (the control plane's DNS view, the network map).

One stack whose API runs in namespace nvcf-api: the URL that names it lets token-mode workers in; each
wrong URL, set with `setValues` (the callout restarts), fails the next sign-in with a worker's token with
what the callout would log: connection refused on a port the Service does not have, no such host for the
default name, and a 404 only where the API answers, on another path. The sign-in is the test's own (the
running workers keep their connections); redeployed workers meeting a wrong URL are the catalogue's
nats-api-namespace-wrong. Set right again, redeployed workers sign in and take work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from nats_support import refused, run

from clusters.local.plan import NATS_CALLOUT
from sim.errors import ConfigError
from sim.model.topology import build
from sim.model.values_check import check
from sim.nats.stack import StackKeys, worker_credentials

RIGHT = "http://api.nvcf-api.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth"
WD = {"workerCallbackProxy": {"workerDomain": "w.example.com"}}


def test_the_api_service_is_where_the_values_say_and_in_the_control_planes_dns_view() -> None:
    topology = build("t", {**WD, "api": {"namespace": "nvcf-api", "service": {"name": "nvcf", "port": 9000}}})
    api = topology.api_service
    assert (api.fqdn, api.address) == ("nvcf.nvcf-api.svc.cluster.local", "10.43.0.40:9000/tcp")
    views = topology.dns_views()
    assert ("nvcf.nvcf-api.svc.cluster.local", "10.43.0.40") in views["ncpsim-cp"].hosts
    assert ("api.nvcf.svc.cluster.local", "10.43.0.40") not in views["ncpsim-cp"].hosts  # not where it runs
    default = build("t", WD).api_service
    assert default.fqdn == "api.nvcf.svc.cluster.local" and default.port == 8080  # the seed's default URL


@pytest.mark.parametrize(
    ("api", "error"),
    [
        ({"namespace": "NVCF"}, "api.namespace: must be a DNS label"),
        ({"service": {"name": "api.x"}}, "api.service.name: must be a DNS label"),
        ({"service": {"port": 70000}}, "api.service.port: must be a port number"),
    ],
)
def test_an_api_location_kubernetes_would_refuse_is_refused(api: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        check({"api": api})


def failures(stack: Any, since: int) -> list[str]:
    return [e["error"] for e in stack.events("nats.callout.login", outcome="failed")[since:]]


def test_the_webhook_url_reaches_the_api_where_it_runs_and_fails_as_the_callout_would_elsewhere(
    ncpsim_stack: Callable[..., Any],
) -> None:
    stack = ncpsim_stack(
        values={
            "workerCallbackProxy": {"enabled": True, "service": {"type": "LoadBalancer"}},
            "api": {"namespace": "nvcf-api"},
            "nats": {
                "workerAuth": "token",
                "authCallout": {"workerTokenAuth": {"webhookUrl": RIGHT}},
                "config": {"cluster": {"enabled": False}},
            },
        },
    )
    assert all(t.outcome == "success" for t in stack.invoke("http-echo", count=2))
    signed_in = stack.events("nats.callout.login", outcome="successful", plugin="webhook")
    assert len(signed_in) == 4
    log = stack.state_dir / "logs" / f"{NATS_CALLOUT}.log"
    nats = stack.status()["nats"]
    url = f"nats://{nats['host']}:{nats['port']}"
    worker = worker_credentials(StackKeys.of(stack.topology), "token", "worker-1-0", "http-echo")
    wrong = {
        RIGHT.replace(":8080", ":8081"): "dial tcp 10.43.0.40:8081: connect: connection refused",
        "http://api.nvcf.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth": (
            "dial tcp: lookup api.nvcf.svc.cluster.local on 10.43.0.10:53: no such host"
        ),
        RIGHT.replace("/webhook/", "/hooks/"): "webhook client error: 404",
    }
    for webhook, said in wrong.items():
        before = len(stack.events("nats.callout.login", outcome="failed"))
        stack.set_values({"nats": {"authCallout": {"workerTokenAuth": {"webhookUrl": webhook}}}})
        assert "Authorization Violation" in run(refused(url, **worker.connect_kwargs))
        errors = failures(stack, before)
        assert errors and all(said in error for error in errors), (webhook, errors)
        assert said in log.read_text()  # the callout's own log, as `kubectl logs` would show it
    stack.set_values(
        {"nats": {"authCallout": {"workerTokenAuth": {"webhookUrl": RIGHT}}}}, redeploy="workers"
    )
    again = stack.events("nats.callout.login", outcome="successful", plugin="webhook")
    assert len(again) == len(signed_in) + 4  # the redeployed workers signed in through the API
    assert all(t.outcome == "success" for t in stack.invoke("http-echo", count=2))  # and back
