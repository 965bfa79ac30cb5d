"""The run profile of a book build: one execution cache per profile, one line per chapter.

The chapters are executed at build time in the profile ``TFS_PROFILE`` names (by default
the one :func:`lib.utils.get_profile` picks for this machine). Three things follow:

* an unknown profile stops the build before anything runs, with the message of
  :func:`lib.utils.get_profile`;
* each profile has its own jupyter-cache (``_build/.jupyter_cache-<profile>``), and the
  profile is a Sphinx configuration value that invalidates the environment, so a build in
  another profile re-executes every chapter instead of rendering the last profile's
  outputs;
* each chapter prints one line when it has been read (executed or taken from the cache),
  with its time, so a build that runs for minutes says what it is doing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_started: dict[str, float] = {}


def _profile() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from lib.utils import get_profile

    return get_profile()


def _config_inited(app, config) -> None:
    try:
        profile = _profile()
    except ValueError as error:
        from sphinx.errors import ConfigError

        raise ConfigError(str(error)) from None
    os.environ["TFS_PROFILE"] = (
        profile  # the kernels that execute the chapters inherit it
    )
    config.tfs_profile = profile
    cache = ROOT / "_build" / f".jupyter_cache-{profile}"
    config.nb_execution_cache_path = str(cache)


def _source_read(app, docname: str, source: list[str]) -> None:
    if docname.startswith("chapters/"):
        _started[docname] = time.monotonic()


def _doctree_read(app, doctree) -> None:
    docname = app.env.docname
    if docname in _started:
        seconds = time.monotonic() - _started.pop(docname)
        profile = app.config.tfs_profile
        print(f"[book] {docname} ({profile}): {seconds:.1f} s", flush=True)


def setup(app):
    app.add_config_value("tfs_profile", "smoke", "env")
    app.connect("config-inited", _config_inited)
    app.connect("source-read", _source_read)
    app.connect("doctree-read", _doctree_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
