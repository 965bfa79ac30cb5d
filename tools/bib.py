"""The book's bibliography, read with a small parser of its own (entries, braced or quoted
fields), so that tests and tools need nothing beyond the standard library."""

from __future__ import annotations

import re
from pathlib import Path

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


def _plain(latex: str) -> str:
    """A name or title without LaTeX braces and the few accent macros the file uses."""
    accents = {r"{\L}": "Ł", r"\L": "Ł", r"{\o}": "ø", r"\'o": "ó", r"\'e": "é"}
    for macro, char in accents.items():
        latex = latex.replace(macro, char)
    return re.sub(r"[{}\\]", "", latex).strip()


def surnames(entry: dict[str, str]) -> list[str]:
    """The authors' (or editors') surnames: ``Vaswani, Ashish`` or ``Ashish Vaswani``."""
    people = entry.get("author") or entry.get("editor") or "Anonymous"
    names = []
    for person in re.split(r"\s+and\s+", people):
        person = person.strip()
        if person.lower() == "others":
            names.append("others")
            continue
        surname = person.split(",")[0] if "," in person else person.split()[-1]
        names.append(_plain(surname))
    return names


def author_year(entry: dict[str, str]) -> str:
    """The label the book prints: ``Gage, 1994``; ``Press and Wolf, 2017``; ``Vaswani et
    al., 2017`` (book/_ext/bibstyle.py, without its a/b suffixes for equal labels)."""
    names = surnames(entry)
    year = entry.get("year", "n.d.")
    if len(names) == 1:
        return f"{names[0]}, {year}"
    if len(names) == 2 and "others" not in names:
        return f"{names[0]} and {names[1]}, {year}"
    return f"{names[0]} et al., {year}"


def link(entry: dict[str, str]) -> str | None:
    """Where the work can be read: its DOI or its URL."""
    if entry.get("doi"):
        return "https://doi.org/" + entry["doi"]
    return entry.get("url")
