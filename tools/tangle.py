"""Tangle: write the cells each chapter marks for export into its module of ``lib``.

A chapter ``chapters/NN-some-name.md`` owns the module ``lib/some_name.py``. Its code cells
tagged ``export`` are copied, in order, into that module under a header that says where
they came from, and the result is formatted with ruff so that ``lib`` reads like ordinary
hand-written code. A cell tagged ``export:other_name`` goes to ``lib/other_name.py``
instead, so one chapter can fill several modules (chapter 7 writes ``models``,
``generation`` and ``hf_weights``). The generated modules are committed: ``import lib``
needs no build.

A chapter may not import a module it is generating (``from lib.tokenizer import ...``
inside chapter 1): the reader would run the committed copy instead of the code on the page.
When one generated module needs another of the same chapter (``lib/generation.py`` uses
``lib.models``), the export cell writes the import as a comment, ``# lib: from lib.models
import GPT``: in the notebook the names already exist, and the tangle uncomments the line.

    python tools/tangle.py           # rewrite every module
    python tools/tangle.py --check   # exit 1 if any module differs from its chapter

``tests/test_tangle.py`` runs the check, so lib and the chapters cannot drift apart.
"""

from __future__ import annotations

import argparse
import ast
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
LIB_ONLY = re.compile(
    r"^(\s*)# lib: (.+)$", re.MULTILINE
)  # a line only the module runs

HEADER = """\
# This file is generated from {source} by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""


def chapter_files() -> list[Path]:
    """The chapter sources, in course order."""
    return sorted(p for p in CHAPTERS.glob("*.md") if CHAPTER_NAME.match(p.name))


def is_chapter(path: Path) -> bool:
    """True for a chapter source ``chapters/NN-name.md``."""
    return (
        path.parent.resolve() == CHAPTERS and CHAPTER_NAME.match(path.name) is not None
    )


def write_notebook(chapter: Path, directory: Path | None = None) -> Path:
    """Convert a chapter to ``_build/notebooks/NN-name.ipynb`` (or into ``directory``) and
    return that path.

    Written under a temporary name and moved into place, so parallel test workers converting
    the same chapter never read half a file.
    """
    import jupytext

    directory = NOTEBOOK_DIR if directory is None else directory
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / (chapter.stem + ".ipynb")
    partial = target.with_name(f"{target.stem}.{os.getpid()}.part")
    partial.write_text(
        jupytext.writes(jupytext.read(chapter), fmt="ipynb"), encoding="utf-8"
    )
    os.replace(partial, target)
    return target


def module_name(chapter: Path) -> str:
    """``01-tokenizer.md`` -> ``tokenizer``; ``09-flash-attention.md`` -> ``flash_attention``."""
    match = CHAPTER_NAME.match(chapter.name)
    if match is None:
        raise ValueError(f"{chapter.name!r} is not named NN-name.md")
    return match.group(2).replace("-", "_")


def cell_target(tags: list[str], default: str) -> str | None:
    """The module a cell exports to: ``default`` for ``export``, ``name`` for ``export:name``."""
    targets = []
    for tag in tags:
        if tag == EXPORT_TAG:
            targets.append(default)
        elif tag.startswith(EXPORT_TAG + ":"):
            name = tag.split(":", 1)[1]
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                raise ValueError(
                    f"export tag {tag!r} must name a module: export:some_name"
                )
            targets.append(name)
    if len(targets) > 1:
        raise ValueError(f"a cell may export to one module only, got tags {tags}")
    return targets[0] if targets else None


HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$")


def _last_heading(markdown: str) -> str | None:
    """The last Markdown heading of a cell (code fences skipped), as plain text."""
    heading, fenced = None, False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (match := HEADING.match(line)):
            heading = match.group(1).replace("`", "")
    return heading


def origin_comment(chapter: Path, section: str | None) -> str:
    """The one-line comment put before each exported cell's code in ``lib``."""
    where = f"chapters/{chapter.name}"
    return f'# From {where}, section "{section}".' if section else f"# From {where}."


def export_cells_by_module(chapter: Path) -> dict[str, list[str]]:
    """The source of every exported code cell, grouped by target module, in order, each
    preceded by a comment naming the chapter and the section it is written in."""
    import jupytext

    notebook = jupytext.read(chapter)
    default = module_name(chapter)
    modules: dict[str, list[str]] = {}
    section = None
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            section = _last_heading(cell.source) or section
        if cell.cell_type != "code":
            continue
        target = cell_target(list(cell.metadata.get("tags", [])), default)
        if target is None:
            continue
        source = cell.source.strip("\n")
        for line in source.splitlines():
            if line.lstrip().startswith(("%", "!")):
                raise ValueError(
                    f"{chapter.name}, cell {index}: an exported cell must be plain Python, "
                    f"but has the notebook line {line.strip()!r}"
                )
        code = LIB_ONLY.sub(r"\1\2", source)
        modules.setdefault(target, []).append(
            origin_comment(chapter, section) + "\n" + code
        )
    return modules


def public_names(cells: list[str]) -> list[str]:
    """The names a module exports, in the order its cells define them: every top-level
    function, class and assignment whose name does not start with ``_``."""
    names: list[str] = []
    for node in ast.parse("\n\n".join(cells)).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found = [node.name]
        elif isinstance(node, ast.Assign):
            found = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = [node.target.id]
        else:
            continue
        names += [n for n in found if not n.startswith("_") and n not in names]
    return names


def _hand_kept_all(cell: str) -> bool:
    """True if the cell assigns ``__all__`` itself."""
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for node in ast.parse(cell).body
    )


def with_derived_all(cells: list[str], chapter: Path) -> list[str]:
    """The cells with ``__all__`` generated from :func:`public_names` and put after the
    first cell (the module docstring and imports). A chapter does not keep it by hand."""
    if any(_hand_kept_all(cell) for cell in cells):
        raise ValueError(
            f"{chapter.name}: an export cell assigns __all__; tools/tangle.py derives it "
            "from the names the export cells define: delete it"
        )
    listed = "".join(f"    {name!r},\n" for name in public_names(cells))
    generated = (
        "# The public names: every top-level name the export cells define (tools/tangle.py).\n"
        f"__all__ = [\n{listed}]"
    )
    # right after the first cell's imports, one blank line between, as ruff's isort rule
    # (I001) wants
    first = cells[0].splitlines()
    imports = [
        node
        for node in ast.parse(cells[0]).body
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    after = imports[-1].end_lineno if imports else len(first)
    head = "\n".join(first[:after]).rstrip()
    tail = "\n".join(first[after:]).strip("\n")
    merged = head + "\n\n" + generated + ("\n\n\n" + tail if tail else "")
    return [merged, *cells[1:]]


def export_cells(chapter: Path) -> list[str]:
    """The source of every cell exported to the chapter's own module, in order."""
    return export_cells_by_module(chapter).get(module_name(chapter), [])


def self_imports(chapter: Path) -> list[str]:
    """Lines of the chapter's code (exported or not) that import a module it generates."""
    import jupytext

    generated = set(export_cells_by_module(chapter))
    pattern = re.compile(r"^\s*(?:from\s+lib\.(\w+)\s+import|import\s+lib\.(\w+))")
    found = []
    for cell in jupytext.read(chapter).cells:
        if cell.cell_type != "code":
            continue
        for line in cell.source.splitlines():
            match = pattern.match(line)
            if match and (match.group(1) or match.group(2)) in generated:
                found.append(line.strip())
    return found


# The chapters are formatted at 76 columns for the book's page (tasks.py); lib reads at
# 88, so the trailing commas that the narrower layout added do not keep calls split there.
LIB_LAYOUT = ("--config", "format.skip-magic-trailing-comma = true")
# Chapter code: narrower than lib's 88 columns, for the book's centre column.
CHAPTER_WIDTH = ("--line-length", "76")


def ruff_format(source: str, filename: str, *options: str) -> str:
    """Format Python source with the project's ruff settings (and ``options``)."""
    command = [sys.executable, "-m", "ruff", "format", *options]
    done = subprocess.run(
        [*command, "--stdin-filename", filename, "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        if "No module named ruff" in done.stderr:
            raise RuntimeError(
                "tangling needs ruff: pip install -e '.[test]'"
            ) from None
        raise RuntimeError(
            f"ruff could not format the code of {filename}:\n{done.stderr}"
        )
    return done.stdout


def render_all(chapter: Path) -> dict[str, str]:
    """``{module name: the text lib/<module>.py should contain}`` for this chapter."""
    modules = export_cells_by_module(chapter)
    if not modules:
        raise ValueError(f"{chapter.name} has no cell tagged {EXPORT_TAG!r}")
    source = f"chapters/{chapter.name}"
    return {
        name: HEADER.format(source=source)
        + ruff_format(
            "\n\n\n".join(with_derived_all(cells, chapter)) + "\n",
            f"lib/{name}.py",
            *LIB_LAYOUT,
        )
        for name, cells in modules.items()
    }


def render(chapter: Path) -> str:
    """The text that the chapter's own module ``lib/<module>.py`` should contain."""
    return render_all(chapter)[module_name(chapter)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="report drift, write nothing"
    )
    parser.add_argument("chapters", nargs="*", type=Path, help="only these chapters")
    args = parser.parse_args(argv)
    chapters = [p.resolve() for p in args.chapters] or chapter_files()
    stale = []
    for chapter in chapters:
        for name, text in render_all(chapter).items():
            target = LIB / f"{name}.py"
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
