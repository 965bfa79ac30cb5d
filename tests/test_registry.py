"""Everything that lists the chapters agrees with the one registry, tools/chapters.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from tools.chapters import CHAPTERS, HAND_WRITTEN, chapter_of_page, modules, pages
from tools.tangle import chapter_files, export_cells_by_module

ROOT = Path(__file__).resolve().parent.parent


def _read(relpath: str) -> str:
    return (ROOT / relpath).read_text(encoding="utf-8")


def test_every_chapter_source_is_a_registered_page():
    assert [p.stem for p in chapter_files()] == pages()
    assert len({c.number for c in CHAPTERS}) == len(CHAPTERS)
    assert [c.number for c in CHAPTERS] == list(range(1, len(CHAPTERS) + 1))


def test_each_page_writes_the_modules_its_chapter_registers():
    written: dict[int, list[str]] = {}
    for source in chapter_files():
        chapter = chapter_of_page(source.stem)
        for module in export_cells_by_module(source):
            if module not in written.setdefault(chapter.number, []):
                written[chapter.number].append(module)
    for chapter in CHAPTERS:
        assert sorted(written[chapter.number]) == sorted(chapter.modules), chapter.title


def test_the_table_of_contents_follows_the_registry():
    toc = yaml.safe_load(_read("_toc.yml"))
    listed: list[tuple[str, list[str]]] = []
    for part in toc["parts"]:
        for entry in part["chapters"]:
            if entry["file"].startswith("chapters/"):
                sections = [s["file"] for s in entry.get("sections", [])]
                listed.append((part["caption"], [entry["file"], *sections]))
    wanted = [(c.part, [f"chapters/{p}" for p in c.pages]) for c in CHAPTERS]
    assert listed == wanted


def test_the_api_reference_has_each_module_under_its_chapter():
    text = _read("book/api.md")
    found = re.findall(
        r"## `lib\.(\w+)`\s+Built in \{doc\}`\.\./chapters/([\w-]+)`", text
    )
    assert [module for module, _ in found] == modules()
    for module, page in found:
        assert module in chapter_of_page(page).modules, (module, page)


def test_lib_init_lists_the_modules_in_chapter_order():
    source = _read("lib/__init__.py")
    tree = ast.parse(source)
    submodules = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and node.targets[0].id == "_SUBMODULES"
    )
    assert list(submodules) == [*modules(), *HAND_WRITTEN]
    bullets = ast.get_docstring(tree).split("\n* ")
    for chapter in CHAPTERS:
        said = [b for b in bullets if f"(chapter {chapter.number})" in b]
        assert said, (
            f"lib/__init__'s docstring says nothing of chapter {chapter.number}"
        )
        text = " ".join(said)
        for module in chapter.modules:
            assert f":mod:`lib.{module}`" in text, (chapter.number, module)


def test_the_readme_tables_follow_the_registry():
    readme = _read("README.md")
    rows = re.findall(r"^\| (\d+) \| .+? \| (`lib\.[^|]+) \| .+ \|$", readme, re.M)
    assert [int(n) for n, _ in rows] == [c.number for c in CHAPTERS]
    for (_, listed), chapter in zip(rows, CHAPTERS):
        assert re.findall(r"`lib\.(\w+)`", listed) == list(chapter.modules)
    colab = re.findall(
        r"^\| (\d+)\.(\d*) ([^|]+?) \| .*?notebooks/([\w-]+)\.ipynb", readme, re.M
    )
    assert [page for *_, page in colab] == pages()
    for number, page_number, title, page in colab:
        chapter = chapter_of_page(page)
        assert int(number) == chapter.number, page
        k = chapter.pages.index(page) + 1
        if k == 1:  # a chapter's first page carries its title
            assert (page_number, title) == ("", chapter.title), page
        else:  # its other pages are numbered N.k
            assert page_number == str(k), page


def test_contributing_names_the_modules_of_each_chapter_that_writes_several():
    layout = _read("CONTRIBUTING.md")
    for chapter in CHAPTERS:
        if len(chapter.modules) > 1:
            sentence = re.search(rf"Chapter {chapter.number} writes ([^;.|]+)", layout)
            assert sentence, (
                f"CONTRIBUTING's layout does not say what chapter {chapter.number} writes"
            )
            assert re.findall(r"`(\w+)`", sentence.group(1)) == list(chapter.modules)


def _lib_imports(module: str) -> list[tuple[str, list[str]]]:
    """``(lib module, names)`` for each ``from lib.x import ...`` (and ``import lib.x``)
    at any level of ``lib/<module>.py``."""
    tree = ast.parse(_read(f"lib/{module}.py"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lib."):
            found.append((node.module.split(".")[1], [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [
                (a.name.split(".")[1], [])
                for a in node.names
                if a.name.startswith("lib.")
            ]
    return found


def test_layers_point_down():
    """A module imports only what its own or an earlier chapter built (and the
    hand-written plumbing), and no private name of another module: chapter 7's
    lib.pretrained does not reach into chapter 10, lib.runs uses public names."""
    chapter_of_module = {m: c.number for c in CHAPTERS for m in c.modules}
    for module, number in chapter_of_module.items():
        for imported, names in _lib_imports(module):
            if imported in chapter_of_module:
                assert chapter_of_module[imported] <= number, (module, imported)
            private = [n for n in names if n.startswith("_")]
            assert imported == "_checks" or not private, (module, imported, private)


def test_a_chapter_on_pages_has_pages_a_reader_can_take_in_one_sitting():
    """Issue 30: chapters 7 and 8 are on pages of at most 2,500 lines each."""
    for chapter in CHAPTERS:
        if len(chapter.pages) == 1:
            continue
        for page in chapter.pages:
            lines = len(_read(f"chapters/{page}.md").splitlines())
            assert lines <= 2500, f"chapters/{page}.md has {lines} lines"


def test_the_slowest_pages_are_pages_and_start_first(pytestconfig):
    from tools.chapters import SLOWEST_PAGES

    assert set(SLOWEST_PAGES) <= set(pages())
    import conftest

    class Item:  # what the ordering reads of a collected test
        def __init__(self, path: Path) -> None:
            self.path, self.nodeid = path, str(path)

    items = [Item(ROOT / "tests" / "test_registry.py")]
    items += [Item(ROOT / "chapters" / f"{page}.md") for page in pages()]
    conftest.pytest_collection_modifyitems(None, pytestconfig, items)
    order = [Path(item.path).stem for item in items]
    assert order[: len(SLOWEST_PAGES)] == list(SLOWEST_PAGES)
    assert order[-1] == "test_registry"  # the unit tests after every chapter


def test_the_names_a_user_reaches_for_import_from_lib_itself():
    """``from lib import GPT, load_model, generate, train``: each the object its module
    defines, imported on first use; an unknown name says what lib has."""
    import importlib

    import lib

    for name, module in lib._NAMES.items():
        assert getattr(lib, name) is getattr(
            importlib.import_module(f"lib.{module}"), name
        )
    # the four names, and others a user reaches for (issue 40)
    from lib import (  # noqa: F401
        GPT,
        CharTokenizer,
        LoadedModel,
        TransformerConfig,
        generate,
        load_checkpoint,
        load_model,
        load_pretrained,
        load_shipped,
        save_checkpoint,
        save_model,
        train,
    )
    from lib.model_file import LoadedModel as the_type

    # the model file has its own module, and its one loaded-model type
    assert LoadedModel is the_type and load_model.__module__ == "lib.model_file"
    assert save_checkpoint.__module__ == load_checkpoint.__module__ == "lib.training"
    assert {"GPT", "train", "tokenizer", "model_file"} <= set(dir(lib))
    with pytest.raises(AttributeError, match="its modules are"):
        lib.no_such_name  # noqa: B018
