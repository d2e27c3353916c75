"""Values keys the chart has that ncpsim accepts but does not model: one list, with what each would do.

A customer's value must never vanish, nor read as a typo (`unknown key`): each of these is reported in the
run's report as "accepted, not modelled", with what the field does with it and what ncpsim does instead.
The worker callback proxy chart is not public: the keys below are those the seeds name, and the usual
Deployment and Service knobs of a chart of its kind (README, "Accepted, not modelled").
"""

from __future__ import annotations

from sim.model.values import WCP, KeyPath

NOT_MODELLED: tuple[tuple[KeyPath, str], ...] = (
    (
        ("openbao", "enabled"),
        (
            "ncpsim always plays OpenBao's PKI with its stack CA; in the field false leaves the proxy, "
            "grpc-proxy and invocation-service certificates unissued"
        ),
    ),
    (
        ("certManager", "enabled"),
        "ncpsim issues every certificate itself; in the field false leaves nothing to issue them",
    ),
    (("adminIssuerProxy", "podDisruptionBudget", "enabled"), "no node drain or eviction is simulated"),
    (
        (WCP, "service", "annotations"),
        (
            "the load balancer ignores them: the Service answers at its address for every cluster; an internal "
            "load balancer or source ranges are a `link` fault"
        ),
    ),
    ((WCP, "replicaCount"), "one proxy process plays every replica"),
    ((WCP, "resources"), "no CPU or memory limit is applied"),
    ((WCP, "nodeSelector"), "pods are not scheduled onto nodes"),
    ((WCP, "tolerations"), "pods are not scheduled onto nodes"),
    ((WCP, "affinity"), "pods are not scheduled onto nodes"),
    (
        (WCP, "grpcProxy", "caSecret"),
        "the proxy verifies grpc-proxy pods with ca.crt of grpc-proxy-worker-tls, whatever Secret this names",
    ),
    (
        (WCP, "invocation", "upstream", "tls", "caSecret", "name"),
        (
            "the proxy verifies invocation-service pods with ca.crt of invocation-service-worker-tls, whatever "
            "Secret this names"
        ),
    ),
)
# Of those, the mappings whose keys are the user's own (nothing under them is an unknown key).
NOT_MODELLED_MAPS: tuple[KeyPath, ...] = (
    (WCP, "service", "annotations"),
    (WCP, "resources"),
    (WCP, "nodeSelector"),
    (WCP, "affinity"),
)
