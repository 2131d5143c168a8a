"""The static HTML of a device map view: one bar per device (modules coloured, headroom hatched, the budget
line), the moves and the module table; shared by ``DeviceMapView.to_html`` and its widget.

    html = device_map_html(view)       # what DeviceMapView(...).to_html() returns
"""

from __future__ import annotations

import hashlib
import html
from typing import Any

from ..byte_sizes import human_bytes

DEVICE_MAP_CSS = """
<style>
.accel-nb-device-map{font-family:var(--jp-ui-font-family,sans-serif);font-size:12px;max-width:900px}
.accel-nb-device-row{display:flex;align-items:center;margin:3px 0}
.accel-nb-device-label{width:64px;font-weight:600}
.accel-nb-device-bar{position:relative;flex:1;height:22px;background:#eee;border:1px solid #bbb;display:flex;overflow:hidden}
.accel-nb-module{height:100%;box-sizing:border-box;border-right:1px solid #fff;min-width:1px}
.accel-nb-headroom{height:100%;background:repeating-linear-gradient(45deg,#ccc,#ccc 4px,#eee 4px,#eee 8px);margin-left:auto}
.accel-nb-budget-line{position:absolute;top:0;bottom:0;width:2px;background:#c00}
.accel-nb-device-info{width:300px;padding-left:8px;color:#444}
.accel-nb-device-table{border-collapse:collapse;margin-top:6px}
.accel-nb-device-table td,.accel-nb-device-table th{padding:1px 8px;text-align:left;border-bottom:1px solid #eee}
.accel-nb-moves{margin-top:6px;color:#333}
.accel-nb-error{color:#b00;font-weight:600}
.accel-nb-quantization{margin-top:6px;color:#333;font-weight:600}
</style>
"""


def device_name(device: Any) -> str:
    return f"GPU {device}" if isinstance(device, int) else str(device)


def bar_scale(d: dict[str, Any]) -> int:
    """Bytes a full bar stands for: the budget, except for a disk far larger than what it holds."""
    filled = d["used"] + d["headroom"]
    if scaled_to_contents(d):
        return max(filled, 1)
    return max(d["budget"] or 0, filled, 1)


def scaled_to_contents(d: dict[str, Any]) -> bool:
    """A disk budget (often a terabyte) would make its bar an invisible sliver: draw what it holds."""
    filled = d["used"] + d["headroom"]
    return d["device"] == "disk" and filled > 0 and (d["budget"] is None or d["budget"] > 4 * filled)


CONTENTS_NOTE = "bar drawn to what it holds, not to its budget"


# well-apart hues, light enough for the hatching and the budget line to show over them
PALETTE = (
    "#7aa6d8",
    "#f2a65a",
    "#7cc47f",
    "#e07b7b",
    "#b39ddb",
    "#c9a27e",
    "#f09cc8",
    "#a8a8a8",
    "#d4cf6a",
    "#6fcad1",
    "#9fb86b",
    "#d98e5f",
)


def module_colour(name: str) -> str:
    """A module's colour outside a map (stable per name)."""
    return PALETTE[int(hashlib.md5(name.encode()).hexdigest()[:4], 16) % len(PALETTE)]


def device_map_html(view: Any, include_style: bool = True) -> str:
    """``view``'s static HTML (a ``DeviceMapView``): bars (modules coloured, headroom hatched, budget line),
    moves and the table."""
    esc = html.escape
    colours = view.colours()

    def colour(module: str) -> str:
        return colours.get(module) or module_colour(module)

    parts = [DEVICE_MAP_CSS if include_style else "", '<div class="accel-nb-device-map">']
    if view.error:
        parts.append(f'<div class="accel-nb-error">{esc(view.error)}</div>')
    for d in view.devices():
        scale = bar_scale(d)
        title = f"{d['name']}: {view.format_bytes(d, d['used'])} used"
        if d["budget"] is not None:
            title += f" of {view.format_bytes(d, d['budget'])}"
        parts.append(
            f'<div class="accel-nb-device-row" data-device="{esc(str(d["device"]))}">'
            f'<div class="accel-nb-device-label">{esc(d["name"])}</div>'
            f'<div class="accel-nb-device-bar" data-device="{esc(str(d["device"]))}" '
            f'data-used="{d["used"]}" data-budget="{d["budget"] if d["budget"] is not None else ""}" '
            f'data-headroom="{d["headroom"]}" data-scale="{"contents" if scaled_to_contents(d) else "budget"}" '
            f'title="{esc(title)}">'
        )
        for r in d["rows"]:
            size = r["size"] or 0
            pct = 100.0 * size / scale if d["used"] else 100.0 / max(len(d["rows"]), 1)
            label = f"{r['module'] or '(model)'} ({r['class']}) {human_bytes(size) if r['size'] is not None else ''}"
            if view.quantized:
                label += f" {r['dtype']}, unquantized {human_bytes(r['unquantized'])}"
            parts.append(
                f'<div class="accel-nb-module" data-module="{esc(r["module"])}" '
                f'style="width:{pct:.3f}%;background:{colour(r["module"])}" title="{esc(label.strip())}"></div>'
            )
        if d["headroom"]:
            parts.append(
                f'<div class="accel-nb-headroom" style="width:{100.0 * d["headroom"] / scale:.3f}%" '
                f'title="{esc(headroom_title(view, d))}"></div>'
            )
        if d["budget"] is not None and d["budget"] <= scale:
            parts.append(
                f'<div class="accel-nb-budget-line" style="left:calc({100.0 * d["budget"] / scale:.3f}% - 2px)" '
                f'title="{esc("budget " + view.format_bytes(d, d["budget"]))}"></div>'
            )
        info = f"{view.format_bytes(d, d['used'])} used"
        if d["budget"] is not None:
            info += f" / {view.format_bytes(d, d['budget'])} budget, {view.format_bytes(d, max(d['free'], 0))} free"
        if d["headroom"]:
            info += f", {view.format_bytes(d, d['headroom'])} headroom"
        if scaled_to_contents(d) and d["budget"] is not None:
            info += f" ({CONTENTS_NOTE})"
        parts.append(f'</div><div class="accel-nb-device-info">{esc(info)}</div></div>')
    moves = view.moves()
    if moves:
        # display:list-item: classic Notebook 6's stylesheet makes summaries blocks, hiding the fold marker
        parts.append(
            '<details class="accel-nb-moves"><summary style="display:list-item;cursor:pointer">'
            "Why blocks moved on</summary><ul>"
        )
        parts += [f"<li>{esc(m)}</li>" for m in moves]
        parts.append("</ul></details>")
    if view.quantized:
        parts.append(f'<div class="accel-nb-quantization">{esc(view.quantization_summary())}</div>')
    quant_heads = "<th>dtype</th><th>unquantized</th>" if view.quantized else ""
    parts.append(
        '<table class="accel-nb-device-table"><tr><th>module</th><th>device</th><th>size</th>'
        f"{quant_heads}</tr>"
    )
    for r in view.rows():
        size = human_bytes(r["size"]) if r["size"] is not None else "?"
        quant_cells = (
            f'<td class="accel-nb-dtype">{esc(r["dtype"])}</td><td>{human_bytes(r["unquantized"])}</td>'
            if view.quantized
            else ""
        )
        parts.append(
            f'<tr data-module="{esc(r["module"])}" data-device="{esc(str(r["device"]))}" title="{esc(r["module"])}">'
            f'<td><span style="color:{colour(r["module"])}">&#9632;</span> {esc(r["module"] or "(model)")}</td>'
            f"<td>{esc(device_name(r['device']))}</td><td>{size}</td>{quant_cells}</tr>"
        )
    parts.append("</table></div>")
    return "".join(parts)


def headroom_title(view: Any, d: dict[str, Any]) -> str:
    """The headroom's tooltip: its size and why it is kept free."""
    notes = view.plan.notes if view.plan is not None else []
    return f"headroom {view.format_bytes(d, d['headroom'])}: " + (
        notes[0] if notes else "kept free on this device"
    )
