"""The auth callout's logging as the real one does it: zap's level and sampler, from the values (pure).

Why zap's semantics: the NVCF auth callout is a Go service that logs with zap, and the seed says how it
samples ("per message, the first 100 lines a second, then 1 in 100, so a burst of worker logins can drop
lines"). zap's sampler keys its counts by level and message; each count runs for a tick (one second)
that opens at the first entry after the previous tick ran out, so a burst is counted from its own start,
not from the wall clock's second. The first ``initial`` entries of a tick pass, then every
``thereafter``-th. Only ``natsAuthCalloutService.serviceConfig.logging`` reaches the callout; the seed
turns sampling off with ``initial: 0`` ("log every login"). Time is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.errors import ConfigError

LOGGING_KEY = ("natsAuthCalloutService", "serviceConfig", "logging")
LEVELS = ("debug", "info", "warn", "error")  # zap's names, lowest first (dpanic and above: as error)
TICK = 1.0  # seconds: the callout's sampler counts per second


@dataclass(frozen=True)
class LogSettings:
    """The callout's zap logging: level, and per message the first ``initial`` lines per second, then 1
    in ``thereafter``; ``initial: 0`` logs every line."""

    level: str = "info"
    initial: int = 100
    thereafter: int = 100

    @property
    def sampling(self) -> bool:
        return self.initial > 0

    def enabled(self, level: str) -> bool:
        return _rank(level) >= _rank(self.level)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> LogSettings:
        """``natsAuthCalloutService.serviceConfig.logging`` (other serviceConfig keys never reach it)."""
        logging: Any = values
        for key in LOGGING_KEY:
            logging = logging.get(key) if isinstance(logging, Mapping) else None
        logging = logging if isinstance(logging, Mapping) else {}
        sampling = logging.get("sampling") or {}
        level = str(logging.get("level", "info")).lower()
        if level not in LEVELS:
            raise ConfigError(
                f"natsAuthCalloutService.serviceConfig.logging.level: {level!r} is not a zap level; "
                f"use one of {', '.join(LEVELS)}"
            )
        settings = cls(level, _count(sampling, "initial", 100), _count(sampling, "thereafter", 100))
        return settings


def _count(sampling: Any, key: str, default: int) -> int:
    value = sampling.get(key, default) if isinstance(sampling, Mapping) else default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"natsAuthCalloutService.serviceConfig.logging.sampling.{key}: must be a whole number, 0 or more"
        )
    return value


def _rank(level: str) -> int:
    return LEVELS.index(level) if level in LEVELS else len(LEVELS)


@dataclass
class Sampler:
    """zap's sampler over one logger: ``allow(level, message, now)`` says whether the line is written."""

    settings: LogSettings
    tick: float = TICK
    _counts: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)  # -> (tick ends, count)

    def allow(self, level: str, message: str, now: float) -> bool:
        if not self.settings.enabled(level):
            return False
        if not self.settings.sampling:
            return True
        key = (level, message)
        ends, count = self._counts.get(key, (0.0, 0))
        ends, count = (ends, count + 1) if now < ends else (now + self.tick, 1)
        self._counts[key] = (ends, count)
        if count <= self.settings.initial:
            return True
        thereafter = self.settings.thereafter
        return thereafter > 0 and (count - self.settings.initial) % thereafter == 0
