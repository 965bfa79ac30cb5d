"""tools/book_cache.py: the book takes a chapter's outputs from the test run only when
that run executed exactly the chapter's code, every cell of it, without an error, and
after the last change to the chapter and to lib/."""

from __future__ import annotations

import os
import time
from pathlib import Path

import nbformat
import pytest

from tools import book_cache


def notebook(*cells: tuple[str, int | None, bool]) -> nbformat.NotebookNode:
    """A notebook of code cells ``(source, execution_count, raised)``."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("# prose is not compared"))
    for source, count, raised in cells:
        cell = nbformat.v4.new_code_cell(source, execution_count=count)
        if raised:
            cell.outputs = [
                nbformat.v4.new_output("error", ename="E", evalue="", traceback=[])
            ]
        nb.cells.append(cell)
    return nb


@pytest.fixture
def files(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    """A chapter and its executed notebook, the notebook written after the chapter and
    after every module of lib/ (the newest change is the chapter's)."""
    chapter = tmp_path / "05-ffn.md"
    chapter.write_text("chapter")
    executed = tmp_path / "05-ffn.ipynb"
    executed.write_text("{}")
    now = time.time()
    os.utime(chapter, (now - 10, now - 10))
    os.utime(executed, (now, now))
    monkeypatch.setattr(book_cache, "newest_change", lambda c: c.stat().st_mtime)
    return chapter, executed


SOURCE = notebook(("x = 1", None, False), ("print(x)", None, False))


def test_an_exact_clean_run_is_used(files):
    chapter, executed = files
    ran = notebook(("x = 1", 1, False), ("print(x)\n", 2, False))
    assert book_cache.why_not_usable(chapter, ran, SOURCE, executed) is None


@pytest.mark.parametrize(
    ("ran", "reason"),
    [
        (notebook(("x = 1", 1, False)), "1 code cells executed, the chapter has 2"),
        (
            notebook(("x = 2", 1, False), ("print(x)", 2, False)),
            "code cell 1 differs",
        ),
        (notebook(("x = 1", 1, False), ("print(x)", None, False)), "cell 2 did not"),
        (notebook(("x = 1", 1, False), ("print(x)", 2, True)), "cell 2 raised"),
    ],
    ids=["fewer cells", "other code", "not run", "error"],
)
def test_an_unusable_run_is_left_to_the_build(files, ran, reason):
    chapter, executed = files
    assert reason in book_cache.why_not_usable(chapter, ran, SOURCE, executed)


def test_a_run_older_than_the_chapter_is_left_to_the_build(files):
    chapter, executed = files
    later = time.time() + 10
    os.utime(chapter, (later, later))
    ran = notebook(("x = 1", 1, False), ("print(x)", 2, False))
    assert "before the last change" in book_cache.why_not_usable(
        chapter, ran, SOURCE, executed
    )


def test_a_change_to_lib_counts_as_a_change(tmp_path):
    chapter = tmp_path / "chapter.md"
    chapter.write_text("old")
    os.utime(chapter, (0, 0))
    newest_lib = max(p.stat().st_mtime for p in (book_cache.ROOT / "lib").rglob("*.py"))
    assert book_cache.newest_change(chapter) == newest_lib


def test_the_executed_notebooks_of_each_profile():
    assert book_cache.executed_dir("smoke").name == "notebooks"
    assert book_cache.executed_dir("colab").name == "notebooks-colab"


def test_lint_converts_the_chapters_elsewhere(monkeypatch):
    """`tasks.py lint` runs between the tests and the book in CI: its copies of the
    chapters must not replace the executed notebooks that the book renders."""
    import tasks
    from tools import tangle

    folders = []
    monkeypatch.setattr(
        tangle, "write_notebook", lambda chapter, folder=None: folders.append(folder)
    )
    tasks.notebooks()
    assert folders and all(
        f is not None and f != tangle.NOTEBOOK_DIR for f in folders
    ), folders


def test_a_run_without_its_figures_is_left_to_the_build(files):
    """A kernel run with MPLBACKEND=Agg executes plt.show() and shows nothing."""
    chapter, executed = files
    chapter.write_text("plt.show()")
    os.utime(chapter, (time.time() - 10, time.time() - 10))
    ran = notebook(("x = 1", 1, False), ("print(x)", 2, False))
    assert "1 plt.show() but 0 figures" in book_cache.why_not_usable(
        chapter, ran, SOURCE, executed
    )
    ran.cells[-1].outputs = [
        nbformat.v4.new_output("display_data", data={"image/png": "iVBOR"})
    ]
    assert book_cache.why_not_usable(chapter, ran, SOURCE, executed) is None
