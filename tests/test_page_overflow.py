"""tools/page_overflow.py: the book measured in a browser. The arithmetic, the PNG reading
and the tables run without one; the last test drives Chromium and is skipped where there
is none (CI has none) or no Playwright (the ``pages`` extra)."""

from __future__ import annotations

import argparse
import base64
import io
import re
import shutil
import zlib
from pathlib import Path

import pytest

from tools import page_overflow as po

ROOT = Path(__file__).resolve().parent.parent


def matplotlib_png(width_in: float = 10.0, dpi: float = 110) -> bytes:
    """A PNG as the book's figures are made: matplotlib, a tight box, at ``dpi``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, 3))
    fig.add_subplot().plot([0, 1], [1, 0], label="a line")
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=dpi)
    return out.getvalue()


def test_a_matplotlib_png_says_its_size_dpi_and_writer():
    png = po.read_png(matplotlib_png(10.0, 110))
    assert (png.width, png.height) == (1100, 330)
    assert png.dpi == pytest.approx(110, abs=0.01)  # stored as pixels a metre
    assert png.software.startswith("Matplotlib")


def test_a_file_that_is_no_png_is_refused_by_name():
    with pytest.raises(ValueError, match="not a PNG"):
        po.read_png(b"GIF89a" + bytes(40))


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (b"tEXt", b"Matplotlib version3.9"),
        (b"zTXt", b"\0" + zlib.compress(b"Matplotlib version3.9")),
        (b"iTXt", b"\0\0en\0\0Matplotlib version3.9"),
        (b"iTXt", b"\1\0\0\0" + zlib.compress(b"Matplotlib version3.9")),
    ],
)
def test_the_text_chunks_are_read_whatever_their_kind(kind, value):
    assert po.text_chunk(kind, value) == "Matplotlib version3.9"


def test_an_image_is_read_from_a_file_url_or_a_data_url(tmp_path):
    data = matplotlib_png(2.0)
    path = tmp_path / "figure one.png"
    path.write_bytes(data)
    assert po.image_bytes(path.as_uri()) == data
    encoded = base64.b64encode(data).decode()
    assert po.image_bytes(f"data:image/png;base64,{encoded}") == data
    assert po.image_bytes("https://example.org/a.png") is None
    assert po.image_bytes((tmp_path / "missing.png").as_uri()) is None


def test_text_size_on_the_screen():
    # 10 pt at 110 dpi is 15.3 px in the image; an image of 1100 px shown 342 px wide
    assert po.text_px(10, 110, 342, 1100) == pytest.approx(10 * 110 / 72 * 342 / 1100)
    assert po.text_px(9, 72, 500, 500) == 9  # at 72 dpi, full size: a point is a px
    with pytest.raises(ValueError, match="0 px wide"):
        po.text_px(10, 110, 342, 0)


def test_the_plot_style_and_the_phone_layout_keep_labels_at_9_px():
    """lib.utils.set_plot_style's smallest label, drawn at its dpi and shown at the share
    of its natural width that custom.css keeps on a phone, is at least 9 px high."""
    points, dpi = po.style_text()
    css = (ROOT / "book/_static/custom.css").read_text(encoding="utf-8")
    share = re.search(
        r"min-width: calc\(var\(--tfs-natural-width, 0px\) \* ([\d.]+)\)", css
    )
    assert share, (
        "custom.css no longer keeps figures at a share of their width on a phone"
    )
    assert points * dpi / 72 * float(share.group(1)) >= 9


def test_a_phone_is_emulated_below_600_px():
    phone = po.context_options(390)
    assert phone["viewport"]["width"] == 390 and phone["is_mobile"]
    assert phone["device_scale_factor"] == 3 and phone["has_touch"]
    desktop = po.context_options(1280)
    assert desktop["viewport"]["width"] == 1280 and "is_mobile" not in desktop


def test_the_default_widths_and_a_width_no_screen_has():
    assert po.parse_args([]).widths == [390, 1280]
    assert po.parse_args(["--max", "3"]).max_blocks == 3  # the old option's name
    with pytest.raises(SystemExit):
        po.parse_args(["--widths", "120"])


def probe_result(tmp_path, **changes):
    """What the in-page probe returns, for a page with one matplotlib figure and one
    other image."""
    figure = tmp_path / "figure.png"
    figure.write_bytes(matplotlib_png(10.0, 110))
    icon = tmp_path / "icon.png"
    icon.write_bytes(matplotlib_png(1.0, 110).replace(b"Matplotlib", b"Inkscape!!"))
    found = {
        "page_width": 390,
        "culprit": "",
        "blocks": 3,
        "folded_blocks": 2,
        "wide_blocks": ["x = 1  # a long line"],
        "equations": [
            {"state": "fits", "tex": "a", "width": 10},
            {"state": "scrolls", "tex": "b", "width": 900},
            {"state": "clipped", "tex": "c", "width": 900},
            {"state": "scrolls unseen", "tex": "d", "width": 900},
        ],
        "folded_equations": 1,
        "images": [
            {"src": figure.as_uri(), "shown": 660.0, "label": "Figure 4.2"},
            {"src": icon.as_uri(), "shown": 50.0, "label": ""},
        ],
    }
    found.update(changes)
    return found


def test_a_report_counts_what_is_cut_and_sizes_only_matplotlib_figures(tmp_path):
    report = po.report_from_probe(probe_result(tmp_path), 390, 10.0, 110.0)
    assert not report.wide
    assert [e["tex"] for e in report.cut] == ["c", "d"]  # scrolling with a fade is fine
    assert [f.label for f in report.figures] == ["Figure 4.2"]
    assert report.figures[0].text_px == pytest.approx(10 * 110 / 72 * 0.6, rel=1e-3)
    wide = po.report_from_probe(
        probe_result(tmp_path, page_width=431, culprit="<code> long_name"), 390, 10, 110
    )
    assert wide.wide and "long_name" in "\n".join(po.details(wide, 7, every=False))


def test_the_table_the_summary_and_the_limits(tmp_path):
    totals = po.Totals()
    phone = po.report_from_probe(
        probe_result(tmp_path, page_width=500, culprit="<pre> x"), 390, 10.0, 110.0
    )
    laptop = po.report_from_probe(probe_result(tmp_path), 1280, 10.0, 110.0)
    totals.add(390, phone)
    totals.add(1280, laptop)
    assert po.cell(phone, 7).split()[:3] == ["WIDE", "1/3", "2/4"]
    assert po.cell(laptop, 7).split()[0] == "ok"
    summary = "\n".join(totals.summary(7))
    assert "pages wider than the screen: 1" in summary
    assert "cut off unseen: 4 of 8" in summary
    assert "figure text at 390 px: median 9.2 px" in summary
    limits = argparse.Namespace(
        max_wide=0, max_blocks=None, max_cut=4, max_small=None, small_px=7.0
    )
    assert totals.failures(limits) == ["pages wider than the screen: 1 > 0"]
    limits.max_small, limits.small_px = 0, 10.0
    assert totals.failures(limits)[-1] == "figures with small text: 2 > 0"


def have_browser() -> bool:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return False
    return any(shutil.which(name) for name in po.CHROMIUM_NAMES)


@pytest.mark.skipif(not have_browser(), reason="needs Chromium and Playwright")
def test_in_chromium_a_page_is_measured_as_a_phone_shows_it(tmp_path):
    (tmp_path / "figure.png").write_bytes(matplotlib_png(10.0, 110))
    wide_math = '<mjx-math style="display:inline-block;width:1500px">x</mjx-math>'
    equation = f'<mjx-container display="true" style="display:block;{{}}">{wide_math}'
    page = tmp_path / "demo.html"
    page.write_text(
        '<html><head><meta name="viewport" content="width=device-width, '
        'initial-scale=1"></head><body style="margin:0"><article class="bd-article">'
        '<pre style="overflow:auto">short</pre>'
        f'<pre style="overflow:auto">{"wide " * 60}</pre>'
        f"<details><summary>folded</summary><pre>{'wide ' * 60}</pre></details>"
        + equation.format("overflow-x:hidden")
        + "</mjx-container>"
        + equation.format("overflow-x:auto")
        + "</mjx-container>"
        + equation.format("overflow-x:auto;-webkit-mask-image:linear-gradient(red,red)")
        + "</mjx-container>"
        + '<figure><img src="figure.png" style="width:330px"></figure>'
        + "<p><code>an_unbreakable_name_"
        + "x" * 80
        + "</code></p>"
        "</article></body></html>",
        encoding="utf-8",
    )
    reports = po.measure(page, [390, 1280], po.find_chromium(None), 10.0, 110.0)
    phone, laptop = reports[390], reports[1280]
    assert phone.wide and "an_unbreakable_name_" in phone.culprit
    assert not laptop.wide
    for report in (phone, laptop):
        assert (report.blocks, report.folded_blocks, len(report.wide_blocks)) == (
            2,
            1,
            1,
        )
        assert [e["state"] for e in report.equations] == [
            "clipped",
            "scrolls unseen",
            "scrolls",
        ]
        assert report.figures[0].text_px == pytest.approx(10 * 110 / 72 * 0.3, rel=0.01)


def test_the_book_loads_its_layout_files():
    """custom.css's fades and phone figures need layout.js: _config.yml loads both."""
    config = (ROOT / "_config.yml").read_text(encoding="utf-8")
    for key, name in (("html_css_files", "custom.css"), ("html_js_files", "layout.js")):
        assert re.search(rf'^\s+{key}: \["{re.escape(name)}"\]', config, re.M), key
        assert (ROOT / "book/_static" / name).is_file(), name
    script = (ROOT / "book/_static/layout.js").read_text(encoding="utf-8")
    assert "--tfs-natural-width" in script and "tfsMore" in script
