"""Every entry of the book's bibliography can be followed to its source: a DOI or a URL.

The .bib file is read with a small parser of its own (entries, braced or quoted fields), so
the test needs nothing beyond the standard library.
"""

from __future__ import annotations

import re

import pytest

from tools.bib import BIB, parse_bib

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
