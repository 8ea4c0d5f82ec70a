"""Server-side SVG for the dashboard's history: one chart per GPU, pure Python, no
JavaScript and nothing fetched (the page works offline and under its strict CSP).

A chart is a 0-100 % plot of utilization and memory used over the range, one polyline
per unbroken run of points (a gap in the data stays a gap, shaded, never a line to 0),
and under it, lanes of coloured bands, labelled where the name fits: who held the GPU
when; then every holder's name beside their colour. Built with ElementTree, so
every user name is escaped; :func:`gpu_chart` returns the ``<svg>`` as a string.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

SVG_NS = "http://www.w3.org/2000/svg"

WIDTH = 960
LEFT, RIGHT, TOP = 44, 12, 22  # margins around the plot, px
PLOT_HEIGHT = 110
TICKS_HEIGHT = 16  # the time labels under the plot
LANE_HEIGHT = 16  # one lane of holder bands
LEGEND_HEIGHT = 14  # one row of the holders' names under the lanes
CHAR_WIDTH = 6.6  # of the 11 px monospace labels, to decide whether a name fits

LINES = (  # (field of the GPU's model, class, colour, legend)
    ("utilization", "utilization", "#76b900", "utilization"),
    ("memory", "memory", "#3b8eea", "memory used"),
)
# Holders' colours, one per name (the same name gets the same colour on every chart).
PALETTE = ("#c678dd", "#e5a50a", "#56b6c2", "#e06c75", "#98c379", "#d19a66", "#61afef",
           "#f0a0c0")


def holder_colour(user: str) -> str:
    return PALETTE[zlib.crc32(user.encode()) % len(PALETTE)]


def time_ticks(start: float, end: float) -> list[tuple[float, str]]:
    """Labelled times along the x axis, UTC: every 10 minutes for up to 2 hours, every
    3 hours for up to 2 days, else every day."""
    span = end - start
    every, fmt = (600, "%H:%M") if span <= 7200 else (
        (10800, "%H:%M") if span <= 2 * 86400 else (86400, "%a %d"))
    first = -(-start // every) * every
    ticks, t = [], first
    while t <= end:
        ticks.append((t, datetime.fromtimestamp(t, UTC).strftime(fmt)))
        t += every
    return ticks


def gaps(segments: Sequence[Sequence[Sequence[float]]], start: float, end: float,
         step: float) -> list[tuple[float, float]]:
    """The stretches of [start, end] without points: before the first segment, between
    segments and after the last (the whole range when there are none)."""
    if not segments:
        return [(start, end)]
    out = []
    if segments[0][0][0] - start >= step:
        out.append((start, segments[0][0][0]))
    for before, after in zip(segments, segments[1:], strict=False):
        out.append((before[-1][0], after[0][0]))
    if end - segments[-1][-1][0] >= step:
        out.append((segments[-1][-1][0], end))
    return out


def lanes(spans: Sequence[dict[str, Any]]) -> list[int]:
    """A lane per span (index in *spans*, which are oldest first): the first lane free at
    the span's start, so holders one after another share a lane and only a GPU shared at
    the same time needs more."""
    ends: list[float] = []
    out = []
    for span in spans:
        lane = next((i for i, e in enumerate(ends) if e <= span["start"]), len(ends))
        if lane == len(ends):
            ends.append(span["end"])
        else:
            ends[lane] = span["end"]
        out.append(lane)
    return out


def gpu_chart(gpu: dict[str, Any], start: float, end: float, step: float,
              width: int = WIDTH) -> str:
    """One GPU of :func:`gpulab.dashboard.history.history_model` as an ``<svg>``."""
    plot_w = width - LEFT - RIGHT
    spans = gpu.get("holders") or []
    lane_of = lanes(spans)
    n_lanes = max(lane_of, default=0) + 1
    holders_top = TOP + PLOT_HEIGHT + TICKS_HEIGHT + 4
    legend_top = holders_top + n_lanes * LANE_HEIGHT + 2
    legend = legend_rows([_who(s) for s in spans], plot_w)
    height = legend_top + len(legend) * LEGEND_HEIGHT + 4
    span_t = (end - start) or 1.0

    def x(t: float) -> float:
        return round(LEFT + (min(max(t, start), end) - start) / span_t * plot_w, 1)

    def y(v: float) -> float:
        return round(TOP + (1 - min(max(v, 0.0), 1.0)) * PLOT_HEIGHT, 1)

    name = f"GPU {gpu['index'] if gpu.get('index') is not None else '?'}"
    svg = ET.Element("svg", {"xmlns": SVG_NS, "class": "history-chart", "width": str(width),
                             "height": str(height), "viewBox": f"0 0 {width} {height}",
                             "role": "img", "data-uuid": gpu.get("uuid", ""),
                             "font-family": "DejaVu Sans Mono, Menlo, Consolas, monospace",
                             "font-size": "11", "fill": "#aaa"})
    ET.SubElement(svg, "title").text = (f"{name} {gpu.get('uuid', '')}: utilization and "
                                        "memory used, and who held it")
    ET.SubElement(svg, "text", {"class": "chart-title", "x": str(LEFT), "y": "14"}).text = (
        f"{name} {gpu.get('uuid', '')}")
    legend_x = width - RIGHT
    for _, cls, colour, label in reversed(LINES):
        ET.SubElement(svg, "text", {"class": f"legend {cls}", "x": str(legend_x), "y": "14",
                                    "fill": colour, "text-anchor": "end"}).text = f"— {label}"
        legend_x -= round((len(label) + 4) * CHAR_WIDTH)

    grid = ET.SubElement(svg, "g", {"class": "grid"})
    for ratio in (0.0, 0.5, 1.0):
        ET.SubElement(grid, "line", {"x1": str(LEFT), "x2": str(LEFT + plot_w),
                                     "y1": str(y(ratio)), "y2": str(y(ratio)),
                                     "stroke": "#333"})
        ET.SubElement(grid, "text", {"class": "ylabel", "x": str(LEFT - 4),
                                     "y": str(y(ratio) + 4), "text-anchor": "end"}).text = (
            f"{ratio:.0%}")
    for t, label in time_ticks(start, end):
        ET.SubElement(grid, "line", {"x1": str(x(t)), "x2": str(x(t)), "y1": str(TOP),
                                     "y2": str(TOP + PLOT_HEIGHT), "stroke": "#222"})
        ET.SubElement(grid, "text", {"class": "tick", "x": str(x(t)),
                                     "y": str(TOP + PLOT_HEIGHT + 13),
                                     "text-anchor": "middle"}).text = label

    for a, b in gaps(gpu.get("utilization") or [], start, end, step):
        gap = ET.SubElement(svg, "rect", {"class": "gap", "x": str(x(a)), "y": str(TOP),
                                          "width": str(round(x(b) - x(a), 1)),
                                          "height": str(PLOT_HEIGHT), "fill": "#3a3a3a",
                                          "fill-opacity": "0.35"})
        ET.SubElement(gap, "title").text = "no data (GPU lost, or exporter or Prometheus down)"

    for field, cls, colour, _ in LINES:
        for segment in gpu.get(field) or []:
            if len(segment) == 1:
                (t, v), = segment
                ET.SubElement(svg, "circle", {"class": f"point {cls}", "cx": str(x(t)),
                                              "cy": str(y(v)), "r": "1.5", "fill": colour})
                continue
            points = " ".join(f"{x(t):g},{y(v):g}" for t, v in segment)
            ET.SubElement(svg, "polyline", {"class": f"line {cls}", "points": points,
                                            "fill": "none", "stroke": colour,
                                            "stroke-width": "1.5",
                                            "stroke-linejoin": "round"})
    if not gpu.get("has_data", True):
        ET.SubElement(svg, "text", {"class": "no-data", "x": str(LEFT + plot_w / 2),
                                    "y": str(TOP + PLOT_HEIGHT / 2),
                                    "text-anchor": "middle"}).text = "no data in this range"

    band = ET.SubElement(svg, "g", {"class": "holders"})
    if not spans:
        ET.SubElement(band, "text", {"class": "holder-none", "x": str(LEFT),
                                     "y": str(holders_top + 12)}).text = "held by nobody"
    label_end: dict[int, float] = {}  # per lane, where the last name drawn in it ends
    for i, (span, lane) in enumerate(zip(spans, lane_of, strict=True)):
        who = _who(span)
        top = holders_top + lane * LANE_HEIGHT
        x0, x1 = x(span["start"]), x(span["end"])
        w = max(round(x1 - x0, 1), 2.0)
        # free room in the lane around the band, for a name too long to fit inside it
        before = max([x(o["end"]) for o, ol in zip(spans[:i], lane_of, strict=False)
                      if ol == lane] + [label_end.get(lane, LEFT)])
        after = min((x(o["start"]) for o, ol in zip(spans[i + 1:], lane_of[i + 1:],
                                                     strict=True) if ol == lane),
                    default=LEFT + plot_w)
        g = ET.SubElement(band, "g", {"class": "holder", "data-user": span["user"]})
        ET.SubElement(g, "title").text = (
            f"{who}: {_clock(span['start'])} - {_clock(span['end'])} UTC")
        ET.SubElement(g, "rect", {"x": str(x0), "y": str(top), "width": str(w),
                                  "height": str(LANE_HEIGHT - 3), "rx": "2",
                                  "fill": holder_colour(span["user"]), "fill-opacity": "0.75"})
        need = (len(who) + 1) * CHAR_WIDTH
        label = None
        if w >= need and x0 >= before:  # inside the band
            label = {"x": str(round(x0 + 3, 1)), "fill": "#000"}
            label_end[lane] = x0 + need
        elif after - max(x0 + w, before) >= need:  # to its right
            label = {"x": str(round(max(x0 + w, before) + 3, 1)), "fill": "#ddd"}
            label_end[lane] = max(x0 + w, before) + need
        elif x0 - before >= need:  # to its left
            label = {"x": str(round(x0 - 3, 1)), "fill": "#ddd", "text-anchor": "end"}
            label_end[lane] = x0
        if label is not None:
            ET.SubElement(g, "text", {"class": "holder-name", "y": str(top + 10),
                                      **label}).text = who
    ET.SubElement(svg, "text", {"class": "ylabel", "x": str(LEFT - 4),
                                "y": str(holders_top + 10), "text-anchor": "end"}).text = "held"
    # every holder by name under the lanes: also those whose band is too short for it
    for row, items in enumerate(legend):
        y_row = legend_top + row * LEGEND_HEIGHT
        for offset, who, user in items:
            g = ET.SubElement(band, "g", {"class": "holder-legend", "data-user": user})
            ET.SubElement(g, "rect", {"x": str(LEFT + offset), "y": str(y_row + 2),
                                      "width": "9", "height": "9",
                                      "fill": holder_colour(user)})
            ET.SubElement(g, "text", {"x": str(LEFT + offset + 13),
                                      "y": str(y_row + 10)}).text = who
    return ET.tostring(svg, encoding="unicode")


def legend_rows(holders: Sequence[str], width: float) -> list[list[tuple[float, str, str]]]:
    """Each distinct holder ("user" or "user/server") once, in order of first hold, as
    rows of (x offset, label, user) that fit *width*."""
    rows: list[list[tuple[float, str, str]]] = []
    x = width
    for who in dict.fromkeys(holders):
        size = (len(who) + 2) * CHAR_WIDTH + 13
        if x + size > width:
            rows.append([])
            x = 0.0
        rows[-1].append((round(x, 1), who, who.split("/", 1)[0]))
        x += size
    return rows


def _who(span: dict[str, Any]) -> str:
    return span["user"] + (f"/{span['server']}" if span.get("server") else "")


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%a %H:%M")
