"""YAML text for rendered objects: no anchors or aliases (shared Python objects would otherwise come
out as &id001/*id001, which k3d and kubectl read but people should not have to)."""

from __future__ import annotations

from typing import Any

import yaml

# libyaml's emitter when PyYAML has it (several times faster on manifests full of PEM text).
_Base: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _PlainDumper(_Base):  # type: ignore[misc]
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_PlainDumper, sort_keys=False, width=120)


def dump_all(objects: list[Any]) -> str:
    return yaml.dump_all(objects, Dumper=_PlainDumper, sort_keys=False, width=120)
