"""Reading the stack's environment file: the mapping, plus where each key came from (file, line).

A malformed file gets one line naming the file and line and what to fix, as a render failure would.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from sim.errors import ConfigError
from sim.model.layering import FILE, Layer
from sim.model.untrusted import MAX_NODES, Refused, parse, read_text
from sim.model.values import KeyPath, key_path, kind_of


def _yaml_message(name: str, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or "malformed YAML"
    if problem == "found unexpected end of stream" and exc.context_mark is not None:
        mark = exc.context_mark  # an unclosed quote or bracket: point where it was opened
    where = f"{name}:{mark.line + 1}" if mark is not None else name
    text = f"{exc.context}: {problem}" if exc.context else problem
    if "'\\t'" in problem:
        hint = "indent with spaces, not tabs"
    elif "quoted scalar" in (exc.context or ""):
        hint = "close the quote"
    elif "block end" in problem or "mapping values are not allowed" in problem:
        hint = "check the indentation and that each key has one colon"
    else:
        hint = "fix the YAML syntax"
    return " ".join(f"{where}: {text}; {hint}".split())


def _collect_origin(node: yaml.Node, parts: KeyPath, name: str, origin: dict, active: set[int]) -> None:
    if id(node) in active:  # a recursive alias; its keys are already recorded
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            here = (*parts, key_node.value)
            origin[key_path(here)] = (name, key_node.start_mark.line + 1)
            _collect_origin(value_node, here, name, origin, active)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            origin[key_path((*parts, index))] = (name, item.start_mark.line + 1)
            _collect_origin(item, (*parts, index), name, origin, active)
    active.discard(id(node))


def load_values_file(path: Path, what: str = "values file") -> tuple[dict, dict[str, tuple[str, int]]]:
    """Parse a values file into ``(values, origin)``; origin maps key paths to ``(file, 1-based line)``.

    The file is untrusted (a customer's): read and composed within bounds (sim.model.untrusted) before
    anything walks it, so a FIFO, /dev/zero, an alias bomb or 5,000 nested lists is one line, not a hang.
    """
    return values_from_text(read_text(path, what), str(path), what)


def values_from_text(
    text: str, name: str, what: str = "values file", max_nodes: int = MAX_NODES
) -> tuple[dict, dict[str, tuple[str, int]]]:
    """`load_values_file` for text already read within its bounds (a support bundle's member), named
    `name` in every message and origin."""
    try:
        node, data = parse(text, max_nodes)
    except Refused as exc:
        where = f"{name}:{exc.line}" if exc.line else name
        raise ConfigError(f"{where}: {exc.message}") from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise ConfigError(
            f"{name}:{line}: character {exc.character:#06x} is not allowed in YAML "
            f"(is it a binary file?); save the {what} as plain text"
        ) from None
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(_yaml_message(name, exc)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(" ".join(f"{name}: {exc}; fix the YAML syntax".split())) from None
    if data is None or node is None:
        return {}, {}  # an empty file overrides nothing
    if not isinstance(data, dict):
        raise ConfigError(
            f"{name}:{node.start_mark.line + 1}: top level must be a mapping of keys "
            f"(e.g. workerCallbackProxy:), found {kind_of(data)}"
        )
    origin: dict[str, tuple[str, int]] = {}
    _collect_origin(node, (), name, origin, set())  # bounded: parse measured the expanded graph
    return data, origin


def file_layer(path: Path) -> Layer:
    """A customer's `-f FILE`: its values, each key's line, named as the user wrote the path."""
    values, origin = load_values_file(path)
    return Layer(FILE, str(path), values, origin)
