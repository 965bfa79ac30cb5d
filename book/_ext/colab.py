"""Point each chapter page's Colab button at the chapter's generated notebook.

sphinx-book-theme builds the Colab link from the page's source file,
``chapters/NN-name.md``, which Colab cannot open (it reads only ``.ipynb``). The course
commits a generated notebook per chapter, ``notebooks/NN-name.ipynb``
(``tools/notebooks.py``); this extension rewrites the link to it after the theme has made
its buttons, and warns (an error in the strict build) if a chapter has no such notebook.

Loaded from ``_config.yml`` (``sphinx: local_extensions``). The address is the one the
notebooks' install cell and the README use, :func:`tools.notebooks.colab_url`, from the
``repository`` section of ``_config.yml``.
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath

NOTEBOOK_DIR = "notebooks"


def point_colab_at_notebooks(app, pagename, templatename, context, doctree) -> None:
    if not pagename.startswith("chapters/"):
        return
    from sphinx.util import logging

    root = Path(app.srcdir)
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from tools.notebooks import colab_url

    logger = logging.getLogger(__name__)
    if not app.config.html_theme_options.get("launch_buttons", {}).get("colab_url"):
        return
    notebook = root / NOTEBOOK_DIR / (PurePosixPath(pagename).name + ".ipynb")
    if not notebook.exists():
        logger.warning(
            f"{pagename}: no {NOTEBOOK_DIR}/{notebook.name} for its Colab button; "
            "run `python3 tasks.py notebooks`",
            location=pagename,
        )
        return
    url = colab_url(notebook.name)
    found = False
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if isinstance(group, dict) else []:
            if button.get("text") == "Colab":
                button["url"] = url
                found = True
    if not found:
        logger.warning(f"{pagename}: the theme made no Colab button", location=pagename)


def setup(app):
    # After sphinx-book-theme's add_launch_buttons (priority 501).
    app.connect("html-page-context", point_colab_at_notebooks, priority=510)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
