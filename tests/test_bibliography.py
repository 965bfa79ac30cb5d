"""Every entry of the book's bibliography can be followed to its source: a DOI or a URL.

The .bib file is read with a small parser of its own (entries, braced or quoted fields), so
the test needs nothing beyond the standard library.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BIB = Path(__file__).resolve().parent.parent / "book" / "references.bib"


def parse_bib(text: str) -> dict[str, dict[str, str]]:
    """Map each entry's key to its fields (names lower-cased, values without outer braces)."""
    entries: dict[str, dict[str, str]] = {}
    for start in re.finditer(r"@(\w+)\s*\{\s*([^,\s]+)\s*,", text):
        if start.group(1).lower() in {"comment", "string", "preamble"}:
            continue
        key = start.group(2)
        if key in entries:
            raise ValueError(f"{BIB.name}: the key {key!r} is defined twice")
        fields: dict[str, str] = {}
        pos = start.end()
        while True:
            field = re.compile(r"\s*(\w+)\s*=\s*").match(text, pos)
            if field is None:
                break
            pos = field.end()
            if text[pos] == "{":  # a braced value: find its matching brace
                depth, end = 0, pos
                while True:
                    depth += {"{": 1, "}": -1}.get(text[end], 0)
                    end += 1
                    if depth == 0:
                        break
                value = text[pos + 1 : end - 1]
            elif text[pos] == '"':
                end = text.index('"', pos + 1) + 1
                value = text[pos + 1 : end - 1]
            else:  # a bare number or macro
                end = re.compile(r"[^,}\s]+").match(text, pos).end()
                value = text[pos:end]
            fields[field.group(1).lower()] = value.strip()
            pos = end
            comma = re.compile(r"\s*,").match(text, pos)
            if comma is None:
                break
            pos = comma.end()
        entries[key] = fields
    return entries


ENTRIES = parse_bib(BIB.read_text(encoding="utf-8"))


def test_the_bibliography_is_read() -> None:
    assert len(ENTRIES) >= 50, f"only {len(ENTRIES)} entries parsed from {BIB}"
    assert all("title" in fields for fields in ENTRIES.values())


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_entry_has_doi_or_url(key: str) -> None:
    fields = ENTRIES[key]
    assert fields.get("doi") or fields.get("url"), (
        f"{BIB.name}: entry {key!r} ({fields.get('title', '?')}) has neither a doi nor a url field"
    )


@pytest.mark.parametrize("key", sorted(ENTRIES))
def test_doi_and_url_are_well_formed(key: str) -> None:
    fields = ENTRIES[key]
    if "doi" in fields:
        assert re.fullmatch(r"10\.\d{4,9}/\S+", fields["doi"]), (
            f"{key}: doi {fields['doi']!r} should be a bare DOI such as 10.1109/5.726791"
        )
    if "url" in fields:
        assert re.fullmatch(r"https?://\S+", fields["url"]), (
            f"{key}: url {fields['url']!r} should start with http:// or https://"
        )
