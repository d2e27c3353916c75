"""`ncpsim replay --jobs N`'s argument. The replays themselves, side by side, each isolated, reported in the
order given, none left running: test_catalogue, whose module fixture replays the catalogue two at a time."""

from __future__ import annotations

import pytest

from scenarios.replay import jobs_arg
from sim.errors import ConfigError


@pytest.mark.parametrize(("given", "jobs"), [(None, 1), ("1", 1), ("3", 3), (2, 2)])
def test_jobs_argument(given: object, jobs: int) -> None:
    assert jobs_arg(given) == jobs  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["0", "-1", "many"])
def test_bad_jobs_argument_is_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match="--jobs"):
        jobs_arg(bad)
