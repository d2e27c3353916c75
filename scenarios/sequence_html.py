"""The sequence diagram as one self-contained HTML page: an inline SVG drawing plus the Mermaid source.

No scripts and no network: the page must open from a laptop's disk or a CI artifact, where a Mermaid
CDN script cannot load. The SVG is laid out here (pure string building): one column per lane, one
row per message or note.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from clusters.state import write_file
from scenarios.result import ScenarioResult
from scenarios.sequence import Diagram, Message, Note, diagram, mermaid

LANE_GAP = 230  # px between lane centres: room for a target URL in small type
LEFT = 130
TOP = 70  # below the lane headers
ROW = 26
LABEL_CHARS = 64  # longer labels are cut in the drawing; the full text is in the tooltip
COLOURS = {"call": "#1f4e79", "reply": "#4b6b2f", "fail": "#b3261e"}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; } .pass { color: #2e7d32; } .fail { color: #b3261e; }
ul.failures { color: #b3261e; font-size: 13px; } svg { display: block; margin-top: 12px; }
svg text { font-size: 11px; } .lane-head rect { fill: #eef2f7; stroke: #1f4e79; }
.lane-head text { font-size: 13px; font-weight: 600; } .note rect { fill: #fff8dc; stroke: #c9b458; }
details { margin-top: 16px; } pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
"""


def _x(index: int) -> int:
    return LEFT + index * LANE_GAP


def _lanes_svg(d: Diagram, height: int) -> list[str]:
    out = []
    for i, lane in enumerate(d.lanes):
        x = _x(i)
        out.append(
            f'<g class="lane" id="lane-{escape(lane.id)}" data-lane="{escape(lane.label)}">'
            f'<g class="lane-head"><rect x="{x - 90}" y="10" width="180" height="30" rx="4"/>'
            f'<text x="{x}" y="30" text-anchor="middle">{escape(lane.label)}</text></g>'
            f'<line x1="{x}" y1="40" x2="{x}" y2="{height - 10}" stroke="#9aa5b1" '
            'stroke-dasharray="4 3"/></g>'
        )
    return out


def _message_svg(m: Message, y: int, column: dict[str, int]) -> str:
    x1, x2 = _x(column[m.src]), _x(column[m.dst])
    colour = COLOURS[m.style]
    dash = ' stroke-dasharray="6 3"' if m.style == "reply" else ""
    label = m.label if len(m.label) <= LABEL_CHARS else m.label[: LABEL_CHARS - 1] + "…"
    return (
        f'<g class="msg {m.style}" data-from="{m.src}" data-to="{m.dst}"><title>{escape(m.label)}</title>'
        f'<line x1="{x1}" y1="{y}" x2="{x2}" y2="{y}" stroke="{colour}" stroke-width="1.5"{dash} '
        f'marker-end="url(#head-{m.style})"/>'
        f'<text x="{(x1 + x2) / 2}" y="{y - 5}" text-anchor="middle" fill="{colour}">'
        f"{escape(label)}</text></g>"
    )


def _note_svg(n: Note, y: int, lanes: int) -> str:
    x1, x2 = _x(0) - 100, _x(lanes - 1) + 100
    colour = "#b3261e" if n.text.startswith("FAILED") else "#222"
    return (
        f'<g class="note"><rect x="{x1}" y="{y - 15}" width="{x2 - x1}" height="20" rx="3"/>'
        f'<text x="{x1 + 8}" y="{y}" fill="{colour}">{escape(n.text)}</text></g>'
    )


def _markers() -> str:
    heads = "".join(
        f'<marker id="head-{style}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" '
        f'orient="auto-start-reverse"><path d="'
        + ("M0,0 L10,10 M0,10 L10,0" if style == "fail" else "M0,0 L10,5 L0,10 z")
        + f'" fill="{colour}" stroke="{colour}" stroke-width="1.5"/></marker>'
        for style, colour in COLOURS.items()
    )
    return f"<defs>{heads}</defs>"


def svg(d: Diagram) -> str:
    height = TOP + ROW * (len(d.rows) + 1)
    width = _x(len(d.lanes) - 1) + LEFT
    column = {lane.id: i for i, lane in enumerate(d.lanes)}
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" id="sequence" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="sequence diagram">'
        ),
        _markers(),
    ]
    parts += _lanes_svg(d, height)
    for n, row in enumerate(d.rows):
        y = TOP + ROW * (n + 1)
        drawn = _note_svg(row, y, len(d.lanes)) if isinstance(row, Note) else _message_svg(row, y, column)
        parts.append(drawn)
    parts.append("</svg>")
    return "\n".join(parts)


def html_page(d: Diagram, mermaid_text: str) -> str:
    verdict = '<span class="pass">PASS</span>' if d.ok else '<span class="fail">FAIL</span>'
    failures = "".join(f"<li>{escape(f)}</li>" for f in d.failures)
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>ncpsim sequence: {escape(d.title)}</title><style>{STYLE}</style></head><body>",
            f"<h1>{verdict} {escape(d.title)}</h1>",
            f'<ul class="failures">{failures}</ul>' if failures else "",
            svg(d),
            "<details><summary>Mermaid source (paste into any Mermaid renderer)</summary>",
            f'<pre class="mermaid" id="mermaid-source">{escape(mermaid_text)}</pre></details>',
            "</body></html>",
        ]
    )


def write_sequence(result: ScenarioResult, folder: Path) -> dict[str, str]:
    """Write sequence.mmd and sequence.html; return their paths by kind."""
    d = diagram(result)
    text = mermaid(d)
    mmd, page = folder / "sequence.mmd", folder / "sequence.html"
    write_file(mmd, text)
    write_file(page, html_page(d, text))
    return {"mermaid": str(mmd), "html": str(page)}
