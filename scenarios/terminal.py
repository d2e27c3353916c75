"""Text from the network, a file or a scenario, made safe to print: shown, never interpreted.

A step name, a request id, a user agent or a log line is whatever somebody sent or wrote. Printed raw,
an ANSI escape would recolour or clear the terminal, a carriage return would overwrite the line before,
and rich markup (`[/]`, `[link=...]`) would be read by the table that draws it. Every such string goes
through `safe` (control characters as \\xNN; newlines too where one line is expected) and, where rich
reads markup, `markup` as well.
"""

from __future__ import annotations

import re

# Unicode's invisible controls count too: the bidirectional overrides and isolates reorder what the terminal
# shows ("Trojan Source": `evil\u202egnp.exe` reads as `evilexe.png`), the line and paragraph separators break
# a line in some terminals, and the zero-width ones hide characters in a name. Shown as \\uNNNN.
_INVISIBLE = "\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff"
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_INVISIBLE}]")
_CONTROL_OR_NEWLINE = re.compile(f"[\\x00-\\x08\\x0a-\\x1f\\x7f-\\x9f{_INVISIBLE}]")


def safe(text: object, one_line: bool = False) -> str:
    """`text` with every control character but the tab (and, unless `one_line`, the newline) as \\xNN, and
    Unicode's invisible controls (bidirectional, zero-width, separators) as \\uNNNN."""
    pattern = _CONTROL_OR_NEWLINE if one_line else _CONTROL
    return pattern.sub(_shown, str(text))


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def markup(text: object, one_line: bool = True) -> str:
    """`safe`, then escaped for rich: for strings printed where rich reads markup."""
    from rich.markup import escape  # with what draws it: `safe` alone, on every command's path, needs no rich

    return escape(safe(text, one_line))
