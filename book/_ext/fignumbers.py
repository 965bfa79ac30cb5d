"""Figures numbered per chapter: "Figure 7.3" is the third figure of chapter 7.

Sphinx numbers figures by section number, and the book's table of contents has no
numbered sections (each chapter writes its own number in its title), so Sphinx alone
counts figures through the whole book: chapter 8's first figure would be "Figure 12".
This extension runs after Sphinx has counted (the ``env-get-updated`` event, at a later
priority than Sphinx's own collector) and renumbers each chapter's figures, tables and
code listings from 1, prefixed by the chapter number taken from its file name
(``chapters/07-1-families`` is chapter 7; the pages of a chapter number through). ``{numref}`` references and captions both read
these numbers. Pages that are not chapters keep Sphinx's numbers.
"""

from __future__ import annotations

import re

CHAPTER = re.compile(r"^chapters/(\d\d)-")


def renumber(numbers: dict[str, dict[str, dict[str, tuple[int, ...]]]]) -> list[str]:
    """Rewrite ``env.toc_fignumbers`` in place; return the pages it changed. A chapter
    of several pages (``chapters/07-1-families``, ``chapters/07-2-reference``, ...)
    numbers through its pages, in the order of their names."""
    changed = []
    counted: dict[tuple[int, str], int] = {}  # (chapter, type) -> numbers given so far
    for docname in sorted(numbers):
        match = CHAPTER.match(docname)
        if not match:
            continue
        chapter, by_type = int(match.group(1)), numbers[docname]
        before = {t: dict(ids) for t, ids in by_type.items()}
        for figtype, ids in by_type.items():
            in_order = sorted(ids, key=ids.__getitem__)  # Sphinx counted in page order
            first = counted.get((chapter, figtype), 0)
            ids.update({fig: (chapter, first + k) for k, fig in enumerate(in_order, 1)})
            counted[(chapter, figtype)] = first + len(in_order)
        if by_type != before:
            changed.append(docname)
    return changed


def _on_env_updated(app, env) -> list[str]:
    return renumber(env.toc_fignumbers)


def setup(app):
    app.connect("env-get-updated", _on_env_updated, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
