"""Expectations on logs (issue 26): a step expects lines of a component's log, with a count bound.

The check is pure (scenarios.expect.check_log, from a table); the file form is refused with FILE:LINE
where it cannot hold; end to end, the catalogue's proxy-access-log passes on a real stack, and the same
file with one bound changed fails, naming the step, the log and what it held (the negative control).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scenarios.engine import read_lines
from scenarios.expect import check_log
from scenarios.load import load_scenario
from scenarios.spec import LogExpect, Step, log_from
from sim.errors import NcpsimError

REPO = Path(__file__).resolve().parents[1]
ACCESS = "worker-callback-proxy.access"
LINES = [
    '[t] "GET / HTTP/1.1" 404 NR 0 0 1 - "-" "probe" "id-1" "10-42-0-11.invocation:8443" "-"',
    '[t] "GET /v2/nvcf/worker/request-attach HTTP/1.1" 200 - 0 5 2 1 "-" "w" "id-2" "h" "10.42.0.11:8443"',
    '[t] "POST /v2/nvcf/worker/request-attach HTTP/1.1" 200 - 5 0 2 1 "-" "w" "id-2" "h" "10.42.0.12:8443"',
]
STEP = Step(2, "callbacks")


@pytest.mark.parametrize(
    ("log", "problem"),
    [
        ({"contains": "NR"}, None),  # default: at least one
        ({"contains": "UF"}, "but 0 of 3 line(s) did; last line: "),
        ({"contains": "NR", "count": {"exactly": 0}}, "exactly 0 line(s)"),
        ({"contains": " 200 - ", "count": {"exactly": 2}}, None),
        ({"matches": r"\"10\.42\.0\.1[12]:8443\"$", "count": {"min": 2, "max": 2}}, None),
        ({"matches": r"^\[t\] \"POST ", "count": {"max": 0}}, "at most 0 line(s)"),
        ({"contains": "request-attach", "matches": "POST", "count": {"exactly": 1}}, None),  # both must hold
        ({"contains": "200", "count": {"min": 3}}, "but 2 of 3 line(s) did; first match: "),
    ],
)
def test_check_log_from_a_table(log: dict, problem: str | None) -> None:
    found = check_log(STEP, log_from({"component": ACCESS, **log}), LINES)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith("step 2 (callbacks): expected ") and problem in found


def test_a_log_the_stack_does_not_have_names_those_it_has() -> None:
    found = check_log(STEP, LogExpect("worker-callback-proxy.acces", "NR"), None, [ACCESS, "resolver"])
    assert found is not None and "no log 'worker-callback-proxy.acces' (it has: " + ACCESS in found


def test_describe_says_the_bound_and_which_lines() -> None:
    assert log_from({"component": ACCESS, "contains": "NR"}).describe() == (
        f"at least 1 line(s) of {ACCESS} containing 'NR', written during the step"
    )
    whole = log_from({"component": ACCESS, "matches": "x", "count": {"min": 1, "max": 3}, "lines": "all"})
    assert whole.describe() == f"1 to 3 line(s) of {ACCESS} matching /x/, in the whole log"


def test_read_lines_from_an_offset_keeps_a_partial_line_for_later(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("before\nduring 1\nduring 2\npart")
    assert read_lines(log, len("before\n")) == ["during 1", "during 2"]
    assert read_lines(tmp_path / "none.log", 0) == []


# -- the file form ---------------------------------------------------------------------------------
HEAD = """\
name: log-ticket
summary: what the log shows
values:
  workerCallbackProxy: {enabled: true, workerDomain: grpc-worker.example.com}
topology:
  grpcProxyReplicas: 0
  computeClusters:
    - workers: [{count: 1, trust: stack}]
steps:
"""


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            "  - invoke: {function: http-echo}\n    expect: {log: {component: x, contains: a, count: {exactly: 1, min: 1}}}\n",
            r":11: steps\[0\]\.expect\.log: count: exactly stands alone",
        ),
        (
            "  - invoke: {function: http-echo}\n    expect: {log: {component: x, matches: '(unclosed'}}\n",
            r":11: steps\[0\]\.expect\.log: matches: not a regular expression",
        ),
        (
            "  - invoke: {function: http-echo}\n    expect:\n      - {log: {component: x, contains: a}, outcome: success}\n",
            r":12: steps\[0\]\.expect\[0\]\.log: a log expectation is an entry of its own; move outcome",
        ),
        (
            "  - invoke: {function: http-echo}\n    expect: {log: {component: x, contain: a}}\n",
            r":11: steps\[0\]\.expect\.log\.contain: unknown key; did you mean contains\? expected one of: component, contains, count",
        ),
        (
            "  - invoke: {function: http-echo}\n    expect: {log: {component: x, contains: a, count: {min: 3, max: 1}}}\n",
            r"count: min 3 is above max 1",
        ),
        (
            "  - invoke: {function: http-echo}\n    expect: {log: {component: x, count: {min: 1}}}\n",
            r"steps\[0\]\.expect\.log: give contains \(text\) or matches",
        ),
        (
            "  - invoke: {function: http-echo}\n    expect: {log: {component: x, contains: a, lines: since-up}}\n",
            r"steps\[0\]\.expect\.log\.lines: ",
        ),
    ],
)
def test_the_file_form_is_refused_with_file_and_line(tmp_path: Path, step: str, message: str) -> None:
    path = tmp_path / "ticket.yaml"
    path.write_text(HEAD + step)
    with pytest.raises(NcpsimError) as caught:
        load_scenario(str(path))
    assert re.search(message, str(caught.value)), str(caught.value)
    assert str(caught.value).startswith(str(path))


def test_a_log_expectation_may_follow_any_action(tmp_path: Path) -> None:
    path = tmp_path / "ticket.yaml"
    path.write_text(
        HEAD + "  - fault: {kill: invocation-service-0}\n"
        "    expect: {log: {component: invocation-service-0, contains: x, count: {max: 0}}}\n"
    )
    (step,) = load_scenario(str(path)).steps
    assert step.expect is not None and step.expect.outcome is None and step.expect.log is not None


# -- end to end ------------------------------------------------------------------------------------
def test_proxy_access_log_passes_and_a_changed_bound_fails(ncpsim_replay, tmp_path: Path) -> None:
    source = (REPO / "scenarios" / "catalogue" / "proxy-access-log.yaml").read_text()
    passed = ncpsim_replay(REPO / "scenarios" / "catalogue" / "proxy-access-log.yaml")
    assert passed.ok, passed.failures
    assert "log worker-callback-proxy.access: 4 line(s) counted" in passed.steps[1].note
    # Negative control: the whole-log expectation read as this step's lines, and one count off.
    changed = source.replace("count: {exactly: 2}, lines: all}", "count: {exactly: 2}}").replace(
        "count: {exactly: 4}", "count: {exactly: 3}"
    )
    assert changed != source
    (tmp_path / "changed.yaml").write_text(changed)
    failed = ncpsim_replay(tmp_path / "changed.yaml")
    assert not failed.ok and failed.steps[0].ok
    label = (
        "step 2 (callbacks, each pulled (GET) and answered (POST) through the proxy to the pod holding it)"
    )
    first, second = failed.steps[1].failures
    assert first.startswith(f"{label}: expected exactly 3 line(s) of {ACCESS} matching /")
    assert "written during the step, but 4 of 4 line(s) did; first match: '[" in first
    assert second.startswith(f"{label}: expected exactly 2 line(s) of {ACCESS} containing")
    assert "written during the step, but 0 of 4 line(s) did; last line: " in second
