"""What a step changes on a running stack, as the field changes it: values as `helmfile sync` applies them,
pods as a rollout replaces them, DNS as CoreDNS reloads its Corefile.

Running pods keep the values they started with until they are redeployed; the values are applied when the
step runs (a `@stack-ca` marker becomes the CA's PEM as it is then). What the chart restarts on its own
(the auth callout, on a change of what it reads only at start-up) is restarted here too. A rollout that
could never become ready is refused before anything changes, as `kubectl rollout status` would wait forever.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from certs.store import CertStore
from clusters.local.plan import NATS_CALLOUT
from clusters.stack import Stack
from clusters.state import write_file
from scenarios import origins
from scenarios.faults import FaultInjector
from scenarios.spec import Scenario, Step
from sim.errors import ScenarioError
from sim.model.layering import parse_key
from sim.model.topology import Topology
from sim.model.values import deep_merge, proxy_settings
from sim.model.values_check import check

SESSION = "session"  # the scenario a dev-environment command's steps run in (scenarios/devenv.py)
ROLLS_OUT_PROXY = ("proxy", "all")


class Rollout:
    """A running stack's topology as the steps of one scenario change it; each change is saved to the
    stack's topology.json, which the pods started after it read."""

    def __init__(self, scenario: Scenario, stack: Stack, faults: FaultInjector):
        self.scenario, self.stack, self.faults = scenario, stack, faults
        self.topology: Topology = stack.topology

    def change(self, step: Step) -> list[str]:
        """unsetValues, setValues, then the rollout, as `helmfile sync` applies a changed environment."""
        notes = []
        if step.redeploy in ROLLS_OUT_PROXY:  # refused before anything changes: the proxy keeps serving
            self.require_secrets(deep_merge(self.topology.values, step.set_values or {}), step)
        if step.unset_values is not None:
            notes.append(self.unset_values(step.unset_values))
        if step.set_values is not None:
            notes.append(self.set_values(step.set_values, self.origin_label(step)))
        if step.redeploy is not None:
            notes.append(self.redeploy(step.redeploy))
        if step.dns_rewrite is not None or step.dns_records is not None:
            notes.append(self.rewrite_dns(step.dns_rewrite, step.dns_records))
        return notes

    def origin_label(self, step: Step) -> str:
        """Where `ncpsim values` says a step's values came from."""
        if self.scenario.name == SESSION:
            return f"ncpsim {step.name}"
        return f"step {step.index} of {self.scenario.name}"

    def require_secrets(self, values: dict[str, Any], step: Step) -> None:
        """A proxy rollout whose frontend Secret the stack does not hold would never become ready (the
        kubelet cannot mount it): refused, as `kubectl rollout status` would wait forever."""
        secret = proxy_settings(values).frontend_secret
        store = CertStore(self.stack.state_dir / "certs")
        if secret and not (store.secret_dir(secret) / "tls.crt").is_file():
            raise ScenarioError(
                f"{step.label}: Secret {secret!r} (workerCallbackProxy.tls.frontend.existingSecret) is not "
                f"in the stack, so the new proxy pod could not start; the running one keeps serving. Bring it "
                f"first: ncpsim set --secret {secret}=DIR (a folder with tls.crt and tls.key)"
            )

    def unset_values(self, paths: tuple[str, ...]) -> str:
        """Keys back to the chart's defaults (`ncpsim set --unset`); running pods keep theirs."""
        parsed = [parse_key(path) for path in paths]
        before = values = self.topology.values
        for parts in parsed:
            values = origins.unset(values, parts)
        self.apply_values(values)
        origins.forget(self.stack.state_dir, parsed)
        return f"{', '.join(paths)} back to the chart's defaults" + self.restart_callout(before)

    def set_values(self, overrides: dict[str, Any], label: str = "a step") -> str:
        before = self.topology.values
        self.apply_values(deep_merge(self.topology.values, overrides))
        origins.record(self.stack.state_dir, overrides, label)
        said = "values changed (running pods keep what they started with until redeployed)"
        return said + self.restart_callout(before)

    def apply_values(self, values: dict[str, Any]) -> None:
        check(values)
        # Applied now: a `@stack-ca` marker becomes the CA's PEM as it is at this step, and stays that text.
        store = CertStore(self.stack.state_dir / "certs")
        self.topology = replace(self.topology, values=values).with_ca_pem(
            lambda issuer: store.ca_path(issuer).read_text()
        )
        write_file(self.stack.state_dir / "topology.json", self.topology.to_json())

    def restart_callout(self, before: dict[str, Any]) -> str:
        """The chart restarts the auth callout when its mode, webhook URL or logging changes (it reads them
        only at start-up); the rest of the control plane keeps running."""
        # Imported when values change: sim.runbooks is a fifth of what `ncpsim up` imports (scenarios.actions).
        from sim.runbooks.nats_auth import callout_config, callout_restart_reasons

        reasons = callout_restart_reasons(callout_config(before), callout_config(self.topology.values))
        if not reasons:
            return ""
        if self.stack.components is None:
            return f"; {'; '.join(reasons)}: restart the auth callout yourself (no restarts on this backend)"
        self.stack.components.restart(NATS_CALLOUT)
        return f"; {NATS_CALLOUT} restarted ({'; '.join(reasons)})"

    def redeploy(self, what: str) -> str:
        if what in ("workers", "all"):  # new function pods: none of them predates the values any more
            self.topology = self.topology.with_workers_redeployed()
            write_file(self.stack.state_dir / "topology.json", self.topology.to_json())
        self.topology = self.stack.redeploy(self.topology, what)  # k3d pods come back with new IPs
        return f"redeployed {what}"

    def rewrite_dns(self, rewrite: dict[str, Any] | None, records: list[dict[str, Any]] | None = None) -> str:
        """Every compute cluster's CoreDNS rewrite (and, given, its records) replaced, as `ncpsim dns-rewrite`
        replaces the rewrite on a real cluster: the views are built as at `up` (a `proxy` target is the
        Service's address now) and the resolver restarts with them, as CoreDNS reloads its Corefile."""
        spec = dict(self.scenario.topology)
        changed = {
            **({"dnsRewrite": rewrite} if rewrite is not None else {}),
            **({"dnsRecords": records} if records is not None else {}),
        }
        spec["computeClusters"] = [
            {**{k: v for k, v in c.items() if k != "wildcardDns"}, **changed}
            for c in spec.get("computeClusters", [])
        ]
        self.scenario = replace(self.scenario, topology=spec)  # a later DNS step starts from this one's
        rebuilt = self.scenario.build_topology(self.topology.stack, self.topology.values)
        fresh = {c.name: c for c in rebuilt.clusters if c.kind == "compute"}
        self.topology = replace(
            self.topology, clusters=tuple(fresh.get(c.name, c) for c in self.topology.clusters)
        )
        write_file(self.stack.state_dir / "topology.json", self.topology.to_json())
        self.faults.apply({"restart": "resolver"})
        said = []
        if rewrite is not None:
            said.append("rewrite now {" + ", ".join(f"{k}: {v}" for k, v in rewrite.items()) + "}")
        if records is not None:
            shown = "; ".join(f"{r['kind']} {r['name']} -> {r['target']}" for r in records) or "none"
            said.append(f"records now {shown}")
        return f"compute clusters' DNS {' and '.join(said)}"
