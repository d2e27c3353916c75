"""Values: merging, every validation rule (pass and fail), file origins, YAML errors, proxy settings."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certs.profiles import FRONTEND_SECRET, PUBLIC, PUBLIC_FRONTEND_SECRET, STACK, frontend_profile
from sim.errors import ConfigError, NcpsimError
from sim.model.values import DEFAULTS, ProxySettings, deep_merge, lookup, merged_lookup, proxy_settings
from sim.model.values_check import ValuesIssue, check, validate
from sim.model.values_file import load_values_file

WD = "grpc-worker.example.com"


def nested(path: str, value: Any) -> dict:
    """``nested("a.b", 1) == {"a": {"b": 1}}``, for table rows."""
    out: Any = value
    for key in reversed(path.split(".")):
        out = {key: out}
    return out


def paths(values: dict) -> list[str]:
    return [issue.path for issue in validate(values)]


# -- deep_merge -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("base", "override", "expected"),
    [
        ({"a": 1}, {"b": 2}, {"a": 1, "b": 2}),
        ({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}, {"a": {"b": 1, "c": 3}}),
        ({"a": {"b": {"c": 1}}}, {"a": {"b": {"d": 2}}}, {"a": {"b": {"c": 1, "d": 2}}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": {"b": 1}}, {"a": None}, {"a": None}),
        ({"a": {"b": 1}}, {"a": "x"}, {"a": "x"}),
        ({"a": "x"}, {"a": {"b": 1}}, {"a": {"b": 1}}),
        ({"a": {"b": 1}}, {"a": {}}, {"a": {"b": 1}}),
        ({"a": 1}, {}, {"a": 1}),
        ({}, {"a": {"b": [1]}}, {"a": {"b": [1]}}),
    ],
)
def test_deep_merge(base: dict, override: dict, expected: dict) -> None:
    before = (copy.deepcopy(base), copy.deepcopy(override))
    assert deep_merge(base, override) == expected
    assert (base, override) == before


def test_deep_merge_copies() -> None:
    override = {"a": {"b": [1]}}
    merged = deep_merge(DEFAULTS, override)
    merged["a"]["b"].append(2)
    merged["workerCallbackProxy"]["service"]["type"] = "NodePort"
    assert override == {"a": {"b": [1]}}
    assert DEFAULTS["workerCallbackProxy"]["service"]["type"] == "ClusterIP"


_KEYS = st.sampled_from("abc")
_trees = st.recursive(
    st.integers(0, 3) | st.none() | st.lists(st.integers(0, 3), max_size=2),
    lambda inner: st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_KEYS, _trees, max_size=3), st.dictionaries(_KEYS, _trees, max_size=3))
def test_deep_merge_properties(base: dict, override: dict) -> None:
    merged = deep_merge(base, override)
    assert deep_merge(merged, override) == merged  # applying the same override twice changes nothing
    assert deep_merge(base, {}) == base and deep_merge({}, override) == override
    for key, value in override.items():
        if not isinstance(value, dict):
            assert merged[key] == value


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(_KEYS, _trees, max_size=3),
    st.dictionaries(_KEYS, _trees, max_size=3),
    st.lists(_KEYS, min_size=1, max_size=3).map(tuple),
)
def test_merged_lookup_reads_what_the_merge_holds(base: dict, override: dict, path: tuple[str, ...]) -> None:
    missing = object()
    assert merged_lookup(base, override, path, missing) == lookup(deep_merge(base, override), path, missing)


# -- validation: one row per rule, failing and passing ------------------------------------------------------
ON = {"workerCallbackProxy": {"enabled": True}}
OFF = {"workerCallbackProxy": {"enabled": False}}
SPLIT = [
    "global.workerEndpoints.invocationServiceURL",
    "global.workerEndpoints.grpcProxyWorkerConnectURL",
    "grpcproxy.workerConnectBaseURL",
    "invocation.env.WORKER_STREAM_PROPERTIES__SELF_ADDRESS",
]
BOOLS = [
    "workerCallbackProxy.enabled",
    "workerCallbackProxy.invocation.upstreamTls.enabled",
    "workerCallbackProxy.invocation.connect.enabled",
    "adminIssuerProxy.enabled",
    "adminIssuerProxy.gateway.enabled",
]
ANNOTATIONS = [
    f"{svc}.podAnnotations"
    for svc in (
        "api",
        "nvctApi",
        "invocation",
        "grpcproxy",
        "apikeys",
        "ess",
        "natsAuthCalloutService",
        "nats",
    )
]
ANNOTATIONS.append("openbao.server.annotations")
URL = "global.workerEndpoints.invocationProxyURL"
REF = "workerCallbackProxy.tls.frontend.certificate.issuerRef"
SECRET = "workerCallbackProxy.tls.frontend.existingSecret"
WEBHOOK = "nats.authCallout.workerTokenAuth.webhookUrl"
WDP = "workerCallbackProxy.workerDomain"
TYPE = "workerCallbackProxy.service.type"
AUTH = "nats.workerAuth"
CLUSTER_ISSUER = {"kind": "ClusterIssuer", "name": "letsencrypt"}


def on(path: str, value: Any) -> dict:
    """The proxy enabled (it is off by default, as in the stack) and one more key set."""
    return deep_merge(ON, nested(path, value))


FAILING: list[tuple[str, dict, str, str]] = [
    ("domain underscore", on(WDP, "grpc_worker.example.com"), WDP, "grpc_worker"),
    ("domain one label", on(WDP, "localhost"), WDP, "two labels"),
    ("domain dash", on(WDP, "-grpc.example.com"), WDP, '"-grpc"'),
    ("domain upper", on(WDP, "Grpc.example.com"), WDP, "lower case"),
    ("domain dot", on(WDP, "grpc.example.com."), WDP, "trailing dot"),
    ("domain wildcard", on(WDP, "*.example.com"), WDP, "'*'"),
    ("domain empty", on(WDP, ""), WDP, "must be set"),
    ("domain number", on(WDP, 42), WDP, "must be set"),
    # Checked with the proxy off too: the stack issues *.<workerDomain> whatever `enabled` says, and a name
    # DNS cannot carry raised IDNAError there (issue 31); the chart alone would not look at it.
    ("bad domain, proxy off by default", nested(WDP, "not a domain"), WDP, "not a valid DNS name"),
    ("bad domain with proxy off", deep_merge(OFF, nested(WDP, "not a domain")), WDP, "not a valid DNS name"),
    ("proxy url host label too long", on(URL, f"https://{'a' * 64}.{WD}:10084"), URL, "1-63"),
    ("long label with proxy off", deep_merge(OFF, nested(WDP, "a" * 64 + ".example.com")), WDP, "1-63"),
    *[(f"split {p}", deep_merge(ON, nested(p, "http://x:1")), p, "must be empty when") for p in SPLIT],
    ("url http", nested(URL, f"http://invocation.{WD}:10084"), URL, "https"),
    ("url two labels", nested(URL, f"https://a.b.{WD}:10084"), URL, "not covered"),
    ("url bare domain", nested(URL, f"https://{WD}"), URL, "not covered"),
    ("url other domain", nested(URL, "https://invocation.example.org"), URL, "not covered"),
    ("url not text", nested(URL, 10084), URL, "https URL"),
    ("url bad port", nested(URL, f"https://invocation.{WD}:99999"), URL, "not a URL"),
    ("issuer and secret", deep_merge(nested(REF, CLUSTER_ISSUER), nested(SECRET, "x")), SECRET, "only one"),
    ("issuerRef no name", nested(REF, {"kind": "ClusterIssuer"}), f"{REF}.name", "must be set"),
    ("issuerRef no kind", nested(REF, {"name": "le"}), f"{REF}.kind", "must be set"),
    ("issuerRef string", nested(REF, "letsencrypt"), REF, "kind and name"),
    ("existingSecret list", nested(SECRET, ["a"]), SECRET, "Secret"),
    ("service type", nested(TYPE, "Ingress"), TYPE, "ClusterIP, NodePort, LoadBalancer"),
    *[(f"bool {p}", nested(p, "true"), p, "true or false") for p in BOOLS],
    *[(f"bool null {p}", nested(p, None), p, "found null") for p in BOOLS],
    ("nats mode", nested(AUTH, "jwt"), AUTH, "nats.workerAuth must be nkey or token"),
    (
        "nats token no url",
        deep_merge(nested("nats.workerAuth", "token"), nested(WEBHOOK, "")),
        WEBHOOK,
        "must be set when nats.workerAuth is token",
    ),
    *[(f"annotation int {p}", nested(p, {"a": 8080}), f"{p}.a", '"8080"') for p in ANNOTATIONS],
    *[(f"annotation bool {p}", nested(p, {"a": True}), f"{p}.a", '"true"') for p in ANNOTATIONS],
    *[
        (
            f"reserved {p}",
            nested(p, {"nvcf.nvidia.com/nats-worker-auth-hash": "x"}),
            f'{p}["nvcf.nvidia.com/nats-worker-auth-hash"]',
            "reserved",
        )
        for p in ANNOTATIONS
    ],
    (
        "reserved exact",
        nested("api.podAnnotations", {"nvcf.nvidia.com/nats-worker-auth": "x"}),
        'api.podAnnotations["nvcf.nvidia.com/nats-worker-auth"]',
        "reserved",
    ),
    (
        "checksum",
        nested("nats.podAnnotations", {"checksum/config": "abc"}),
        "nats.podAnnotations.checksum/config",
        "managed by the chart",
    ),
    ("mapping expected", {"workerCallbackProxy": "yes"}, "workerCallbackProxy", "must be a mapping"),
    ("nested mapping", nested("global.workerEndpoints", []), "global.workerEndpoints", "found a list"),
    ("annotations list", nested("api.podAnnotations", ["a"]), "api.podAnnotations", "must be a mapping"),
]


@pytest.mark.parametrize(
    ("values", "path", "fragment"), [r[1:] for r in FAILING], ids=[r[0] for r in FAILING]
)
def test_rule_fails(values: dict, path: str, fragment: str) -> None:
    issues = validate(values)
    assert [issue.path for issue in issues] == [path]  # exactly one issue: no follow-on noise
    assert fragment in issues[0].message


PASSING: list[tuple[str, dict]] = [
    ("defaults", {}),
    ("empty domain with proxy off", deep_merge(OFF, nested(WDP, ""))),
    *[(f"split {p} with proxy off", deep_merge(OFF, nested(p, "http://x:1"))) for p in SPLIT],
    *[(f"split {p} empty", nested(p, "")) for p in SPLIT],
    ("url default name", nested(URL, f"https://invocation.{WD}:10084")),
    ("url other label and port", nested(URL, f"https://callbacks.{WD}:443/")),
    ("url other domain", deep_merge(nested(WDP, "w.example.org"), nested(URL, "https://x.w.example.org"))),
    ("issuerRef", nested(REF, CLUSTER_ISSUER)),
    ("existingSecret", nested(SECRET, "worker-public-tls")),
    ("existingSecret empty with issuerRef", deep_merge(nested(REF, CLUSTER_ISSUER), nested(SECRET, ""))),
    *[
        (f"service {t}", nested("workerCallbackProxy.service.type", t))
        for t in ("ClusterIP", "NodePort", "LoadBalancer")
    ],
    *[(f"bool {p}", nested(p, False)) for p in BOOLS],
    ("nats token default url", nested("nats.workerAuth", "token")),
    (
        "nats token url",
        deep_merge(nested("nats.workerAuth", "token"), nested(WEBHOOK, "http://api.x:8080/h")),
    ),
    ("nats nkey empty url", nested(WEBHOOK, "")),
    *[(f"annotation {p}", nested(p, {"example.com/scrape": "true", "port": "8080"})) for p in ANNOTATIONS],
    *[(f"annotation null {p}", nested(p, None)) for p in ANNOTATIONS],
    ("similar to reserved", nested("api.podAnnotations", {"nvcf.nvidia.com/other": "x"})),
    ("unknown keys", {"cassandra": {"replicas": 3}, "foo": 1, "workerCallbackProxy": {"replicas": 2}}),
    ("admin proxy off", {"adminIssuerProxy": {"enabled": False, "gateway": {"enabled": False}}}),
]


@pytest.mark.parametrize("values", [row[1] for row in PASSING], ids=[row[0] for row in PASSING])
def test_rule_passes(values: dict) -> None:
    assert validate(values) == []
    check(values)  # does not raise


def test_validate_accepts_merged_values_and_top_level_garbage() -> None:
    assert validate(DEFAULTS) == []
    assert [str(i) for i in validate(["a"])] == ["top level must be a mapping of keys, found a list"]


def test_several_issues_in_rule_order() -> None:
    values = deep_merge(nested("nats.workerAuth", "jwt"), on(WDP, "bad_domain.example"))
    assert paths(values) == [WDP, "nats.workerAuth"]


# -- issue text and check() --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("issue", "text"),
    [
        (ValuesIssue("a.b", "must be x", "env.yaml", 3), "env.yaml:3: a.b: must be x"),
        (ValuesIssue("a.b", "must be x", "env.yaml"), "env.yaml: a.b: must be x"),
        (ValuesIssue("a.b", "must be x"), "a.b: must be x"),
        (ValuesIssue("a.b", "must be x", None, 3), "line 3: a.b: must be x"),
        (
            ValuesIssue("nats.workerAuth", "nats.workerAuth must be nkey or token", "e.yaml", 2),
            "e.yaml:2: nats.workerAuth must be nkey or token",
        ),
    ],
)
def test_issue_text(issue: ValuesIssue, text: str) -> None:
    assert str(issue) == text


def test_check_raises_first_issue_with_all_attached() -> None:
    values = deep_merge(nested("nats.workerAuth", "jwt"), on(WDP, "bad_domain.example"))
    with pytest.raises(ConfigError) as caught:
        check(values)
    assert isinstance(caught.value, NcpsimError)
    assert str(caught.value) == str(caught.value.issues[0])
    assert [issue.path for issue in caught.value.issues] == [WDP, "nats.workerAuth"]
    assert "\n" not in str(caught.value)


# -- files and origins ---------------------------------------------------------------------------------
ENV = """\
# environments/laptop.yaml
workerCallbackProxy:
  enabled: true
  workerDomain: Bad-Domain.example.com
  tls:
    frontend:
      certificate:
        issuerRef:
          kind: ClusterIssuer
nats:
  workerAuth: jwt
api:
  podAnnotations:
    example.com/scrape: "true"
    nvcf.nvidia.com/nats-worker-auth-hash: "x"
list:
  - a
  - b: 1
"""


def test_origin_lines(tmp_path: Path) -> None:
    path = tmp_path / "laptop.yaml"
    path.write_text(ENV)
    values, origin = load_values_file(path)
    name = str(path)
    assert values["workerCallbackProxy"]["workerDomain"] == "Bad-Domain.example.com"
    assert origin["workerCallbackProxy"] == (name, 2)
    assert origin[WDP] == (name, 4)
    assert "api.podAnnotations.example.com/scrape" not in origin  # dotted keys are bracketed
    assert origin['api.podAnnotations["example.com/scrape"]'] == (name, 14)
    assert origin["list[1].b"] == (name, 18)
    issues = validate(values, origin)
    assert [str(i) for i in issues] == [
        f'{name}:4: {WDP}: "Bad-Domain.example.com" is not a valid DNS name: must be lower case',
        f"{name}:8: {REF}.name: must be set, e.g. name: letsencrypt",  # the nearest line the file set
        f"{name}:11: nats.workerAuth must be nkey or token",
        (
            f'{name}:15: api.podAnnotations["nvcf.nvidia.com/nats-worker-auth-hash"]: is reserved for the auth '
            "callout's restart on a worker auth change; remove it"
        ),
    ]
    with pytest.raises(ConfigError, match=rf"^{name}:4: {WDP}: "):
        check(values, origin)


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("a:\n  b: 1\n c: 2\n", 3, "indentation"),
        ("a:\n  b: 1\n   c: 2\n", 3, "mapping values are not allowed"),
        ("a:\n\tb: 1\n", 2, "spaces, not tabs"),
        ('a: 1\nb: "abc\nc: 2\n', 2, "close the quote"),
        ("a: [1, 2\nb: 3\n", 2, "expected ',' or ']'"),
        ("a: 1\n---\nb: 2\n", 2, "single document"),
        ("- a\n- b\n", 1, "top level must be a mapping"),
        ("\n\njust text\n", 3, "found the string"),
    ],
    ids=["dedent", "over-indent", "tab", "unclosed quote", "unclosed list", "two docs", "list", "scalar"],
)
def test_malformed_yaml(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = tmp_path / "env.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_values_file(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: ")
    assert fragment in message
    assert "\n" not in message


def test_unreadable_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the values file"):
        load_values_file(tmp_path / "missing.yaml")
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    assert load_values_file(tmp_path / "empty.yaml") == ({}, {})
    (tmp_path / "latin1.yaml").write_bytes(b"a: \xe9\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_values_file(tmp_path / "latin1.yaml")


def test_recursive_alias_does_not_hang(tmp_path: Path) -> None:
    """A value inside itself is no Helm value (JSON has none): refused in one line, not walked forever."""
    (tmp_path / "a.yaml").write_text("a: &x\n  b: *x\n")
    with pytest.raises(ConfigError, match=r"a\.yaml:\d+: an alias refers to the value that contains it"):
        load_values_file(tmp_path / "a.yaml")


# -- proxy settings ------------------------------------------------------------------------------------
DEFAULT_URL = f"https://invocation.{WD}:10084"
BASE = ProxySettings(
    False, WD, STACK, FRONTEND_SECRET, True, False, DEFAULT_URL, False, True
)  # the stack's defaults


@pytest.mark.parametrize(
    ("values", "changes"),
    [
        ({}, {}),
        (ON, {"enabled": True}),
        (nested(SECRET, "my-tls"), {"frontend_issuer": PUBLIC, "frontend_secret": "my-tls"}),
        (nested(REF, CLUSTER_ISSUER), {"frontend_issuer": PUBLIC, "frontend_secret": PUBLIC_FRONTEND_SECRET}),
        (
            nested("workerCallbackProxy.invocation.upstreamTls.enabled", False),
            {"upstream_tls": False, "pod_worker_tls": False},
        ),
        (nested("invocation.workerTls.enabled", False), {"pod_worker_tls": False}),
        (nested("workerCallbackProxy.invocation.connect.enabled", True), {"connect_enabled": True}),
        (nested(URL, f"https://callbacks.{WD}:443"), {"invocation_proxy_url": f"https://callbacks.{WD}:443"}),
        (
            nested(WDP, "w.example.org"),
            {
                "worker_domain": "w.example.org",
                "invocation_proxy_url": "https://invocation.w.example.org:10084",
            },
        ),
        (
            nested("global.nvcaOperator.agent.workerCallbackCaPem", "-----BEGIN CERTIFICATE-----\n"),
            {"worker_ca_pem_set": True},
        ),
        (nested("global.nvcaOperator.agent.workerCallbackCaPem", "  \n"), {}),
    ],
    ids=[
        "defaults",
        "enabled",
        "existingSecret",
        "issuerRef",
        "plain upstream",
        "worker TLS listener off",
        "connect",
        "url override",
        "other domain",
        "worker CA",
        "blank worker CA",
    ],
)
def test_proxy_settings(values: dict, changes: dict) -> None:
    settings = proxy_settings(values)
    assert settings == dataclasses.replace(BASE, **changes)
    # The frontend profile for these settings names the Secret the proxy will read.
    profile = frontend_profile(WD, settings.frontend_issuer, secret=settings.frontend_secret)
    assert (profile.secret, profile.issuer) == (settings.frontend_secret, settings.frontend_issuer)


# -- the stack's own defaults (seeds), not a demo's ---------------------------------------------------
STACK_DEFAULTS: list[tuple[str, Any]] = [
    ("workerCallbackProxy.enabled", False),  # "A single cluster does not need the proxy ... Leave it false"
    ("workerCallbackProxy.service.type", "ClusterIP"),  # step 1 sets LoadBalancer to expose it
    (REF, None),  # the frontend certificate comes from the stack's OpenBao issuer by default
    (SECRET, None),
    ("workerCallbackProxy.invocation.upstreamTls.enabled", True),  # "unless ... is false"
    ("workerCallbackProxy.invocation.connect.enabled", False),  # "so it turns CONNECT tunnels off"
    ("workerCallbackProxy.image.registry", "docker.io"),  # "The chart pulls docker.io/envoyproxy/envoy"
    ("workerCallbackProxy.image.repository", "envoyproxy/envoy"),
    *[(p, "") for p in SPLIT],  # "leave ... empty"
    (URL, ""),  # "Set ... only when workers use another name"
    ("global.nvcaOperator.agent.workerCallbackCaPem", ""),  # set only once a stack-CA frontend exists
    (AUTH, "nkey"),  # "nkey (default)"
    (WEBHOOK, "http://api.nvcf.svc.cluster.local:8080/v2/nvcf/webhook/nats-auth"),
    ("adminIssuerProxy.enabled", True),  # the runbook turns it off
    ("adminIssuerProxy.gateway.enabled", True),
    *[(p, {}) for p in ANNOTATIONS],  # "unset keys render nothing"
]


@pytest.mark.parametrize(("path", "value"), STACK_DEFAULTS, ids=[row[0] for row in STACK_DEFAULTS])
def test_stack_defaults(path: str, value: Any) -> None:
    node: Any = DEFAULTS
    for key in path.split("."):
        node = node[key]
    assert node == value


def test_defaults_deploy_no_proxy() -> None:
    assert proxy_settings({}).enabled is False
    assert proxy_settings(ON).enabled is True
