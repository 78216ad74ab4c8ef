"""common/admin_charts.py: pure data → SVG string, every text escaped, well-formed XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from decimal import Decimal
from itertools import pairwise

import pytest

from common.admin_charts import Series, _nice_ceiling, bar_chart, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on anything that is not well-formed
    assert root.tag == f"{SVG}svg"
    return root


def test_bar_chart_draws_one_bar_per_label_scaled_to_the_largest():
    root = parse(bar_chart(title="Tokens", labels=["a", "b", "c"], values=[0, 50, 100], unit="tokens"))
    bars = root.findall(f"{SVG}rect[@class='bar']")
    assert len(bars) == 3
    heights = [float(b.get("height")) for b in bars]
    assert heights[0] == 0 and heights[2] == pytest.approx(2 * heights[1])
    assert [b.find(f"{SVG}title").text for b in bars] == ["a: 0 tokens", "b: 50 tokens", "c: 100 tokens"]


def test_bar_chart_takes_decimal_money_and_formats_it_as_asked():
    svg = bar_chart(title="Spend", labels=["d1", "d2"], values=[Decimal("0.0100"), Decimal("1.2345")],
                    value_format=lambda v: f"{Decimal(v):.4f}", unit="USD")
    assert "d2: 1.2345 USD" in svg and "d1: 0.0100 USD" in svg


def test_text_is_escaped_everywhere():
    evil = '<script>alert(1)</script>"&'
    for svg in (bar_chart(title=evil, labels=[evil], values=[1], unit=evil),
                line_chart(title=evil, labels=[evil], series=[Series(evil, [0.5], '"><x')], reference=0.9,
                           reference_label=evil)):
        parse(svg)
        assert "<script>" not in svg and '"><x' not in svg and "&lt;script&gt;" in svg


def test_no_data_says_so_instead_of_an_empty_frame():
    for svg in (bar_chart(title="T", labels=["a", "b"], values=[0, 0]), bar_chart(title="T", labels=[], values=[]),
                line_chart(title="L", labels=["a"], series=[Series("s", [None], "#000")])):
        assert "No data in this period" in svg
        parse(svg)


def test_mismatched_lengths_are_refused_by_name():
    with pytest.raises(ValueError, match="one per label"):
        bar_chart(title="T", labels=["a"], values=[1, 2])
    with pytest.raises(ValueError, match="series 'x'"):
        line_chart(title="L", labels=["a", "b"], series=[Series("x", [1.0], "#000")])


def test_line_chart_leaves_gaps_for_days_without_traffic():
    root = parse(line_chart(title="L", labels=["1", "2", "3", "4"], series=[Series("s", [0.99, None, 1.0, 0.98], "#000")]))
    assert len(root.findall(f"{SVG}polyline")) == 2  # [1] and [3, 4]: no line across the empty day
    assert len(root.findall(f"{SVG}circle")) == 3


def test_line_chart_zooms_in_below_the_lowest_value_and_the_objective():
    svg = line_chart(title="L", labels=["1", "2"], series=[Series("s", [0.999, 0.998], "#000")], reference=0.995)
    root = parse(svg)
    ys = [float(c.get("cy")) for c in root.findall(f"{SVG}circle")]
    ref_y = float(root.find(f"{SVG}line[@class='reference']").get("y1"))
    assert ys[0] < ys[1] < ref_y  # 99.9 % above 99.8 % above the 99.5 % objective, visibly apart
    assert ref_y - ys[0] > 20
    assert "objective: 99.50%" in svg


def test_nice_ceiling():
    assert [_nice_ceiling(v) for v in (0, 0.7, 1, 3, 7, 12, 2400, 99_999)] == [1, 1, 1, 5, 10, 20, 2500, 100_000]


def test_a_month_of_day_labels_stays_legible():
    root = parse(bar_chart(title="T", labels=[f"11-{d:02}" for d in range(1, 31)], values=[1] * 30))
    xs = [float(t.get("x")) for t in root.findall(f"{SVG}text") if t.get("text-anchor") == "middle"]
    assert 5 <= len(xs) <= 9 and (root.findall(f"{SVG}text")[-1].text == "11-30")
    assert min(b - a for a, b in pairwise(xs)) > 40  # no label drawn over its neighbour
