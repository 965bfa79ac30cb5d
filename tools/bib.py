"""The book's bibliography, read with a small parser of its own (entries, braced or quoted
fields), so that tests and tools need nothing beyond the standard library."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from string import ascii_lowercase

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


def label(names: list[str], year: str) -> str:
    """The one author-year label of the book, from surnames (``"others"`` for *et al.*):
    ``Gage, 1994``; ``Press and Wolf, 2017``; ``Vaswani et al., 2017``. The bibliography's
    style (book/_ext/bibstyle.py) and the Colab notebooks' citations both use it."""
    real = [n for n in names if n.lower() != "others"] or ["Anonymous"]
    if len(names) == 1:
        return f"{real[0]}, {year}"
    if len(names) == 2 and len(real) == 2:
        return f"{real[0]} and {real[1]}, {year}"
    return f"{real[0]} et al., {year}"


def suffixed(labels: list[str]) -> list[str]:
    """Labels in the bibliography's order, with ``a``, ``b``, ... added to those that
    occur more than once (``Chen et al., 2023a``), as the book prints them."""
    counts = Counter(labels)
    seen: Counter[str] = Counter()
    out = []
    for base in labels:
        if counts[base] == 1:
            out.append(base)
        else:
            out.append(base + ascii_lowercase[seen[base]])
            seen[base] += 1
    return out


def author_year(entry: dict[str, str]) -> str:
    """An entry's label without the a/b suffix (:func:`labels` adds it)."""
    return label(surnames(entry), entry.get("year", "n.d."))


def labels(entries: dict[str, dict[str, str]]) -> dict[str, str]:
    """Every entry's label as the book prints it, suffixes included: the entries in the
    bibliography's order (surnames, year, title), then :func:`suffixed`."""

    def order(key: str):
        entry = entries[key]
        names = [re.sub(r"\W", "", n.lower()) for n in surnames(entry)]
        title = _plain(entry.get("title", "")).lower()
        return (names, entry.get("year", "n.d."), title)

    keys = sorted(entries, key=order)
    return dict(zip(keys, suffixed([author_year(entries[k]) for k in keys])))


def link(entry: dict[str, str]) -> str | None:
    """Where the work can be read: its DOI or its URL."""
    if entry.get("doi"):
        return "https://doi.org/" + entry["doi"]
    return entry.get("url")
