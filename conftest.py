"""pytest configuration shared by the unit tests and the notebook tests.

Every chapter source ``chapters/NN-name.md`` (Jupytext, MyST Markdown) is converted to
``_build/notebooks/NN-name.ipynb`` at collection time and executed by nbmake, so a plain
``pytest`` runs the unit tests and every chapter, top to bottom, hidden solutions included.
No ``.ipynb`` is ever edited by hand or committed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent
NOTEBOOK_DIR = ROOT / "_build" / "notebooks"
CHAPTER_NAME = re.compile(r"^\d\d-[a-z0-9-]+\.md$")

# Tests run the small CPU profile unless the caller asked for another one explicitly.
os.environ.setdefault("TFS_PROFILE", "smoke")
os.environ.setdefault("MPLBACKEND", "Agg")


def _to_ipynb(chapter: Path) -> Path:
    import jupytext

    NOTEBOOK_DIR.mkdir(parents=True, exist_ok=True)
    target = NOTEBOOK_DIR / (chapter.stem + ".ipynb")
    notebook = jupytext.read(chapter)
    # Written under a temporary name and moved, so parallel workers never see half a file.
    partial = target.with_name(f"{target.stem}.{os.getpid()}.part")
    partial.write_text(jupytext.writes(notebook, fmt="ipynb"), encoding="utf-8")
    os.replace(partial, target)
    return target


def pytest_collect_file(file_path: Path, parent):
    if file_path.parent != ROOT / "chapters" or not CHAPTER_NAME.match(file_path.name):
        return None
    from nbmake.pytest_items import NotebookFile, NotebookItem

    class ChapterNotebook(NotebookFile):
        """A chapter source collected under its own name (``pytest chapters/04-attention.md``
        works), executed by nbmake from its converted ``.ipynb``."""

        def collect(self):
            yield NotebookItem.from_parent(self, filename=str(_to_ipynb(self.path)))

    return ChapterNotebook.from_parent(parent, path=file_path)
