"""The local backend: the Topology as processes on 127.0.0.1, each in its own process group.

The names are loaded on first use (PEP 562), so `clusters.local.zygote` can be imported on its own, light,
first thing in `ncpsim up`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clusters.local.stack import LocalBackend, LocalStack

__all__ = ["LocalBackend", "LocalStack"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from clusters.local import stack

        return getattr(stack, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
