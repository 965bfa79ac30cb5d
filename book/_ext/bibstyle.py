"""The bibliography's style: author-year labels, the list sorted by author, then year.

sphinxcontrib-bibtex's built-in formatting styles label the list by number (``plain``,
``unsrt``) or by initials (``alpha``), while the text cites by author and year. This style
labels each entry the way the chapters cite it, and the book cites with
``bibtex_reference_style: label``, so a citation in the text reads exactly as its entry's
label in the list: ``[Vaswani et al., 2017]`` in both. Two works with the same authors and
year get ``a``, ``b``, ... in the list's order (``[Chen et al., 2023a]``), in the text as well.

Loaded from ``_config.yml`` (``sphinx: local_extensions``); selected with
``bibtex_default_style: authoryear``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from tools import bib  # noqa: E402 - after the repository root is importable


def _plain(latex: str) -> str:
    """LaTeX name or title as plain text: ``Lebr{\\'o}n`` -> ``Lebrón``, ``{NVIDIA}`` -> ``NVIDIA``."""
    return Text.from_latex(latex).render_as("text").strip()


def _surnames(entry) -> list[str]:
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    return [_plain(" ".join(p.prelast_names + p.last_names)) for p in persons]


def _year(entry) -> str:
    return entry.fields.get("year", "n.d.")


class AuthorYearSorting(BaseSortingStyle):
    """Sort by the authors' surnames, then first names (braces and accents ignored), year, title."""

    def sorting_key(self, entry):
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [
            tuple(
                re.sub(r"\W", "", _plain(" ".join(part)).lower())
                for part in (p.last_names, p.first_names + p.middle_names)
            )
            for p in persons
        ]
        return (names, _year(entry), _plain(entry.fields.get("title", "")).lower())


class AuthorYearLabels(BaseLabelStyle):
    """``Gage, 1994``; ``Press and Wolf, 2017``; ``Vaswani et al., 2017``; ``..., 2023a``."""

    def format_labels(self, sorted_entries):
        # tools/bib.py makes the labels, for this list and the Colab notebooks alike
        yield from bib.suffixed(
            [bib.label(_surnames(e), _year(e)) for e in sorted_entries]
        )


class AuthorYearStyle(PlainStyle):
    default_label_style = "authoryear"
    default_sorting_style = "authoryear"


register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabels)
register_plugin("pybtex.style.sorting", "authoryear", AuthorYearSorting)
register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)


def setup(app):
    return {"parallel_read_safe": True, "parallel_write_safe": True}
