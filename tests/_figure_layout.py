"""What a reader sees of an altair chart: its rendered scene (Vega's own layout, via vl-convert), read back as panels.

A test-only inspector that does not reuse dwg.science.pictures.charts: it asks Vega where every bar, rule and axis label
landed and checks the picture a reader gets (bars inside their category's band, labels in order, reference rules drawn).
"""

from __future__ import annotations
from dataclasses import dataclass, field

import vl_convert as vlc


@dataclass
class Panel:
    "One plotting area: its box, the marks drawn in it (by mark name) and the axis labels along its edges."

    x: float
    y: float
    width: float
    height: float
    marks: dict = field(default_factory=dict)  # mark name -> list of items (absolute x, y, x2, y2, width, height)
    x_labels: list = field(default_factory=list)  # (text, absolute x) of the category axis below or above the panel
    y_labels: list = field(default_factory=list)  # (text, absolute y) of the axis left of the panel

    def items(self, kind: str, layer: str | None = None) -> list[dict]:
        "Items of marks whose type is `kind` ('rect', 'rule', ...), optionally only layers whose name contains `layer`."
        return [
            it
            for (name, mtype), its in self.marks.items()
            for it in its
            if mtype == kind and (layer is None or layer in name)
        ]


def _abs(item: dict, ox: float, oy: float) -> dict:
    "An item's geometry in absolute coordinates."
    out = dict(item)
    for k in ("x", "x2"):
        if k in item:
            out[k] = ox + item[k]
    for k in ("y", "y2"):
        if k in item:
            out[k] = oy + item[k]
    return out


def _walk(mark: dict, ox: float, oy: float, cells: list, axes: list, titles: list):
    "Collect plotting cells (scope groups with a size that hold marks), axis labels and titles, in absolute positions."
    if mark.get("marktype") != "group":
        return
    for it in mark.get("items", []):
        x, y = ox + it.get("x", 0), oy + it.get("y", 0)
        role = mark.get("role")
        if role == "axis":
            labels = [
                _abs(t, x, y) for m in it.get("items", []) if m.get("role") == "axis-label" for t in m.get("items", [])
            ]
            axes.append(dict(orient=it.get("orient"), x=x, y=y, labels=labels))
            continue
        if role == "title":
            titles += [_abs(t, x, y) for m in it.get("items", []) for t in m.get("items", []) if "text" in t]
            continue
        marks = {}
        for sub in it.get("items", []):
            if sub.get("marktype") != "group" and sub.get("role") == "mark":
                marks[(sub.get("name", ""), sub["marktype"])] = [_abs(t, x, y) for t in sub.get("items", [])]
        if marks and it.get("width") and it.get("height"):
            cells.append(Panel(x, y, it["width"], it["height"], marks))
        for sub in it.get("items", []):
            _walk(sub, x, y, cells, axes, titles)


def _nearest_labels(p: Panel, axes: list, axis: str) -> list:
    """The labels of the axis nearest to panel `p` along its edge: below or above it for "x" (a facet draws the x axis
    only under its bottom row), left of it for "y" (only beside its first column); only labels within the panel's
    span."""
    best, gap = [], float("inf")
    for ax in axes:
        if axis == "x" and ax["orient"] in ("bottom", "top"):
            d = ax["y"] - (p.y + p.height) if ax["orient"] == "bottom" else p.y - ax["y"]
            inside = [(t["text"], t["x"]) for t in ax["labels"] if p.x - 1 <= t["x"] <= p.x + p.width + 1]
        elif axis == "y" and ax["orient"] == "left":
            d = p.x - ax["x"]
            inside = [(t["text"], t["y"]) for t in ax["labels"] if p.y - 1 <= t["y"] <= p.y + p.height + 1]
        else:
            continue
        if inside and -2 <= d < gap:
            best, gap = inside, d
    return best


def scene(chart) -> tuple[list[Panel], list[str]]:
    "The panels of a rendered chart (each with its axis labels) and every title text, from Vega's scenegraph."
    sg = vlc.vegalite_to_scenegraph(chart.to_dict())["scenegraph"]
    cells, axes, titles = [], [], []
    _walk(sg, 0, 0, cells, axes, titles)
    for p in cells:
        p.x_labels = _nearest_labels(p, axes, "x")
        p.y_labels = _nearest_labels(p, axes, "y")
    texts = [t["text"] if isinstance(t["text"], str) else " ".join(t["text"]) for t in titles]
    return cells, texts


def _bands(labels: list, lo: float, hi: float) -> list[tuple[str, float, float]]:
    "Category bands (text, start, end) around label centres: half-way to each neighbour, the panel edge at the ends."
    centres = sorted(labels, key=lambda t: t[1])
    out = []
    for i, (text, c) in enumerate(centres):
        left = (centres[i - 1][1] + c) / 2 if i else lo
        right = (c + centres[i + 1][1]) / 2 if i + 1 < len(centres) else hi
        out.append((text, left, right))
    return out


def misplaced(panel: Panel, kind: str = "rect", axis: str = "x", layer: str | None = None, tol: float = 0.6) -> list:
    """Marks of `kind` that are not inside one category band of the panel's `axis` (or leave the panel):
    each as (mark extent, the band its centre falls in)."""
    labels = panel.x_labels if axis == "x" else panel.y_labels
    lo, hi = (panel.x, panel.x + panel.width) if axis == "x" else (panel.y, panel.y + panel.height)
    bands = _bands(labels, lo, hi)
    bad = []
    for it in panel.items(kind, layer):
        if axis == "x":
            a = it["x"]
            b = it.get("x2", a + it.get("width", 0))
        else:
            a = it["y"]
            b = it.get("y2", a + it.get("height", 0))
        a, b = min(a, b), max(a, b)
        mid = (a + b) / 2
        band = next((bd for bd in bands if bd[1] - tol <= mid <= bd[2] + tol), None)
        if band is None or a < band[1] - tol or b > band[2] + tol:
            bad.append(((round(a, 1), round(b, 1)), band and band[0]))
    return bad
