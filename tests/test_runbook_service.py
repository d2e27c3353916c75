"""Service operations: pod-annotation values and restart semantics (Deployment, RollingUpdate, OnDelete)."""

from __future__ import annotations

import pytest

from sim.errors import ConfigError
from sim.runbooks import service_ops as ops
from sim.runbooks.service_runs import RUNS, STEP_ANNOTATIONS, STEP_DELETE, STEP_SEAL


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"api": {"podAnnotations": {"a/b": 8080}}}, 'quote it: "8080"'),
        ({"nats": {"podAnnotations": {"a/b": True}}}, 'quote it: "true"'),
        ({"ess": {"podAnnotations": {"nvcf.nvidia.com/nats-worker-auth-x": "1"}}}, "reserved"),
        ({"openbao": {"server": {"annotations": {"checksum/config": "x"}}}}, "managed by the chart"),
        ({"api": {"podAnnotations": ["a"]}}, "must be a mapping"),
    ],
)
def test_render_fails_like_the_stack(values: dict, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        ops.render_annotations(values)


def test_other_values_problems_are_not_annotation_issues() -> None:
    assert ops.annotation_issues({"nats": {"workerAuth": "x"}}) == []


def test_render_and_change_effects() -> None:
    values = {
        "api": {"podAnnotations": {"example.com/scrape": "true"}},
        "openbao": {"server": {"annotations": {"example.com/scrape": "true"}}},
        "nats": {"podAnnotations": {"example.com/scrape": "true"}},
    }
    assert ops.render_annotations(values)["nvcf-api"] == {"example.com/scrape": "true"}
    assert ops.render_annotations({}) == {}  # unset keys render nothing
    effects = ops.change_effects({}, values)
    assert effects["nvcf-api"] == "rolls" and effects["nats"] == "rolls"
    assert "OnDelete" in effects["openbao-server"]


@pytest.mark.parametrize(
    ("resource", "replaced", "status"),
    [
        ("nvcf-api", ["nvcf-api-r1-0", "nvcf-api-r1-1", "nvcf-api-r1-2"], 0),
        ("nats", ["nats-2", "nats-1", "nats-0"], 0),  # one at a time, reverse ordinal order
        ("openbao-server", [], 1),
    ],
)
def test_rollout_restart(resource: str, replaced: list[str], status: int) -> None:
    after, order = ops.rollout_restart(ops.workload(resource))
    code, message = ops.rollout_status(after)
    assert order == replaced and code == status
    if resource == "openbao-server":
        assert message == ops.ROLLOUT_STATUS_ONDELETE and len(after.outdated()) == 3


def test_ondelete_pod_is_replaced_on_delete_and_comes_back_sealed() -> None:
    bao, _ = ops.rollout_restart(ops.workload("openbao-server"))
    bao = ops.delete_pod(bao, "openbao-server-2")
    assert bao.outdated() == ["openbao-server-0", "openbao-server-1"]
    assert bao.pod("openbao-server-2").ready and ops.sealed_members(bao) == ["openbao-server-2"]
    assert ops.bao_status(bao, "openbao-server-2").split() == ["Sealed", "true"]
    assert ops.sealed_members(ops.unseal(bao, "openbao-server-2")) == []


def test_deleted_deployment_pod_gets_a_new_name_but_no_new_revision() -> None:
    api = ops.workload("nvcf-api", replicas=1)
    after = ops.delete_pod(api, "nvcf-api-r1-0")
    assert after.revision == 1 and after.pods[0].name != "nvcf-api-r1-0"


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        ("service-annotations", STEP_ANNOTATIONS),
        ("openbao-restart", STEP_DELETE),
        ("openbao-seal-check", STEP_SEAL),
        ("deployment-restart", None),
    ],
)
def test_runs(name: str, fix: str | None) -> None:
    right, wrong = RUNS[name]("right", None), RUNS[name]("wrong", None)
    assert right.ok and not wrong.ok and wrong.mistake
    if fix:
        assert wrong.fix_step == fix
