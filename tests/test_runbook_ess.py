"""Encrypted Secret Store keys: MEK wraps NEKs, NEKs encrypt secrets; rotation keeps every secret readable."""

from __future__ import annotations

import random

import pytest

from sim.runbooks.ess_keys import Ess, Stranded, replica_keyring
from sim.runbooks.ess_runs import RUNS, STEP_GRACE, STEP_KEEP


def _ess() -> Ess:
    ess = Ess(random.Random(4))
    ess.add_mek(0.0, 0.0)
    for namespace in ("a", "b"):
        ess.put(namespace, "key", f"{namespace}-secret".encode(), 10.0)
    return ess


def test_roundtrip_and_one_nek_per_namespace() -> None:
    ess = _ess()
    assert ess.get("a", "key") == b"a-secret" and ess.get("b", "key") == b"b-secret"
    assert ess.neks_wrapped_by("mek-1") == ["a", "b"]
    assert len(ess.meks["mek-1"].key) == 32  # AES-256


def test_blobs_are_bound_to_their_namespace_and_name() -> None:
    ess = _ess()
    ess.secrets[("a", "other")] = ess.secrets[("a", "key")]
    with pytest.raises(Stranded, match="secret a/other does not decrypt"):
        ess.get("a", "other")
    ess.neks["b"]["nek-a-1"] = ess.neks["a"]["nek-a-1"]
    with pytest.raises(Stranded, match="does not decrypt"):
        ess.unwrap("b", "nek-a-1")


@pytest.mark.parametrize(("now", "active"), [(100.0, "mek-1"), (399.9, "mek-1"), (400.0, "mek-2")])
def test_new_mek_waits_out_the_grace_period(now: float, active: str) -> None:
    ess = _ess()
    ess.add_mek(100.0, 300.0)
    assert ess.active_mek(now).id == active


def test_rotation_keeps_every_secret_readable() -> None:
    ess = _ess()
    ess.add_mek(100.0, 300.0)
    assert ess.rewrap(400.0) == 2
    assert ess.neks_wrapped_by("mek-1") == [] and ess.unreadable() == {}
    ess.drop_mek("mek-1")
    assert ess.get("a", "key") == b"a-secret" and ess.unreadable() == {}


def test_dropping_the_old_mek_early_strands_secrets() -> None:
    ess = _ess()
    ess.add_mek(100.0, 300.0)
    ess.drop_mek("mek-1")
    assert set(ess.unreadable()) == {"a/key", "b/key"}
    assert "no longer in OpenBao" in ess.unreadable()["a/key"]


@pytest.mark.parametrize(
    ("created", "now", "known"),
    [
        (100.0, 350.0, {"mek-1"}),
        (100.0, 400.0, {"mek-1", "mek-2"}),
    ],
)
def test_lagging_replica_keyring(created: float, now: float, known: set[str]) -> None:
    ess = _ess()
    ess.add_mek(created, 300.0)
    assert replica_keyring(ess, now, 300.0) == known


def test_runs() -> None:
    for name, fix in (("ess-mek-rotation", STEP_KEEP), ("ess-mek-grace", STEP_GRACE)):
        right, wrong = RUNS[name]("right", None), RUNS[name]("wrong", None)
        assert right.ok and right.end_state["unreadable"] == {}
        assert not wrong.ok and wrong.fix_step == fix
    wrong = RUNS["ess-mek-rotation"]("wrong", None)
    assert "6 of 6 secrets" in (wrong.mistake or "") and "mek-1" in (wrong.mistake or "")
