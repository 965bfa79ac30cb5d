"""Hand the test run's executed chapters to the book build, so CI executes each chapter once.

``python3 tasks.py test`` executes every chapter with nbmake (smoke profile) and, with
nbmake's ``--overwrite``, leaves each executed notebook in ``_build/notebooks/``.
``python3 tasks.py book`` renders with myst-nb in ``cache`` mode, which executes a chapter
only when its jupyter-cache (``_build/.jupyter_cache-smoke``) holds no notebook with the
same code. This module fills that cache from the executed notebooks:

* the chapter is read as myst-nb reads it (same reader, same MyST settings), so the
  cache's hash of its code cells is the one the build computes;
* the executed notebook's outputs are taken only when its code cells are the chapter's
  code cells, cell for cell, when every code cell ran (numbered 1, 2, 3, ...), when no
  output is an error, and when it was executed after the last change to ``lib/`` and to
  the chapter; otherwise the chapter is left to the build, which executes it (and still
  fails on any cell error).

Run from the book's environment (it imports myst-nb and jupyter-cache).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.tangle import NOTEBOOK_DIR, chapter_files  # noqa: E402

# The MyST extensions of _config.yml's parse section: the reader must tokenise the
# chapter as the build does.
MYST_EXTENSIONS = ("amsmath", "dollarmath", "colon_fence", "deflist", "substitution")


def cache_dir(profile: str) -> Path:
    """The book's execution cache of a profile (book/_ext/run_profile.py names it)."""
    return ROOT / "_build" / f".jupyter_cache-{profile}"


def executed_dir(profile: str) -> Path:
    """Where the tests leave the chapters they executed in a profile (conftest.py)."""
    return (
        NOTEBOOK_DIR
        if profile == "smoke"
        else NOTEBOOK_DIR.with_name(f"notebooks-{profile}")
    )


def newest_change(chapter: Path) -> float:
    """The last modification of the chapter or of any module of ``lib``."""
    sources = [chapter, *(ROOT / "lib").rglob("*.py")]
    return max(path.stat().st_mtime for path in sources)


def why_not_usable(chapter: Path, executed_nb, source_nb, executed: Path) -> str | None:
    """Why the executed notebook cannot stand for the chapter, or None when it can."""
    if executed.stat().st_mtime < newest_change(chapter):
        return "executed before the last change to the chapter or lib/"
    ran = [c for c in executed_nb.cells if c.cell_type == "code"]
    wanted = [c for c in source_nb.cells if c.cell_type == "code"]
    if len(ran) != len(wanted):
        return f"{len(ran)} code cells executed, the chapter has {len(wanted)}"
    for number, (done, cell) in enumerate(zip(ran, wanted), start=1):
        if done.source.strip() != cell.source.strip():
            return f"code cell {number} differs from the chapter's"
        if done.get("execution_count") != number:
            return f"code cell {number} did not run"
        if any(out.get("output_type") == "error" for out in done.get("outputs", [])):
            return f"code cell {number} raised an error"
    # a kernel run with a non-inline MPLBACKEND (Agg) shows no figure: the build's does
    shows = chapter.read_text(encoding="utf-8").count("plt.show()")
    images = sum(
        1
        for cell in ran
        for out in cell.get("outputs", [])
        if any(kind.startswith("image/") for kind in out.get("data", {}))
    )
    if images < shows:
        return f"{shows} plt.show() but {images} figures (MPLBACKEND not inline?)"
    return None


def prime(profile: str = "smoke") -> dict[str, str]:
    """Cache each chapter's executed notebook for the book; ``{chapter: what happened}``."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from myst_nb.core.read import read_myst_markdown_notebook
    from myst_parser.config.main import MdParserConfig

    config = MdParserConfig(enable_extensions=set(MYST_EXTENSIONS))
    cache = get_cache(str(cache_dir(profile)))
    report = {}
    for chapter in chapter_files():
        executed = executed_dir(profile) / f"{chapter.stem}.ipynb"
        if not executed.exists():
            report[chapter.name] = "not executed by the tests: the build executes it"
            continue
        source_nb = read_myst_markdown_notebook(
            chapter.read_text(encoding="utf-8"),
            config=config,
            add_source_map=True,
            path=chapter,
        )
        executed_nb = nbformat.read(executed, as_version=4)
        reason = why_not_usable(chapter, executed_nb, source_nb, executed)
        if reason is not None:
            report[chapter.name] = f"{reason}: the build executes it"
            continue
        ran = [c for c in executed_nb.cells if c.cell_type == "code"]
        wanted = [c for c in source_nb.cells if c.cell_type == "code"]
        for done, cell in zip(ran, wanted):
            cell.outputs = done.outputs
            cell.execution_count = done.execution_count
        cache.cache_notebook_bundle(
            CacheBundleIn(source_nb, str(chapter), data={"from": "tasks.py test"}),
            check_validity=False,
            overwrite=True,
        )
        report[chapter.name] = "outputs of the test run"
    return report


if __name__ == "__main__":
    for name, what in prime(sys.argv[1] if len(sys.argv) > 1 else "smoke").items():
        print(f"[book] {name}: {what}")
