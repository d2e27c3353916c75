"""Text from the network, a file or a scenario, made safe to print: shown, never interpreted.

A step name, a request id, a user agent or a log line is whatever somebody sent or wrote. Printed raw,
an ANSI escape would recolour or clear the terminal, a carriage return would overwrite the line before,
and rich markup (`[/]`, `[link=...]`) would be read by the table that draws it. Every such string goes
through `safe` (control characters as \\xNN; newlines too where one line is expected) and, where rich
reads markup, `markup` as well.
"""

from __future__ import annotations

import re

from rich.markup import escape

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def safe(text: object, one_line: bool = False) -> str:
    """`text` with every control character but the tab (and, unless `one_line`, the newline) as \\xNN."""
    pattern = _CONTROL_OR_NEWLINE if one_line else _CONTROL
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def markup(text: object, one_line: bool = True) -> str:
    """`safe`, then escaped for rich: for strings printed where rich reads markup."""
    return escape(safe(text, one_line))
