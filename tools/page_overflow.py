"""Count the code and output blocks that overflow the book's column, in a real browser.

Each chapter page of the built book (``_build/html/chapters/*.html``) is opened in headless
Chromium at the widths readers use, and every ``<pre>`` of the article whose content is
wider than its box (``scrollWidth > clientWidth``: a horizontal scrollbar) is counted.

    python3 tasks.py pages                    # after `python3 tasks.py book`
    python tools/page_overflow.py --widths 1280 1366 --max 0
    python tools/page_overflow.py --list     # the widest line of each such block

Chromium comes from the system (Debian/Ubuntu: ``apt install chromium``); ``--chromium``
names another binary. The page is measured as it is: a copy of it, with a small script
that writes the counts into the document, is loaded from the same folder (so its styles
and fonts load as the reader's do) and read back with ``--dump-dom``.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "_build" / "html" / "chapters"
REPORT_ID = "tfs-overflow-report"
PROBE = (
    """<script>
(() => {
  let done = false;
  const measure = () => {
    if (done) return;
    done = true;
    const blocks = [...document.querySelectorAll("article pre, .bd-article pre")];
    const wide = blocks.filter((b) => b.scrollWidth > b.clientWidth + 1);
    const report = document.createElement("pre");
    report.id = "REPORT_ID";
    report.textContent = JSON.stringify({
      blocks: blocks.length,
      overflowing: wide.length,
      examples: wide.map((b) => {
        const lines = b.textContent.split("\\n");
        return lines.reduce((a, c) => (c.length > a.length ? c : a), "");
      }),
    });
    document.body.appendChild(report);
  };
  // the stylesheets are in (a script waits for them); measure once the fonts are, or
  // after two seconds where a resource never arrives offline
  document.fonts.ready.then(measure);
  setTimeout(measure, 2000);
})();
</script>"""
).replace("REPORT_ID", REPORT_ID)


def find_chromium(name: str | None) -> str:
    for candidate in (
        [name] if name else ["chromium", "chromium-browser", "google-chrome"]
    ):
        found = shutil.which(candidate) if candidate else None
        if found:
            return found
    sys.exit(
        "page_overflow: no Chromium found (Debian/Ubuntu: apt install chromium; or pass "
        "--chromium PATH)"
    )


def measure(page: Path, width: int, chromium: str) -> dict:
    """``{"blocks": n, "overflowing": k, "examples": [...]}`` for one page at one width."""
    text = page.read_text(encoding="utf-8")
    probe_page = page.with_name(f".overflow-{page.name}")
    probe_page.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            done = subprocess.run(
                [
                    chromium,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    f"--user-data-dir={profile}",
                    f"--window-size={width},900",
                    "--virtual-time-budget=8000",
                    "--dump-dom",
                    probe_page.resolve().as_uri(),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
    finally:
        probe_page.unlink(missing_ok=True)
    match = re.search(rf'<pre id="{REPORT_ID}"[^>]*>(.*?)</pre>', done.stdout, re.S)
    if match is None:
        raise RuntimeError(
            f"{page.name} at {width} px: no report ({done.stderr[-500:]})"
        )
    return json.loads(html.unescape(match.group(1)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1280, 1366])
    parser.add_argument("--max", type=int, default=None, help="fail above this count")
    parser.add_argument("--chromium", default=None)
    parser.add_argument("--pages", type=Path, default=PAGES)
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the widest line of every overflowing block (default: one a page)",
    )
    args = parser.parse_args(argv)
    chromium = find_chromium(args.chromium)
    pages = sorted(p for p in args.pages.glob("*.html") if not p.name.startswith("."))
    if not pages:
        sys.exit(f"page_overflow: no pages in {args.pages}: build the book first")
    total = 0
    print(f"{'chapter':<24}" + "".join(f"{w:>10} px" for w in args.widths))
    for page in pages:
        counts = [measure(page, width, chromium) for width in args.widths]
        total += sum(c["overflowing"] for c in counts)
        cells = "".join(f"{c['overflowing']:>6}/{c['blocks']:<6}" for c in counts)
        print(f"{page.stem:<24}{cells}")
        for width, count in zip(args.widths, counts):
            for line in count["examples"][: None if args.list else 1]:
                print(f"    {width} px, {len(line)} chars: {line[:100]!r}")
    print(f"overflowing blocks in all, over {len(args.widths)} widths: {total}")
    return 1 if args.max is not None and total > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
