"""Unicode's invisible controls in untrusted text (issue 31, round three): a bidirectional override in a step
name reorders what the terminal shows ("Trojan Source": `evil<RLO>gnp.exe` reads as `evilexe.png`), a line
separator breaks the line in some terminals, a zero-width space hides a character. Like ASCII controls they
are shown escaped (`\\u202e`), never passed through; the printable non-ASCII rows are the negative control:
a name in any script is printed as written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import ncpsim

from scenarios.terminal import markup, safe

ROWS = [
    ("rlo", "evil\u202egnp.exe", "evil\\u202egnp.exe"),
    ("lro-pdf", "a\u202db\u202c", "a\\u202db\\u202c"),
    ("isolates", "\u2066x\u2067y\u2068z\u2069", "\\u2066x\\u2067y\\u2068z\\u2069"),
    ("marks", "\u200e\u200f\u061c", "\\u200e\\u200f\\u061c"),
    ("zero-width", "p\u200bay\u200cp\u200dal\u2060\ufeff", "p\\u200bay\\u200cp\\u200dal\\u2060\\ufeff"),
    ("separators", "a\u2028b\u2029c", "a\\u2028b\\u2029c"),
    ("next-line-c1", "a\x85b\x9bc", "a\\x85b\\x9bc"),
    ("ascii-escape", "\x1b[31mred\x07", "\\x1b[31mred\\x07"),
    # Negative control: printable text in any script, tab and newline pass unchanged.
    ("latin", "café naïve", "café naïve"),
    ("cjk", "中文名前", "中文名前"),
    ("arabic-letters", "مرحبا", "مرحبا"),
    ("emoji", "ok ✓ 🚀", "ok ✓ 🚀"),
    ("tab-newline", "a\tb\nc", "a\tb\nc"),
]


@pytest.mark.parametrize(("case", "text", "shown"), ROWS, ids=[r[0] for r in ROWS])
def test_safe_shows_invisible_controls_and_passes_printable_text(case: str, text: str, shown: str) -> None:
    assert safe(text) == shown
    assert markup(text) == markup(shown, one_line=False).replace("\n", "\\x0a")


def test_a_replay_report_shows_bidi_controls_escaped(tmp_path: Path) -> None:
    """The channel end to end: a scenario's summary and step name reach `ncpsim replay`'s report escaped."""
    hostile = "evil\\u202egnp.exe\\u2066\\u200bx\\u2028y"  # as YAML writes it
    scenario = tmp_path / "bidi.yaml"
    scenario.write_text(
        f'name: bidi\nsummary: "{hostile}"\n'
        # one NATS server: three wait for JetStream's first leader (4-9 s when the first vote splits)
        "values: {workerCallbackProxy: {enabled: true}, nats: {config: {cluster: {enabled: false}}}}\n"
        f'steps:\n  - name: "{hostile}"\n    setValues: {{}}\n'
    )
    replayed = ncpsim("replay", str(scenario), home=tmp_path / "home")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    raw = [c for c in replayed.stdout + replayed.stderr if c in "\u202e\u2066\u200b\u2028"]
    assert raw == [], replayed.stdout
    assert replayed.stdout.count("evil\\u202egnp.exe\\u2066\\u200bx\\u2028y") == 2, replayed.stdout
