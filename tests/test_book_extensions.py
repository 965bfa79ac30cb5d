"""The book's local Sphinx extensions (book/_ext), on what they compute without Sphinx."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import apilinks  # noqa: E402  (book/_ext/apilinks.py)


def test_api_entries_point_at_the_section_that_defines_them():
    sections = apilinks.sections_of_definitions(ROOT / "chapters" / "04-attention.md")
    docname, chapter, section = sections["lib.attention.MultiHeadAttention"]
    assert docname == "chapters/04-attention" and chapter.startswith("4. ")
    assert section != chapter  # a section of the chapter, not only the chapter
    text = (ROOT / "chapters" / "04-attention.md").read_text(encoding="utf-8")
    heading = text.index(f"## {section}\n")
    assert heading < text.index("class MultiHeadAttention(")
    assert not any(name.split(".")[-1].startswith("_") for name in sections)


def test_a_chapter_exporting_to_several_modules_is_split_by_module():
    sections = apilinks.sections_of_definitions(ROOT / "chapters" / "08-1-training.md")
    modules = {name.split(".")[1] for name in sections}
    assert {"training", "batches"} == modules
    assert "lib.training.train" in sections and "lib.batches.lm_batches" in sections


def test_link_text_drops_markdown_markup():
    assert apilinks.plain("Why divide by $\\sqrt{d_k}$") == "Why divide by \\sqrt{d_k}"
    assert (
        apilinks.plain("Checking against `tokenizers`") == "Checking against tokenizers"
    )


def test_figures_are_numbered_per_chapter_in_page_order():
    import fignumbers  # book/_ext/fignumbers.py

    numbers = {  # what Sphinx assigns without numbered sections: one count for all
        "book/intro": {"figure": {"intro-fig": (1,)}},
        "chapters/07-1-families": {"figure": {"a": (3,), "b": (2,)}},
        # a page of the same chapter: its figures go on from the first page's
        "chapters/07-2-reference": {"figure": {"e": (7,), "f": (6,)}},
        "chapters/08-training": {
            "figure": {"c": (4,), "d": (5,)},
            "table": {"t": (1,)},
        },
    }
    changed = fignumbers.renumber(numbers)
    assert numbers["chapters/07-1-families"]["figure"] == {"b": (7, 1), "a": (7, 2)}
    assert numbers["chapters/07-2-reference"]["figure"] == {"f": (7, 3), "e": (7, 4)}
    assert numbers["chapters/08-training"]["figure"] == {"c": (8, 1), "d": (8, 2)}
    assert numbers["chapters/08-training"]["table"] == {"t": (8, 1)}
    assert numbers["book/intro"]["figure"] == {"intro-fig": (1,)}  # not a chapter
    assert changed == [
        "chapters/07-1-families",
        "chapters/07-2-reference",
        "chapters/08-training",
    ]
    assert fignumbers.renumber(numbers) == []  # a second pass changes nothing
