"""Tangle: write the cells each chapter marks for export into its module of ``lib``.

A chapter ``chapters/NN-some-name.md`` owns the module ``lib/some_name.py``. Its code cells
tagged ``export`` are copied, in order, into that module under a header that says where
they came from, and the result is formatted with ruff so that ``lib`` reads like ordinary
hand-written code. The generated modules are committed: ``import lib`` needs no build.

    python tools/tangle.py           # rewrite every module
    python tools/tangle.py --check   # exit 1 if any module differs from its chapter

``tests/test_tangle.py`` runs the check, so lib and the chapters cannot drift apart.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
LIB = ROOT / "lib"
NOTEBOOK_DIR = ROOT / "_build" / "notebooks"  # converted chapters, for nbmake and ruff
EXPORT_TAG = "export"
CHAPTER_NAME = re.compile(r"^(\d\d)-([a-z0-9-]+)\.md$")

HEADER = """\
# This file is generated from {source} by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""


def chapter_files() -> list[Path]:
    """The chapter sources, in course order."""
    return sorted(p for p in CHAPTERS.glob("*.md") if CHAPTER_NAME.match(p.name))


def is_chapter(path: Path) -> bool:
    """True for a chapter source ``chapters/NN-name.md``."""
    return path.parent.resolve() == CHAPTERS and CHAPTER_NAME.match(path.name) is not None


def write_notebook(chapter: Path) -> Path:
    """Convert a chapter to ``_build/notebooks/NN-name.ipynb`` and return that path.

    Written under a temporary name and moved into place, so parallel test workers converting
    the same chapter never read half a file.
    """
    import jupytext

    NOTEBOOK_DIR.mkdir(parents=True, exist_ok=True)
    target = NOTEBOOK_DIR / (chapter.stem + ".ipynb")
    partial = target.with_name(f"{target.stem}.{os.getpid()}.part")
    partial.write_text(jupytext.writes(jupytext.read(chapter), fmt="ipynb"), encoding="utf-8")
    os.replace(partial, target)
    return target


def module_name(chapter: Path) -> str:
    """``01-tokenizer.md`` -> ``tokenizer``; ``09-flash-attention.md`` -> ``flash_attention``."""
    match = CHAPTER_NAME.match(chapter.name)
    if match is None:
        raise ValueError(f"{chapter.name!r} is not named NN-name.md")
    return match.group(2).replace("-", "_")


def export_cells(chapter: Path) -> list[str]:
    """The source of every code cell tagged ``export``, in order."""
    import jupytext

    notebook = jupytext.read(chapter)
    sources = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code" or EXPORT_TAG not in cell.metadata.get("tags", []):
            continue
        source = cell.source.strip("\n")
        for line in source.splitlines():
            if line.lstrip().startswith(("%", "!")):
                raise ValueError(
                    f"{chapter.name}, cell {index}: an exported cell must be plain Python, "
                    f"but has the notebook line {line.strip()!r}"
                )
        sources.append(source)
    return sources


def ruff_format(source: str, filename: str) -> str:
    """Format Python source with the project's ruff settings."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", filename, "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        if "No module named ruff" in done.stderr:
            raise RuntimeError("tangling needs ruff: pip install -e '.[test]'") from None
        raise RuntimeError(f"ruff could not format the code of {filename}:\n{done.stderr}")
    return done.stdout


def render(chapter: Path) -> str:
    """The text that ``lib/<module>.py`` should contain for this chapter."""
    cells = export_cells(chapter)
    if not cells:
        raise ValueError(f"{chapter.name} has no cell tagged {EXPORT_TAG!r}")
    source = f"chapters/{chapter.name}"
    body = "\n\n\n".join(cells) + "\n"
    target = f"lib/{module_name(chapter)}.py"
    return HEADER.format(source=source) + ruff_format(body, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    parser.add_argument("chapters", nargs="*", type=Path, help="only these chapters")
    args = parser.parse_args(argv)
    chapters = [p.resolve() for p in args.chapters] or chapter_files()
    stale = []
    for chapter in chapters:
        target = LIB / f"{module_name(chapter)}.py"
        text = render(chapter)
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(target.relative_to(ROOT))
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)} from chapters/{chapter.name}")
    if stale:
        print("out of date with their chapters (run `python tools/tangle.py`):")
        for path in stale:
            print(f"  {path}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
