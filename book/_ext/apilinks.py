"""Link each entry of the API reference to the section of the chapter that writes it.

A public function or class of ``lib`` is defined in an export cell of a chapter; the section
that cell sits in is where the reader finds the reasoning. This extension reads every
chapter (its headings, and the ``def``/``class`` lines of its export cells), and appends to
each such docstring in ``book/api.md`` a line "Written in: Chapter N, <section>", a ``:ref:``
to the section's label. The labels come from ``sphinx.ext.autosectionlabel`` (prefixed by
the document, ``chapters/08-3-runs:Warm-up, measured: a post-LN model``), so the nitpicky
strict build fails if a section a link points at is renamed without the link following.

Loaded from ``_config.yml`` (``sphinx: local_extensions``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

DEFINITION = re.compile(r"^(?:def|class)\s+([A-Za-z]\w*)", re.MULTILINE)
HEADING = re.compile(r"^(#{1,4})\s+(.+?)\s*$", re.MULTILINE)


def plain(markdown: str) -> str:
    """A heading's text without its Markdown markup characters, for the link's text."""
    return re.sub(r"[`*$]", "", markdown).strip()


def sections_of_definitions(chapter: Path) -> dict[str, tuple[str, str, str]]:
    """``lib.module.Name`` -> (docname, chapter title, section title) for one chapter."""
    import jupytext

    from tools.tangle import cell_target, module_name

    notebook = jupytext.read(chapter)
    docname = f"chapters/{chapter.stem}"
    chapter_title, section = "", ""
    found: dict[str, tuple[str, str, str]] = {}
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            for hashes, text in HEADING.findall(cell.source):
                if len(hashes) == 1:
                    chapter_title = section = text.strip()
                else:
                    section = text.strip()
            continue
        if cell.cell_type != "code":
            continue
        target = cell_target(list(cell.metadata.get("tags", [])), module_name(chapter))
        if target is None:
            continue
        for name in DEFINITION.findall(cell.source):
            if not name.startswith("_"):
                found.setdefault(
                    f"lib.{target}.{name}", (docname, chapter_title, section)
                )
    return found


def build_map(app) -> None:
    root = Path(app.srcdir)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    sections: dict[str, tuple[str, str, str]] = {}
    for chapter in sorted((root / "chapters").glob("[0-9][0-9]-*.md")):
        sections.update(sections_of_definitions(chapter))
    app.env.tfs_api_sections = sections


def add_section_link(app, what, name, obj, options, lines) -> None:
    sections = getattr(app.env, "tfs_api_sections", {})
    if name not in sections:
        return
    docname, chapter_title, section = sections[name]
    number = chapter_title.split(".", 1)[0]
    where = f"Chapter {number}"
    if section != chapter_title:
        where += f", {plain(section)}"
    # The label is the heading's Markdown as written (what autosectionlabel records
    # through MyST); :ref: matches it case-insensitively.
    if "`" in section:  # a role cannot hold a backtick: link the chapter instead
        lines.extend(["", f"*Written in:* :doc:`{where} </{docname}>`."])
    else:
        lines.extend(["", f"*Written in:* :ref:`{where} <{docname}:{section}>`."])


def setup(app):
    app.setup_extension("sphinx.ext.autosectionlabel")
    app.connect("builder-inited", build_map)
    app.connect("autodoc-process-docstring", add_section_link)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
