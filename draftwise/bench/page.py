"""HTML pieces of the bench report: tables, values written for reading (no JSON, no list reprs),
a per-position sparkline as inline SVG, embedded PNGs, and the page's style."""
from __future__ import annotations

import base64
import html
import struct


class Raw(str):
    """A table cell that is HTML already (a sparkline, a badge): written as it is, not escaped."""


def cell(v) -> str:
    return v if isinstance(v, Raw) else html.escape(str(v))


def table(head: list[str], rows: list[list], cls: str = "") -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table{f' class={cls!r}' if cls else ''}><tr>{th}</tr>{body}</table>"


def plain(v) -> str:
    """A setting's value as a reader writes it: 'yes', '512, 1024', 'plain: http://…; draft: http://…'."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(plain(x) for x in v) or "-"
    if isinstance(v, dict):
        return "; ".join(f"{k}: {plain(x)}" for k, x in v.items()) or "-"
    return str(v)


def sparkline(values: list[float], height: int = 18) -> Raw:
    """Acceptance per draft position (0..1) as inline SVG bars, then its first and last values;
    every value is in the tooltip."""
    if not values:
        return Raw("-")
    w = max(2, min(8, 128 // len(values)))  # a long draft still fits a cell
    bars = "".join(f'<rect x="{i * w}" y="{height * (1 - v):.1f}" width="{w - 1}" height="{height * v:.1f}"/>'
                   for i, v in enumerate(values))
    tip = ", ".join(f"{i + 1}: {v:.2f}" for i, v in enumerate(values))
    return Raw(f'<span class="nowrap"><svg class="spark" width="{w * len(values)}" height="{height}" role="img">'
               f"<title>acceptance per draft position: {tip}</title>"
               f'<rect class="scale" width="{w * len(values)}" height="{height}"/>{bars}</svg> '
               f"{values[0]:.2f} → {values[-1]:.2f} over {len(values)} positions</span>")


def image(png: str, alt: str, id_: str = "") -> str:
    """An embedded base64 PNG with its size, so the page's layout holds before it is decoded."""
    width, height = struct.unpack(">II", base64.b64decode(png[:32])[16:24])  # the IHDR chunk
    ident = f' id="{id_}"' if id_ else ""
    return (f'<img{ident} alt="{html.escape(alt)}" width="{width}" height="{height}" '
            f'src="data:image/png;base64,{png}"/>')


CSS = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 12px}"
       "h1{font-size:24px;margin:12px 0 2px}h2{font-size:19px;margin:18px 0 6px}h3{font-size:15px;margin:12px 0 4px}"
       "p{margin:4px 0}.sub{color:#555;font-size:13px}"
       "table{border-collapse:collapse;margin:6px 0}"
       "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:right}"
       "td:first-child,th:first-child{text-align:left;white-space:nowrap}.nowrap{white-space:nowrap}"
       ".kv td,.kv th{text-align:left}"
       ".verdicts td,.verdicts th{text-align:left;vertical-align:top}.why{color:#444;font-size:12px}"
       ".badge{display:inline-block;border-radius:3px;padding:0 5px;font-weight:bold;color:#fff}"
       ".keep{background:#1a7f37}.drop{background:#b00000}.base{background:#777}"
       ".ok{color:#060}.warn{color:#8a5a00;font-weight:bold}.bad{color:#b00;font-weight:bold}"
       "details{margin:6px 0}summary{cursor:pointer;color:#0645ad}"
       "svg.spark{vertical-align:middle}svg.spark rect{fill:#555}svg.spark rect.scale{fill:#eee}"
       "img{max-width:100%;height:auto}")
