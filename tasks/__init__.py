"""ncpsim's command line: `ncpsim up scenario=grpc-callback`, `ncpsim down`, `ncpsim status --json`, ...

`ncpsim` is tasks/main.py; `invoke` run in the repository finds this package's `ns` (tasks/collection.py).
The collection is loaded on first use (PEP 562), so the `ncpsim` binary's first lines (tasks.main) come
before invoke's import and every task's, as clusters.local's do for its backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from invoke import Collection

    ns: Collection


def __getattr__(name: str) -> Any:
    if name == "ns":
        from tasks.collection import ns

        return ns
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
