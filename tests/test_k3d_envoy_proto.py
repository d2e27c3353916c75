"""The rendered Envoy config parsed against Envoy's v3 API (envoy-data-plane: the data-plane-api
protos as Python classes). Unknown fields, wrong value types, misplaced fields and unknown ``@type``
URLs all fail here, down into every typed_config. No Envoy binary is needed; the package is in the
test extra (it is not a dependency of ncpsim itself)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from clusters.render.envoy import render_envoy
from sim.proxy.policy import ProxyPolicy

POLICIES = [ProxyPolicy(tls, connect) for tls in (True, False) for connect in (False, True)]


def type_urls(node: Any) -> set[str]:
    if isinstance(node, dict):
        own = {node["@type"]} if "@type" in node else set()
        return own | {url for value in node.values() for url in type_urls(value)}
    if isinstance(node, list):
        return {url for item in node for url in type_urls(item)}
    return set()


@pytest.fixture(scope="module")
def envoy_v3() -> tuple[Any, Any]:
    """The bootstrap and discovery APIs, imported by the worker that runs these tests only (a few seconds
    of generated classes: every worker would pay them at collection)."""
    return (
        importlib.import_module("envoy_data_plane.envoy.config.bootstrap.v3"),
        importlib.import_module("envoy_data_plane.envoy.service.discovery.v3"),
    )


def register(urls: set[str]) -> None:
    """Importing a message's module registers it for Any unpacking; a missing one is an unknown type."""
    for url in urls:
        module, _, name = url.removeprefix("type.googleapis.com/").rpartition(".")
        assert hasattr(importlib.import_module(f"envoy_data_plane.{module}"), name), url


@pytest.mark.parametrize(
    "policy", POLICIES, ids=lambda p: f"tls={p.upstream_tls},connect={p.connect_enabled}"
)
def test_bootstrap_and_sds_files_parse_as_envoy_v3(policy: ProxyPolicy, envoy_v3: tuple[Any, Any]) -> None:
    bootstrap_v3, discovery_v3 = envoy_v3
    config = render_envoy(policy, "grpc-worker.example.com")
    register(type_urls(config.bootstrap) | type_urls(config.sds))
    parsed = bootstrap_v3.Bootstrap.from_dict(config.bootstrap)  # raises on any unknown field
    assert len(parsed.static_resources.listeners) == 2
    manager = parsed.static_resources.listeners[0].filter_chains[0].filters[0].typed_config.unpack()
    assert manager.max_request_headers_kb == 60 and manager.http_protocol_options.allow_absolute_url
    for body in config.sds.values():
        discovery_v3.DiscoveryResponse.from_dict(body)


def test_the_parse_is_strict(envoy_v3: tuple[Any, Any]) -> None:
    bootstrap_v3, _ = envoy_v3
    config = render_envoy(ProxyPolicy(), "grpc-worker.example.com").bootstrap
    register(type_urls(config))
    route = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    route["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["request_headers_to_remove"] = ["x"]
    with pytest.raises(KeyError, match="request_headers_to_remove"):  # belongs on the Route, not its action
        bootstrap_v3.Bootstrap.from_dict(config)
