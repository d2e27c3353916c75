"""A module fixture's cases computed in the background, a few at a time, as the module's tests ask for them.

A diagnosis or a ticket's replay mostly waits on its own stack (calls that time out, a NATS sign-in refused,
processes starting and stopping): two at a time take about half the time for the same CPU, as
`ncpsim replay --jobs 2` and the catalogue's module fixture run scenarios. `Cases` starts every case this
run's tests will read (only the selected ones: `-k` one case computes one) as the fixture is set up; a
test waits for its own case only, and a case's error is raised in the tests that read that case.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Generic, TypeVar

import pytest

JOBS = 2  # cases at a time: the stacks of two share two cores, each mostly waiting (see above)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def asked(request: pytest.FixtureRequest, param: str) -> list[object]:
    """The `param` of each test of the requesting module, in this run, that uses the requesting fixture."""
    found: list[object] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        uses = request.fixturename in getattr(item, "fixturenames", ())
        here = getattr(item, "module", None) is request.module
        if here and uses and callspec is not None and param in callspec.params:
            found.append(callspec.params[param])
    return list(dict.fromkeys(found))


class Cases(Generic[K, V]):
    """`compute(key)` for each key, JOBS at a time; `cases(key)` waits for that one (a key no test asked
    for up front is computed when first read)."""

    def __init__(self, compute: Callable[[K], V], pool: ThreadPoolExecutor):
        self._compute, self._pool = compute, pool
        self._futures: dict[K, Future[V]] = {}

    def start(self, keys: list[K]) -> None:
        for key in keys:
            if key not in self._futures:
                self._futures[key] = self._pool.submit(self._compute, key)

    def __call__(self, key: K) -> V:
        self.start([key])
        return self._futures[key].result()


@contextmanager
def cases(compute: Callable[[K], V], keys: list[K], name: str) -> Iterator[Cases[K, V]]:
    """Cases of `compute`, `keys` started at once; on the way out (the module's tests done, or Ctrl-C),
    none not yet started starts, and those running end as they would (each stops its own stacks)."""
    with ThreadPoolExecutor(JOBS, thread_name_prefix=name) as pool:
        held = Cases(compute, pool)
        held.start(keys)
        try:
            yield held
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
