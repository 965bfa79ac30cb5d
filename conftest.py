"""pytest configuration shared by the unit tests and the notebook tests.

Every chapter source ``chapters/NN-name.md`` (Jupytext, MyST Markdown) is converted to
``_build/notebooks/NN-name.ipynb`` at collection time and executed by nbmake, so a plain
``pytest`` runs the unit tests and every chapter, top to bottom, hidden solutions included.
No ``.ipynb`` is ever edited by hand or committed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.tangle import NOTEBOOK_DIR, is_chapter, write_notebook

# Tests run the small CPU profile unless the caller asked for another one explicitly.
os.environ.setdefault("TFS_PROFILE", "smoke")
# The chapters' kernels draw with the inline backend, as in Jupyter and the book build:
# their executed notebooks keep every figure, and the book renders them
# (tools/book_cache.py). This process itself draws off-screen (pytest_configure).
os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
# Parallel test workers (pytest-xdist) each get one thread for torch and its notebook
# kernels: several workers with several threads each oversubscribe a small machine and
# slow the tiny models of the tests down many times over.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def notebook_dir() -> Path:
    """Where the chapters are converted (and, with nbmake's ``--overwrite``, executed):
    ``_build/notebooks`` for the smoke profile, whose executed notebooks the book renders;
    a folder of their own for another profile or a dry run, which must not replace them."""
    profile = os.environ.get("TFS_PROFILE", "smoke")
    dry = os.environ.get("TFS_DRY", "") not in ("", "0")
    if profile == "smoke" and not dry:
        return NOTEBOOK_DIR
    return NOTEBOOK_DIR.with_name(f"notebooks-{profile}{'-dry' if dry else ''}")


def pytest_configure(config):
    import matplotlib

    matplotlib.use("Agg")  # the unit tests' own figures: off-screen
    # nbmake writes each executed chapter back over its converted copy in
    # notebook_dir(): the book build takes the smoke run's outputs from there
    # (tools/book_cache.py) instead of executing every chapter a second time.
    if hasattr(config.option, "overwrite"):
        config.option.overwrite = True


def pytest_collect_file(file_path: Path, parent):
    if not is_chapter(file_path):
        return None
    from nbmake.pytest_items import NotebookFile, NotebookItem

    class ChapterNotebook(NotebookFile):
        """A chapter source collected under its own name (``pytest chapters/04-attention.md``
        works), executed by nbmake from its converted ``.ipynb``."""

        def collect(self):
            yield NotebookItem.from_parent(
                self, filename=str(write_notebook(self.path, notebook_dir()))
            )

    return ChapterNotebook.from_parent(parent, path=file_path)


def pytest_collection_modifyitems(session, config, items):
    """The chapters first (the registry's slowest pages, then the longest source first),
    then the unit tests in their order.

    A chapter takes up to a minute, a unit test seconds: pytest-xdist hands the tests to
    its workers in this order, so the long ones start while the short ones fill the gaps,
    instead of one worker finishing page 8.3 alone at the end (the same order on every
    worker, as xdist requires)."""
    from tools.chapters import SLOWEST_PAGES

    def chapter_size(item) -> int:
        path = Path(str(item.path))
        return path.stat().st_size if is_chapter(path) else -1

    def slowness(item) -> int:
        stem = Path(str(item.path)).stem
        return (
            SLOWEST_PAGES.index(stem) if stem in SLOWEST_PAGES else len(SLOWEST_PAGES)
        )

    chapters = sorted(
        (item for item in items if chapter_size(item) >= 0),
        key=lambda item: (slowness(item), -chapter_size(item), item.nodeid),
    )
    if chapters:
        others = [item for item in items if chapter_size(item) < 0]
        items[:] = chapters + others


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests: tiny models run as fast on one thread, and
    much faster on a busy shared CPU (``pytestmark = pytest.mark.usefixtures(...)``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
