"""The suite's timeouts, by name. Each bounds a hang; none is a figure a test measures.

Where a test waits on the machine (an interpreter to start, a stack to come up, a component to write its
record), the bound grows with the load measured when the session started: on a laptop that also runs a
browser and a build, a start that takes one second idle may take ten. LOAD is the run queue per core over
the last minute, never below 1; the controller measures it once and its xdist workers read the same figure.
Only a hang ever reaches these, so a generous bound costs nothing on a passing run.
"""

from __future__ import annotations

import os

LOAD_ENV = "NCPSIM_TEST_LOAD"  # set by conftest.py at the session's start; the workers inherit it


def measured_load() -> float:
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


LOAD = float(os.environ.get(LOAD_ENV) or measured_load())


def scaled(seconds: float) -> float:
    """`seconds` on an idle machine, stretched by the load the session started with."""
    return seconds * LOAD


# A loopback exchange with a local peer: milliseconds; a refusal, a reset, a local reply.
EXCHANGE = scaled(5.0)
# A component writes its event or record once its client has the answer.
RECORD = scaled(10.0)
# A callback or a short scenario on a stack that is already up.
CALL = scaled(20.0)
# One command line as a process: an interpreter start and the imports, a refusal or a status.
COMMAND = scaled(60.0)
# A command that brings a stack up, redeploys or replays: seconds idle, far longer on a loaded machine.
STACK_COMMAND = scaled(90.0)
