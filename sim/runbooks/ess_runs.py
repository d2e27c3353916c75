"""Rehearsals of MEK rotation for the Encrypted Secret Store, each ending in a RunbookReport."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from sim.runbooks.ess_keys import Ess, replica_keyring
from sim.runbooks.given import NO_VALUES, Given
from sim.runbooks.report import RIGHT, Reads, RunbookReport, Steps

GRACE = 300.0  # at least the replicas' keyring reload interval
RELOAD = 300.0
START = 1000.0  # the old MEK has existed long enough for every replica to hold it
NAMESPACES = ("team-a", "team-b", "team-c")
STEP_KEEP = (
    "keep every old MEK in OpenBao until no NEK is wrapped by it: restore the dropped MEK from its "
    "backup, re-wrap the NEKs with the new MEK, and only then retire the old one"
)
STEP_GRACE = (
    "step 2: wait the grace period (at least the ESS replicas' key reload interval) before the new "
    "MEK wraps anything"
)


def _seeded() -> tuple[Ess, Steps]:
    ess, steps = Ess(random.Random(8)), Steps()
    ess.add_mek(0.0, 0.0)
    for namespace in NAMESPACES:
        for name in ("registry-credential", "api-key"):
            ess.put(namespace, name, f"{namespace}/{name}".encode(), START)
    steps(f"{len(ess.secrets)} secrets in {len(NAMESPACES)} namespaces, NEKs wrapped by mek-1")
    return ess, steps


def _end_state(ess: Ess, now: float) -> dict:
    return {
        "meks": sorted(ess.meks),
        "active_mek": ess.active_mek(now).id,
        "neks_by_mek": {m: ess.neks_wrapped_by(m) for m in sorted(ess.meks)},
        "unreadable": ess.unreadable(),
        "unreadable_on_lagging_replica": ess.unreadable(replica_keyring(ess, now, RELOAD)),
        "secrets": len(ess.secrets),
    }


def rotation(variant: str, _state_dir: Path | None = None, _given: Given = NO_VALUES) -> RunbookReport:
    ess, steps = _seeded()
    now = START
    new = ess.add_mek(now, GRACE)
    steps(f"step 1: added {new.id} to OpenBao, kept mek-1")
    if variant == RIGHT:
        now += GRACE
        steps(f"step 2: waited the {GRACE:.0f}s grace period; {ess.active_mek(now).id} is now active")
        steps(f"step 3: re-wrapped {ess.rewrap(now)} NEKs with {new.id}")
        left = ess.neks_wrapped_by("mek-1")
        steps(f"step 4: no NEK wrapped by mek-1 ({left or 'none'}): it may be retired")
        ess.drop_mek("mek-1")
    else:
        stranded = ess.neks_wrapped_by("mek-1")
        ess.drop_mek("mek-1")
        steps(f"dropped mek-1 while {len(stranded)} NEKs were still wrapped by it")
        now += GRACE
    state = _end_state(ess, now)
    mistake = None
    if state["unreadable"]:
        mistake = (
            f"dropped an old MEK too early: {len(state['unreadable'])} of {state['secrets']} secrets "
            "no longer decrypt because their NEKs are wrapped by mek-1, which is gone"
        )
    return RunbookReport(
        "ess-mek-rotation",
        variant,
        steps.as_tuple(),
        state,
        mistake is None,
        mistake,
        STEP_KEEP if mistake else None,
    )


def grace(variant: str, _state_dir: Path | None = None, _given: Given = NO_VALUES) -> RunbookReport:
    """A new namespace's NEK is wrapped while some replica has not reloaded the keyring yet."""
    ess, steps = _seeded()
    now = START
    wait = GRACE if variant == RIGHT else 0.0
    new = ess.add_mek(now, wait)
    steps(f"step 1: added {new.id}, usable after {wait:.0f}s")
    now += wait
    ess.put("team-new", "api-key", b"fresh", now)
    steps(f"a new namespace stored a secret at t+{wait:.0f}s; its NEK is wrapped by {ess.active_mek(now).id}")
    state = _end_state(ess, now)
    mistake = None
    if state["unreadable_on_lagging_replica"]:
        mistake = (
            f"the new MEK was used before the grace period ended: a replica that has not reloaded the "
            f"keyring cannot read {', '.join(state['unreadable_on_lagging_replica'])}"
        )
    return RunbookReport(
        "ess-mek-grace",
        variant,
        steps.as_tuple(),
        state,
        mistake is None,
        mistake,
        STEP_GRACE if mistake else None,
    )


# The seeds give ESS's keys no value: the MEK lives in OpenBao, the NEKs in Cassandra, and the grace period is
# the replicas' keyring reload interval, which no value sets. ess.podAnnotations only rolls the Deployment.
_READS = Reads(
    why="the seeds name no value for ESS's keys (the MEK in OpenBao, the NEKs in Cassandra, the replicas' "
    "keyring reload interval); ess.podAnnotations only rolls the ESS Deployment"
)
READS = {"ess-mek-rotation": _READS, "ess-mek-grace": _READS}
RUNS: dict[str, Callable[[str, Path | None, Given], RunbookReport]] = {
    "ess-mek-rotation": rotation,
    "ess-mek-grace": grace,
}
