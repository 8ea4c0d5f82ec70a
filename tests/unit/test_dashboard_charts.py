"""gpulab.dashboard.charts: the history's SVG, parsed back with ElementTree; assertions
on the polylines' points, the gaps, the holders' bands and the labels."""

import xml.etree.ElementTree as ET

import pytest

from gpulab.dashboard.charts import (
    LEFT,
    PLOT_HEIGHT,
    RIGHT,
    TOP,
    WIDTH,
    gaps,
    gpu_chart,
    holder_colour,
    lanes,
    legend_rows,
    time_ticks,
)

NS = {"s": "http://www.w3.org/2000/svg"}
START = 1_700_002_800  # 2023-11-14 23:00:00 UTC
END = START + 3600
STEP = 15
PLOT_W = WIDTH - LEFT - RIGHT


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def points(polyline: ET.Element) -> list[tuple[float, float]]:
    return [tuple(float(v) for v in p.split(",")) for p in polyline.get("points").split()]


def chart(**gpu) -> ET.Element:
    model = {"index": 0, "uuid": "GPU-aaaa", "utilization": [], "memory": [], "holders": [],
             "has_data": True, **gpu}
    return parse(gpu_chart(model, START, END, STEP))


@pytest.mark.parametrize("start, end, labels", [
    (START, START + 3600, ["23:00", "23:10", "23:20", "23:30", "23:40", "23:50", "00:00"]),
    (START + 60, START + 3600, ["23:10", "23:20", "23:30", "23:40", "23:50", "00:00"]),
    (START, START + 86400, ["00:00", "03:00", "06:00", "09:00", "12:00", "15:00", "18:00",
                            "21:00"]),
    (START, START + 7 * 86400, ["Wed 15", "Thu 16", "Fri 17", "Sat 18", "Sun 19", "Mon 20",
                                "Tue 21"]),
])
def test_time_ticks_fit_the_range(start, end, labels):
    assert [label for _, label in time_ticks(start, end)] == labels
    assert all(start <= t <= end for t, _ in time_ticks(start, end))


@pytest.mark.parametrize("segments, expected", [
    ([], [(START, END)]),
    ([[[START, 0.1], [END, 0.1]]], []),
    ([[[START, 0.1], [START + 15, 0.1]], [[START + 60, 0.2], [END, 0.2]]],
     [(START + 15, START + 60)]),
    ([[[START + 300, 0.1], [START + 600, 0.1]]], [(START, START + 300), (START + 600, END)]),
    ([[[START + 5, 0.1], [END - 5, 0.1]]], []),  # less than a step short: no gap
])
def test_gaps_are_the_stretches_without_points(segments, expected):
    assert gaps(segments, START, END, STEP) == expected


@pytest.mark.parametrize("spans, expected", [
    ([], []),
    ([(0, 10), (10, 20), (25, 30)], [0, 0, 0]),  # one after another: one lane
    ([(0, 10), (5, 20), (12, 30), (21, 22)], [0, 1, 0, 1]),  # shared at the same time
])
def test_holders_share_a_lane_unless_they_overlap(spans, expected):
    assert lanes([{"start": a, "end": b} for a, b in spans]) == expected


def test_lines_go_through_their_points_and_break_at_gaps():
    root = chart(utilization=[[[START, 0.0], [START + 1800, 1.0]], [[START + 2700, 0.5],
                                                                     [END, 0.25]]],
                 memory=[[[START, 0.5], [END, 0.5]]])
    util = root.findall("s:polyline[@class='line utilization']", NS)
    assert [points(p) for p in util] == [
        [(LEFT, TOP + PLOT_HEIGHT), (LEFT + PLOT_W / 2, TOP)],
        [(LEFT + PLOT_W * 0.75, TOP + PLOT_HEIGHT / 2),
         (LEFT + PLOT_W, TOP + PLOT_HEIGHT * 0.75)]]
    mem = root.findall("s:polyline[@class='line memory']", NS)
    assert [points(p) for p in mem] == [[(LEFT, TOP + PLOT_HEIGHT / 2),
                                         (LEFT + PLOT_W, TOP + PLOT_HEIGHT / 2)]]
    assert {p.get("stroke") for p in util} == {"#76b900"}
    # the gap is shaded over exactly the missing stretch, and no line crosses it at 0
    (gap,) = root.findall("s:rect[@class='gap']", NS)
    assert (float(gap.get("x")), float(gap.get("width"))) == (LEFT + PLOT_W / 2, PLOT_W / 4)
    assert root.find("s:text[@class='no-data']", NS) is None


def test_values_outside_0_to_1_are_clipped_to_the_plot():
    root = chart(utilization=[[[START, -0.5], [END, 1.7]]])
    (line,) = root.findall("s:polyline[@class='line utilization']", NS)
    assert points(line) == [(LEFT, TOP + PLOT_HEIGHT), (LEFT + PLOT_W, TOP)]


def test_a_lone_point_is_a_dot():
    root = chart(utilization=[[[START + 1800, 0.5]]])
    assert root.findall("s:polyline", NS) == []
    (dot,) = root.findall("s:circle[@class='point utilization']", NS)
    assert (float(dot.get("cx")), float(dot.get("cy"))) == (LEFT + PLOT_W / 2,
                                                            TOP + PLOT_HEIGHT / 2)


def test_a_gpu_without_data_says_so_and_is_all_gap():
    root = chart(has_data=False)
    assert root.find("s:text[@class='no-data']", NS).text == "no data in this range"
    (gap,) = root.findall("s:rect[@class='gap']", NS)
    assert float(gap.get("width")) == PLOT_W


def test_holders_are_labelled_bands_along_the_timeline():
    evil = '<script>alert("x")</script>'
    root = chart(holders=[
        {"user": "alice", "server": "", "start": START, "end": START + 1800},
        {"user": "bob", "server": "train", "start": START + 1800, "end": START + 1860},
        {"user": evil, "server": "", "start": START + 2400, "end": END},
    ])
    holders = root.findall("s:g[@class='holders']/s:g[@class='holder']", NS)
    assert [h.get("data-user") for h in holders] == ["alice", "bob", evil]
    alice, bob, third = holders
    rect = alice.find("s:rect", NS)
    assert (float(rect.get("x")), float(rect.get("width"))) == (LEFT, PLOT_W / 2)
    assert rect.get("fill") == holder_colour("alice")
    assert alice.find("s:text", NS).text == "alice"
    assert alice.find("s:title", NS).text == "alice: Tue 23:00 - Tue 23:30 UTC"
    # one minute is too narrow for its name, which goes to its right, where the lane is free
    assert bob.find("s:text", NS).text == "bob/train"
    bob_rect = bob.find("s:rect", NS)
    assert float(bob.find("s:text", NS).get("x")) == round(
        float(bob_rect.get("x")) + float(bob_rect.get("width")) + 3, 1)
    assert bob.find("s:title", NS).text.startswith("bob/train: ")
    # consecutive holders share one lane
    assert len({h.find("s:rect", NS).get("y") for h in holders}) == 1
    # a name is text, never markup
    assert third.find("s:text", NS).text == evil
    assert "<script>" not in gpu_chart({"index": 0, "uuid": "u", "holders": [
        {"user": evil, "server": "", "start": START, "end": END}]}, START, END, STEP)


def test_a_gpu_nobody_held_says_so():
    root = chart()
    assert root.find("s:g[@class='holders']/s:text[@class='holder-none']", NS).text == (
        "held by nobody")


def test_title_legend_and_axis_labels():
    root = chart(index=3, uuid="GPU-dddd")
    assert root.find("s:text[@class='chart-title']", NS).text == "GPU 3 GPU-dddd"
    assert [t.text for t in root.findall("s:text", NS) if "legend" in t.get("class")] == [
        "— memory used", "— utilization"]
    assert [t.text for t in root.findall("s:g[@class='grid']/s:text[@class='ylabel']", NS)] \
        == ["0%", "50%", "100%"]
    assert root.get("data-uuid") == "GPU-dddd"


def test_holder_colours_are_stable_per_name():
    assert holder_colour("alice") == holder_colour("alice")
    assert len({holder_colour(n) for n in ("alice", "bob", "cy", "dee", "eve", "fay")}) > 2


@pytest.mark.parametrize("spans, placed", [
    # a short hold at the end of the range: its name goes left of the band
    ([(END - 60, END)], [("end", "short-hold")]),
    # a short hold squeezed between two long ones in the same lane: tooltip only
    ([(START, START + 1770), (START + 1770, START + 1830), (START + 1830, END)],
     [("start", "a"), (None, None), ("start", "c")]),
])
def test_a_name_too_long_for_its_band_goes_where_the_lane_is_free(spans, placed):
    users = ["short-hold"] if len(spans) == 1 else ["a", "squeezed-between", "c"]
    root = chart(holders=[{"user": u, "server": "", "start": a, "end": b}
                          for u, (a, b) in zip(users, spans, strict=True)])
    got = []
    for h in root.findall("s:g[@class='holders']/s:g[@class='holder']", NS):
        text = h.find("s:text", NS)
        got.append((None, None) if text is None else (text.get("text-anchor", "start"),
                                                       text.text))
    assert got == placed


@pytest.mark.parametrize("holders, width, rows", [
    ([], 900, []),
    (["alice", "bob/train", "alice"], 900, [[(0, "alice", "alice"), (59.2, "bob/train",
                                                                        "bob")]]),
    (["a" * 10, "b" * 10, "c" * 10], 150, [[(0, "a" * 10, "a" * 10)],
                                           [(0, "b" * 10, "b" * 10)],
                                           [(0, "c" * 10, "c" * 10)]]),
])
def test_the_legend_names_each_holder_once_in_rows_that_fit(holders, width, rows):
    assert legend_rows(holders, width) == rows


def test_every_holder_is_named_in_the_legend_even_when_its_band_is_too_short():
    root = chart(holders=[{"user": "a-long-member-name", "server": "", "start": START,
                           "end": START + 15},
                          {"user": "bob", "server": "", "start": START + 15, "end": END}])
    legend = root.findall("s:g[@class='holders']/s:g[@class='holder-legend']", NS)
    assert [(g.get("data-user"), g.find("s:text", NS).text) for g in legend] == [
        ("a-long-member-name", "a-long-member-name"), ("bob", "bob")]
    assert legend[0].find("s:rect", NS).get("fill") == holder_colour("a-long-member-name")
    assert float(root.get("height")) >= max(float(t.get("y")) for t in root.iter(
        "{http://www.w3.org/2000/svg}text"))


def test_names_beside_short_bands_never_overlap():
    """Short holds close together (one test user after another): each name is drawn only
    where the lane is free of bands and of names already drawn."""
    holds = [(START + t, START + t + 20) for t in (0, 300, 420, 900, 1000, 1900, 2000,
                                                   2100, 3000, 3500, 3560)]
    root = chart(holders=[{"user": f"member-{i:02d}", "server": "", "start": a, "end": b}
                          for i, (a, b) in enumerate(holds)])
    drawn = []
    for h in root.findall("s:g[@class='holders']/s:g[@class='holder']", NS):
        text = h.find("s:text", NS)
        if text is not None:
            x0 = float(text.get("x"))
            width = len(text.text) * 6.6
            drawn.append((x0 - width, x0) if text.get("text-anchor") == "end"
                         else (x0, x0 + width))
    assert len(drawn) >= 5, drawn
    drawn.sort()
    assert all(a[1] <= b[0] for a, b in zip(drawn, drawn[1:], strict=False)), drawn
