"""How the built book reads on a phone and on a laptop, measured in a real browser.

Each chapter page of the built book (``_build/html/chapters/*.html``) is opened in
Chromium, driven by Playwright, at each width asked for (default: 390 and 1280 px). A
width under 600 px is a phone: device emulation with a viewport that wide, a touch screen,
the mobile layout rules and a device scale factor of 3; a wider one is a desktop window.
Per page and width it measures:

* **wide**: whether the page is wider than the screen (the document's ``scrollWidth`` above
  the viewport's width), so that the whole page pans sideways; it names the element that
  sticks out furthest (an unbreakable inline name, a table, an equation);
* **blocks**: the code and output blocks (``<pre>``) of the article whose content is wider
  than their box (they scroll inside it), out of those shown; the blocks of folded cells
  (a closed ``<details>``, or anything not rendered) are left out of both counts;
* **cut**: the display equations (MathJax's ``mjx-container[display]``) whose content is
  wider than the box that shows it, where the reader can neither tell nor reach the rest:
  clipped by a box that does not scroll, or in a box that scrolls but shows no fade (a
  mask or background image on the box or on its ``::before``/``::after``). A scrollbar
  does not count: phones and macOS show none until one scrolls, and the browser runs
  with scrollbars hidden (Playwright's default) to read as they do;
* **figure text**: for each matplotlib image of the page, the size on the screen, in CSS
  px, of the smallest text the course's plot style sets (tick labels, axis labels,
  legends, titles: :func:`lib.utils.set_plot_style`): ``points * dpi / 72 *
  displayed width / natural width``, with the dpi read from the PNG itself (matplotlib
  writes it in the ``pHYs`` chunk) and the displayed width from the browser's layout.
  A size a figure's own code sets (``fontsize=``) is not seen, and the figures are taken
  to be drawn in the style as it is now (a build whose execution cache predates a change
  to the style shows older ones). The table gives the median over the page's figures and
  how many are under ``--small-px`` (7 px).

    python3 tasks.py pages                    # after `python3 tasks.py book`
    python tools/page_overflow.py --widths 390 1280 --max-wide 0 --max-cut 0
    python tools/page_overflow.py --list      # every scrolling block, cut equation, small figure

The browser is the system's Chromium (Debian/Ubuntu: ``apt install chromium``;
``--chromium`` names another binary), driven by the ``playwright`` package (``tasks.py
pages`` installs it); Playwright's own browser download is not used.
"""

from __future__ import annotations

import argparse
import base64
import shutil
import statistics
import struct
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "_build" / "html" / "chapters"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
PHONE_BELOW = 600  # a width under this is emulated as a phone
PHONE_SCALE = 3  # device pixels per CSS px of the phone emulated (an iPhone 12 to 15)
SMALL_PX = 7.0
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Runs in the page, once MathJax has typeset it and the fonts are in; `width` is the
# screen's width in CSS px. Returns what `measure` turns into a `Report`.
PROBE = """
(width) => {
  const article =
    document.querySelector("article.bd-article") ||
    document.querySelector("article") ||
    document.body;
  const shown = (el) =>
    el.getClientRects().length > 0 && !el.closest("details:not([open])");
  const describe = (el) => {
    const classes = [...el.classList].slice(0, 2).map((c) => "." + c).join("");
    const text = (el.textContent || "").replace(/\\s+/g, " ").trim().slice(0, 60);
    return `<${el.tagName.toLowerCase()}${classes}> ${text}`;
  };
  const overflowX = (el) => getComputedStyle(el).overflowX;
  const fixed = (el) => {
    for (let a = el; a && a !== document.documentElement; a = a.parentElement) {
      if (getComputedStyle(a).position === "fixed") return true;
    }
    return false;
  };
  const doc = document.documentElement;
  const pageWidth = Math.max(doc.scrollWidth, document.body.scrollWidth);

  // (a) the element that sticks out furthest past the screen, unclipped
  let culprit = null;
  if (pageWidth > width + 1) {
    let right = width + 1;
    for (const el of document.body.querySelectorAll("*")) {
      const box = el.getBoundingClientRect();
      if (box.right < right || !shown(el) || fixed(el)) continue;
      let clipped = false;
      for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
        if (overflowX(a) !== "visible" && a.getBoundingClientRect().right <= width + 1) {
          clipped = true;
          break;
        }
      }
      if (clipped) continue;
      culprit = el; // later in document order wins a tie: the innermost
      right = box.right;
    }
  }

  // (b) code and output blocks wider than their box, folded cells left out
  const pres = [...article.querySelectorAll("pre")];
  const open = pres.filter(shown);
  const wideBlocks = open
    .filter((b) => b.scrollWidth > b.clientWidth + 1)
    .map((b) =>
      b.textContent.split("\\n").reduce((a, c) => (c.length > a.length ? c : a), "")
    );

  // (c) display equations wider than what shows them: reachable or not, told or not
  // a fade: a mask or a background image on the box or its ::before / ::after
  const painted = (s) =>
    [s.backgroundImage, s.maskImage, s.webkitMaskImage].some((v) => v && v !== "none");
  const cue = (el) =>
    painted(getComputedStyle(el)) ||
    painted(getComputedStyle(el, "::before")) ||
    painted(getComputedStyle(el, "::after"));
  const tex = (el) => {
    try {
      const items = MathJax.startup.document.getMathItemsWithin(el);
      return items.length ? String(items[0].math).replace(/\\s+/g, " ").trim() : "";
    } catch (e) {
      return "";
    }
  };
  const equations = [];
  let foldedEquations = 0;
  for (const eq of article.querySelectorAll('mjx-container[display="true"]')) {
    if (!shown(eq)) {
      foldedEquations += 1;
      continue;
    }
    const content = (eq.querySelector("mjx-math") || eq).getBoundingClientRect();
    let state = "fits";
    for (let a = eq; a && a !== doc; a = a.parentElement) {
      const box = a.getBoundingClientRect();
      const over = content.right > box.right + 1 || content.left < box.left - 1;
      const ox = overflowX(a);
      if (!over || ox === "visible") continue;
      if (ox === "auto" || ox === "scroll") state = cue(a) ? "scrolls" : "scrolls unseen";
      else state = "clipped";
      break;
    }
    if (state === "fits" && content.right > width + 1) state = "past the screen";
    equations.push({ state, tex: tex(eq).slice(0, 80), width: Math.round(content.width) });
  }

  // (d) images shown: where they come from and how wide they are on the screen
  const images = [...article.querySelectorAll("img")].filter(shown).map((img) => {
    const figure = img.closest("figure");
    const number = figure && figure.querySelector(".caption-number");
    return {
      src: img.currentSrc || img.src,
      shown: img.getBoundingClientRect().width,
      label: number ? number.textContent.trim() : "",
    };
  });

  return {
    page_width: pageWidth,
    culprit: culprit ? describe(culprit) : "",
    blocks: open.length,
    folded_blocks: pres.length - open.length,
    wide_blocks: wideBlocks,
    equations,
    folded_equations: foldedEquations,
    images,
  };
}
"""


# --- PNG files: read without an imaging library ------------------------------------------


@dataclass
class Png:
    width: int
    height: int
    dpi: float | None  # from the pHYs chunk, when it is in metres
    software: str  # the tEXt chunk "Software" ("Matplotlib version3.9.2, https://...")


def read_png(data: bytes) -> Png:
    """Size, resolution and writer of a PNG, from its chunks (``ValueError`` if not one)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file (no PNG signature)")
    width = height = 0
    dpi: float | None = None
    software = ""
    at = 8
    while at + 8 <= len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        body = data[at + 8 : at + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"pHYs" and len(body) == 9 and body[8] == 1:
            (per_metre,) = struct.unpack(">I", body[:4])
            dpi = per_metre * 0.0254
        elif kind in (b"tEXt", b"zTXt", b"iTXt"):
            key, _, value = body.partition(b"\0")
            if key == b"Software":
                software = text_chunk(kind, value)
        elif kind == b"IEND":
            break
        at += 12 + length
    if not width:
        raise ValueError("not a PNG file (no IHDR chunk)")
    return Png(width, height, dpi, software)


def text_chunk(kind: bytes, value: bytes) -> str:
    """The text of a tEXt, zTXt or iTXt chunk, after its keyword and the zero byte."""
    if kind == b"zTXt":  # a compression method byte, then zlib data
        return zlib.decompress(value[1:]).decode("latin-1")
    if kind == b"iTXt":  # compressed?, method, language, 0, translated keyword, 0, text
        compressed = value[:1] == b"\1"
        _language, _, rest = value[2:].partition(b"\0")
        _translated, _, text = rest.partition(b"\0")
        return (zlib.decompress(text) if compressed else text).decode("utf-8")
    return value.decode("latin-1")


def image_bytes(src: str) -> bytes | None:
    """The bytes of an image the page shows: a ``file:`` URL or a base64 ``data:`` URL."""
    if src.startswith("data:"):
        meta, _, payload = src.partition(",")
        return base64.b64decode(payload) if meta.endswith(";base64") else None
    url = urlparse(src)
    if url.scheme != "file":
        return None
    path = Path(unquote(url.path))
    return path.read_bytes() if path.is_file() else None


# --- the figures' text -------------------------------------------------------------------


def style_text() -> tuple[float, float]:
    """The smallest text size, in points, that the course's plot style sets for the labels
    of a figure (tick labels, axis labels, legends, titles), and the style's figure dpi
    (used where a PNG does not say its own), from :func:`lib.utils.set_plot_style`."""
    import matplotlib as mpl
    from matplotlib.font_manager import FontProperties

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from lib.utils import set_plot_style

    keys = (
        "xtick.labelsize",
        "ytick.labelsize",
        "axes.labelsize",
        "axes.titlesize",
        "legend.fontsize",
    )
    with mpl.rc_context():
        set_plot_style()
        points = min(
            FontProperties(size=mpl.rcParams[key]).get_size_in_points() for key in keys
        )
        return points, float(mpl.rcParams["figure.dpi"])


def text_px(points: float, dpi: float, shown_width: float, natural_width: int) -> float:
    """The size on the screen, in CSS px, of text of ``points`` drawn at ``dpi`` into an
    image ``natural_width`` pixels wide and shown ``shown_width`` CSS px wide."""
    if natural_width <= 0:
        raise ValueError(f"an image {natural_width} px wide has no text size")
    return points * dpi / 72 * shown_width / natural_width


# --- one page at one width ----------------------------------------------------------------


@dataclass
class Figure:
    label: str  # "Figure 4.2", or "image 3" for an output without a caption
    text_px: float


@dataclass
class Report:
    """What one page shows at one width."""

    width: int  # of the screen, CSS px
    page_width: int
    culprit: str
    blocks: int
    folded_blocks: int
    wide_blocks: list[str]
    equations: list[dict]
    folded_equations: int
    figures: list[Figure] = field(default_factory=list)

    @property
    def wide(self) -> bool:
        """Whether the page is wider than the screen (it pans sideways)."""
        return self.page_width > self.width + 1

    @property
    def cut(self) -> list[dict]:
        """The display equations cut off with no visible way to the rest."""
        return [
            e for e in self.equations if e["state"] in ("clipped", "scrolls unseen")
        ]


def report_from_probe(
    found: dict, width: int, points: float, style_dpi: float
) -> Report:
    """A ``Report`` from what the probe returned, the figures' text sizes worked out."""
    figures = []
    for n, image in enumerate(found["images"], 1):
        data = image_bytes(image["src"])
        if data is None or data[:8] != b"\x89PNG\r\n\x1a\n":
            continue
        png = read_png(data)
        if not png.software.lower().startswith("matplotlib"):
            continue
        size = text_px(points, png.dpi or style_dpi, image["shown"], png.width)
        figures.append(Figure(image["label"] or f"image {n}", size))
    return Report(
        width=width,
        page_width=found["page_width"],
        culprit=found["culprit"] or "(no element found)",
        blocks=found["blocks"],
        folded_blocks=found["folded_blocks"],
        wide_blocks=found["wide_blocks"],
        equations=found["equations"],
        folded_equations=found["folded_equations"],
        figures=figures,
    )


def context_options(width: int) -> dict:
    """Playwright's browser-context options for a screen ``width`` CSS px wide: a phone
    (touch, mobile layout, 3 device pixels a CSS px) under 600 px, else a desktop."""
    if width < PHONE_BELOW:
        return {
            "viewport": {"width": width, "height": round(width * 2.16)},
            "is_mobile": True,
            "has_touch": True,
            "device_scale_factor": PHONE_SCALE,
        }
    return {"viewport": {"width": width, "height": 900}, "device_scale_factor": 1}


def find_chromium(name: str | None) -> str:
    for candidate in [name] if name else CHROMIUM_NAMES:
        found = shutil.which(candidate) if candidate else None
        if found:
            return found
    sys.exit(
        "page_overflow: no Chromium found (Debian/Ubuntu: apt install chromium; or pass "
        "--chromium PATH)"
    )


def load_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sys.exit(
            "page_overflow: needs the playwright package (python3 tasks.py pages "
            "installs it; or pip install playwright). Its browser download is not needed: "
            "the system's Chromium is used."
        )
    return sync_playwright


class Browser:
    """One Chromium for every page; a fresh context (screen) for each width."""

    def __init__(self, chromium: str):
        self._manager = load_playwright()()
        playwright = self._manager.__enter__()
        try:
            # Playwright's own default flags stay, --hide-scrollbars among them
            self._browser = playwright.chromium.launch(
                executable_path=chromium, args=CHROMIUM_ARGS
            )
        except Exception as error:
            self._manager.__exit__(None, None, None)
            raise RuntimeError(
                f"page_overflow: {chromium} did not start: {error}"
            ) from None
        self._contexts: dict[int, object] = {}

    def probe(self, page: Path, width: int) -> dict:
        if width not in self._contexts:
            self._contexts[width] = self._browser.new_context(**context_options(width))
        tab = self._contexts[width].new_page()
        try:
            tab.goto(page.resolve().as_uri(), wait_until="load", timeout=60_000)
            # MathJax typesets after the load event; the fonts may come later still
            tab.evaluate(
                "() => Promise.race([Promise.all([document.fonts.ready,"
                " (window.MathJax && MathJax.startup && MathJax.startup.promise)"
                " || null]), new Promise((r) => setTimeout(r, 10000))])"
            )
            tab.evaluate("() => new Promise((r) => requestAnimationFrame(() => r()))")
            return tab.evaluate(PROBE, width)
        finally:
            tab.close()

    def close(self) -> None:
        self._browser.close()
        self._manager.__exit__(None, None, None)


def measure(
    page: Path,
    widths: list[int],
    chromium: str,
    points: float | None = None,
    style_dpi: float | None = None,
) -> dict[int, Report]:
    """One page at each width (a browser started for it alone; ``main`` shares one)."""
    if points is None or style_dpi is None:
        points, style_dpi = style_text()
    browser = Browser(chromium)
    try:
        return {
            w: report_from_probe(browser.probe(page, w), w, points, style_dpi)
            for w in widths
        }
    finally:
        browser.close()


# --- the tables ----------------------------------------------------------------------------


def cell(report: Report, small_px: float) -> str:
    """One page at one width, in a table cell: wide? blocks, equations cut, figure text."""
    sizes = [f.text_px for f in report.figures]
    figures = (
        f"{statistics.median(sizes):4.1f} {sum(s < small_px for s in sizes):>2}/{len(sizes):<2}"
        if sizes
        else f"{'-':>4} {'':5}"
    )
    cut = f"{len(report.cut)}/{len(report.equations)}"
    blocks = f"{len(report.wide_blocks)}/{report.blocks}"
    return f"{'WIDE' if report.wide else 'ok':>4} {blocks:>7} {cut:>6} {figures}"


HEADER = f"{'page':>4} {'blocks':>7} {'cut':>6} {'text':>4} {'small':<5}"


def details(report: Report, small_px: float, every: bool) -> list[str]:
    """The lines under a page's row: what is wide, cut, scrolled or small (the first of
    each kind, or every one with ``every``)."""
    width = report.width
    first = None if every else 1
    lines = []
    if report.wide:
        lines.append(
            f"    {width} px: page {report.page_width} px wide, by {report.culprit}"
        )
    for eq in report.cut[:first]:
        lines.append(f"    {width} px: equation {eq['state']}: {eq['tex']!r}")
    for line in report.wide_blocks[:first]:
        lines.append(f"    {width} px: block scrolls, {len(line)} chars: {line[:80]!r}")
    small = sorted(
        (f for f in report.figures if f.text_px < small_px), key=lambda f: f.text_px
    )
    for figure in small[:first]:
        lines.append(f"    {width} px: {figure.label}: text {figure.text_px:.1f} px")
    return lines


@dataclass
class Totals:
    wide: int = 0
    blocks: int = 0
    cut: int = 0
    equations: int = 0
    sizes: dict[int, list[float]] = field(default_factory=dict)

    def add(self, width: int, report: Report) -> None:
        self.wide += report.wide
        self.blocks += len(report.wide_blocks)
        self.cut += len(report.cut)
        self.equations += len(report.equations)
        self.sizes.setdefault(width, []).extend(f.text_px for f in report.figures)

    def summary(self, small_px: float) -> list[str]:
        lines = [
            f"pages wider than the screen: {self.wide}; blocks that scroll: {self.blocks}; "
            f"display equations cut off unseen: {self.cut} of {self.equations} "
            "(all widths together)"
        ]
        for width, sizes in self.sizes.items():
            if sizes:
                small = sum(s < small_px for s in sizes)
                lines.append(
                    f"figure text at {width} px: median {statistics.median(sizes):.1f} px, "
                    f"smallest {min(sizes):.1f} px, {small} of {len(sizes)} under "
                    f"{small_px:g} px"
                )
        return lines

    def small(self, small_px: float) -> int:
        return sum(s < small_px for sizes in self.sizes.values() for s in sizes)

    def failures(self, limits: argparse.Namespace) -> list[str]:
        """What goes past the limits asked for (``None``: no limit)."""
        found = {
            "max_wide": (self.wide, "pages wider than the screen"),
            "max_blocks": (self.blocks, "blocks that scroll"),
            "max_cut": (self.cut, "equations cut off"),
            "max_small": (self.small(limits.small_px), "figures with small text"),
        }
        return [
            f"{what}: {count} > {getattr(limits, key)}"
            for key, (count, what) in found.items()
            if getattr(limits, key) is not None and count > getattr(limits, key)
        ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[390, 1280])
    parser.add_argument(
        "--max-wide", type=int, default=None, help="fail above this count"
    )
    parser.add_argument(
        "--max-cut", type=int, default=None, help="fail above this count"
    )
    parser.add_argument(
        "--max-blocks", "--max", type=int, default=None, help="fail above this count"
    )
    parser.add_argument(
        "--max-small",
        type=int,
        default=None,
        help="fail above this count of figures whose text is under --small-px",
    )
    parser.add_argument("--small-px", type=float, default=SMALL_PX)
    parser.add_argument("--chromium", default=None)
    parser.add_argument("--pages", type=Path, default=PAGES)
    parser.add_argument(
        "--only", nargs="+", default=None, help="pages whose name starts so (04 07-2)"
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print every block that scrolls, equation cut off and figure with small "
        "text (default: the first of each)",
    )
    args = parser.parse_args(argv)
    if any(w < 200 for w in args.widths):
        parser.error(f"--widths {args.widths}: a screen is at least 200 px wide")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chromium = find_chromium(args.chromium)
    pages = sorted(p for p in args.pages.glob("*.html") if not p.name.startswith("."))
    if args.only:
        pages = [p for p in pages if p.stem.startswith(tuple(args.only))]
    if not pages:
        sys.exit(f"page_overflow: no pages in {args.pages}: build the book first")
    points, style_dpi = style_text()
    print(
        f"figure text: {points:g} pt (the plot style's smallest label); a phone is "
        f"emulated under {PHONE_BELOW} px"
    )
    print(f"{'':<22}" + "".join(f"{f'{w} px':^35}" for w in args.widths))
    print(f"{'page':<22}" + "".join(f" {HEADER}" for _ in args.widths))
    totals = Totals()
    browser = Browser(chromium)
    try:
        for page in pages:
            reports = {
                w: report_from_probe(browser.probe(page, w), w, points, style_dpi)
                for w in args.widths
            }
            print(
                f"{page.stem:<22}"
                + "".join(f" {cell(r, args.small_px)}" for r in reports.values()),
                flush=True,
            )
            for width, report in reports.items():
                totals.add(width, report)
                for line in details(report, args.small_px, args.list):
                    print(line)
    finally:
        browser.close()
    print(
        "columns: page wider than the screen; blocks that scroll / blocks shown; "
        "equations cut off unseen / shown; figure text, median px; figures under "
        f"{args.small_px:g} px / figures"
    )
    for line in totals.summary(args.small_px):
        print(line)
    failed = totals.failures(args)
    for line in failed:
        print(f"page_overflow: over the limit: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
