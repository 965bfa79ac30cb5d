"""Generate ``notebooks/NN-name.ipynb``, the chapters as notebooks for Colab.

Colab opens only ``.ipynb`` files, and the chapters are Jupytext Markdown. This script
converts each chapter into a committed notebook that runs anywhere from its first cell:

* a first code cell that installs the course when ``lib`` is missing (Colab, a fresh
  environment): it clones the repository (or uses the checkout that ``TFS_REPO`` names, or
  the clone the notebook sits in), installs ``lib`` from it in editable mode, and installs
  the packages this chapter needs that are missing or outside the version range of the
  ``chapters`` extra. It never pins or reinstalls torch, numpy or any other package that
  is present in a usable version, and it prints every package pip changed, before and
  after. Run twice, it finds everything in place and installs nothing;
* the chapter's cells unchanged, except that each exercise solution becomes a Colab form
  cell: collapsed under a title (``# @title``, ``cellView: form``) and marked hidden for
  Jupyter (``source_hidden``), so the reader opens it on purpose;
* the book's MyST roles turned into plain Markdown, which Colab renders: a citation
  becomes its author-year label linked to the work (``{cite}`` -> ``([Vaswani et al.,
  2017](https://arxiv.org/abs/1706.03762))``), a figure reference its number (``Fig. 2``)
  with the caption printed under the figure, a cross-reference its text;
* notebook metadata that asks Colab for a GPU runtime.

The repository address and branch are one setting, ``repository`` in ``_config.yml``; the
install cell, the book's launch buttons (``book/_ext/colab.py``) and the Colab links in
``README.md`` and ``book/intro.md`` (between ``<!-- colab-links -->`` markers) all come from
it, so changing it and running this script updates everything.

    python tools/notebooks.py           # rewrite notebooks/ and the Colab links
    python tools/notebooks.py --check   # exit 1 if anything differs from its source

``tests/test_colab.py`` runs the check, and runs one generated notebook in a fresh virtual
environment that has only torch, as a new Colab user would.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bib import BIB, labels, link, parse_bib
from tools.tangle import CHAPTER_WIDTH, chapter_files, ruff_format

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CHAPTERS_DIR = ROOT / "chapters"
CONFIG = ROOT / "_config.yml"
PYPROJECT = ROOT / "pyproject.toml"
COLAB = "https://colab.research.google.com"
PACKAGE = "transformers-from-scratch"  # the distribution that provides `lib`
BADGE = f"{COLAB}/assets/colab-badge.svg"
LINK_FILES = [ROOT / "README.md", ROOT / "book" / "intro.md"]
LINKS_START, LINKS_END = "<!-- colab-links -->", "<!-- /colab-links -->"
BADGES_START, BADGES_END = "<!-- badges -->", "<!-- /badges -->"
SOLUTION_TAG = "solution"
SOLUTION_TITLE = "# @title Solution (try the exercise first; Show code opens it)"
# The optional packages a chapter may import, by import name; their requirement strings
# come from the `chapters` extra of pyproject.toml. ipykernel and jupytext are not listed:
# a notebook already runs in a kernel.
OPTIONAL_MODULES = ("tokenizers", "transformers", "triton", "sacrebleu")


def repository() -> tuple[str, str]:
    """``(url, branch)`` from the ``repository`` section of ``_config.yml``."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    section = config.get("repository") or {}
    url = str(section.get("url", "")).rstrip("/")
    match = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+)", url)
    if not match:
        raise SystemExit(
            f"_config.yml: repository.url must be https://github.com/ORG/REPO, got {url!r}"
        )
    return url, str(section.get("branch", "main"))


def colab_url(notebook: str) -> str:
    """The Colab address that opens ``notebooks/<notebook>`` from the repository."""
    url, branch = repository()
    org_repo = url.removeprefix("https://github.com/")
    return f"{COLAB}/github/{org_repo}/blob/{branch}/notebooks/{notebook}"


def project() -> dict:
    """The ``[project]`` table of pyproject.toml."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: tomli, which pytest depends on there
        import tomli as tomllib
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def extra_requirements() -> dict[str, str]:
    """Import name -> requirement string, from the ``chapters`` extra of pyproject.toml."""
    found = {}
    for requirement in project()["optional-dependencies"].get("chapters", []):
        name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        if name in OPTIONAL_MODULES:
            found[name] = requirement
    missing = set(OPTIONAL_MODULES) - set(found)
    if missing:
        raise SystemExit(f"pyproject.toml's `chapters` extra lacks {sorted(missing)}")
    return found


def chapter_needs(source: str) -> dict[str, str]:
    """The optional packages a chapter imports (module -> requirement), in a stable order."""
    requirements = extra_requirements()
    imported = set(
        re.findall(r"^\s*(?:import|from)\s+(\w+)", source, flags=re.MULTILINE)
    )
    return {name: requirements[name] for name in OPTIONAL_MODULES if name in imported}


INSTALL_CELL = """\
# Run this cell first. Where the course library `lib` is missing (Colab, a fresh
# environment) it fetches the course and installs it, with the packages this chapter needs
# that are missing or in a version it cannot use. Everything else already installed,
# Colab's torch and numpy included, is kept. Run again, it installs nothing.
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

# The repository (from _config.yml) and this chapter's extra packages:
REPOSITORY = {url}
BRANCH = {branch}
NEEDS = {needs}
PACKAGE = {package}


def satisfied(requirement):
    \"\"\"True if an installed package meets it, or it is not for this platform.\"\"\"
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a bare environment: let pip decide
        return False
    req = Requirement(requirement)
    if req.marker is not None and not req.marker.evaluate():
        return True
    try:
        version = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return req.specifier.contains(version, prereleases=True)


def installed():
    return {{
        d.metadata["Name"].lower(): d.version
        for d in importlib.metadata.distributions()
        if d.metadata["Name"]
    }}


def pip_install(*args):
    before = installed()
    command = [sys.executable, "-m", "pip", "install", "--quiet", *args]
    if subprocess.run(command).returncode != 0:
        raise RuntimeError(f"pip could not install {{args}}: its message is above")
    after = installed()
    for name in sorted(set(before) | set(after)):  # every package pip changed, named
        if before.get(name) != after.get(name):
            was, now = before.get(name, "absent"), after.get(name, "removed")
            print(f"  {{name}}: {{was}} -> {{now}}")


# TFS_REPO names a checkout to install from (the course's tests use it); a notebook opened
# in the notebooks/ folder of a clone uses that clone; elsewhere the course is cloned here.
here = Path.cwd()
if os.environ.get("TFS_REPO"):
    course = Path(os.environ["TFS_REPO"])
elif (here.parent / "lib").is_dir() and (here.parent / "pyproject.toml").is_file():
    course = here.parent
else:
    course = here / {folder}
missing = [req for req in NEEDS if not satisfied(req)]
for req in missing:  # say what is replaced, not only what is installed
    name = re.split(r"[\\s<>=!~;\\[]", req, maxsplit=1)[0]
    try:
        found = importlib.metadata.version(name)
        print(f"{{name}} {{found}} is installed; this chapter needs {{req}}")
    except importlib.metadata.PackageNotFoundError:
        pass
try:
    importlib.metadata.version(PACKAGE)
    has_lib = True
except importlib.metadata.PackageNotFoundError:
    has_lib = False
if not has_lib:
    if not (course / "lib").is_dir():
        clone = ["git", "clone", "--quiet", "--depth", "1", "--branch", BRANCH]
        subprocess.run([*clone, REPOSITORY, str(course)], check=True)
    print("installing lib from", course, "with", missing or "no extra packages")
    pip_install("--editable", str(course), *missing)
    # The running kernel sees a new editable install only after a restart.
    sys.path.insert(0, str(course))
elif missing:
    print("installing", missing)
    pip_install(*missing)
importlib.invalidate_caches()
import lib

print("ready: lib from", Path(lib.__file__).parent)
"""


def install_cell(chapter_source: str) -> str:
    url, branch = repository()
    source = INSTALL_CELL.format(
        url=json.dumps(url),
        branch=json.dumps(branch),
        needs=json.dumps(list(chapter_needs(chapter_source).values())),
        package=json.dumps(PACKAGE),
        folder=json.dumps(url.rsplit("/", 1)[-1]),
    )
    return ruff_format(source, "install_cell.py", *CHAPTER_WIDTH).rstrip("\n")


def intro_cell(chapter: Path) -> str:
    notebook = chapter.stem + ".ipynb"
    return (
        f"[![Open In Colab]({BADGE})]({colab_url(notebook)})\n\n"
        "*Transformers from Scratch*: this notebook is generated from "
        f"`chapters/{chapter.name}` by `tools/notebooks.py`. Run the first code cell "
        "below before the others (or *Runtime → Run all*): it installs the course "
        "library `lib` where it is missing. On a GPU runtime the chapter chooses its "
        "sizes from the GPU (the *colab* profile on a T4); on a CPU it runs the small "
        "*smoke* profile. Exercise solutions are collapsed: *Show code* opens one."
    )


ROLE = re.compile(r"\{(cite|numref|ref|doc)\}`([^`]+)`")


@functools.cache
def bib_entries() -> dict[str, dict[str, str]]:
    """The bibliography, read once (every Markdown cell of every chapter asks)."""
    return parse_bib(BIB.read_text(encoding="utf-8"))


@functools.cache
def book_labels() -> dict[str, str]:
    """Each entry's label as the book prints it (a/b suffixes included)."""
    return labels(bib_entries())


def plain_markdown(text: str, figures: dict[str, int]) -> str:
    """MyST roles as Markdown that Colab and Jupyter render (see the module docstring)."""
    entries = bib_entries()
    printed = book_labels()

    def replace(match: re.Match[str]) -> str:
        role, target = match.groups()
        if role == "cite":
            cited = []
            for key in (k.strip() for k in target.split(",")):
                if key not in entries:
                    raise SystemExit(f"{{cite}}`{key}`: no such entry in {BIB.name}")
                label, url = printed[key], link(entries[key])
                cited.append(f"[{label}]({url})" if url else label)
            return "(" + "; ".join(cited) + ")"
        if role == "numref":
            if target not in figures:
                raise SystemExit(f"{{numref}}`{target}`: no figure of that name")
            return f"Fig. {figures[target]}"
        titled = re.fullmatch(r"(.*?)\s*<([^>]+)>", target)
        title, goal = (titled.group(1), titled.group(2)) if titled else (target, target)
        page = goal.rsplit("/", 1)[-1]
        source = CHAPTERS_DIR / f"{page}.md"
        if role == "doc" and source.is_file():
            # another page of the course: its own Colab notebook, under its title
            if not titled:
                heading = re.search(
                    r"^# (.+)$", source.read_text(encoding="utf-8"), re.M
                )
                title = heading.group(1) if heading else page
            return f"[{title}]({colab_url(page + '.ipynb')})"
        if role == "ref" and title.startswith("lib."):
            return f"`{title}`"  # a module's name, as code (no italics inside italics)
        return f"*{title}*"

    return ROLE.sub(replace, text)


def figure_of(cell) -> dict | None:
    """A code cell's figure (``mystnb: figure: {name, caption}``), if it has one."""
    figure = cell.metadata.get("mystnb", {}).get("figure")
    return figure if figure and figure.get("name") else None


def chapter_figures(page: Path) -> dict[str, int]:
    """The figures of ``page``'s chapter (every page sharing its ``NN-`` prefix, in
    order), numbered from 1 through the chapter."""
    import jupytext

    pages = [p for p in chapter_files() if p.name[:3] == page.name[:3]]
    named = []
    for each in pages:
        cells = jupytext.reads(each.read_text(encoding="utf-8"), fmt="md:myst").cells
        named += [figure_of(c)["name"] for c in cells if figure_of(c)]
    return {name: number for number, name in enumerate(named, start=1)}


def render(chapter: Path) -> str:
    """The notebook for one chapter, as the exact text written to ``notebooks/``."""
    import jupytext
    import nbformat

    source = chapter.read_text(encoding="utf-8")
    notebook = jupytext.reads(source, fmt="md:myst")
    cells = [
        nbformat.v4.new_markdown_cell(intro_cell(chapter)),
        nbformat.v4.new_code_cell(install_cell(source)),
    ]
    # Figures are numbered through the chapter, its pages in order (Fig. 1, Fig. 2,
    # ...), as the book numbers them (book/_ext/fignumbers.py): the same here.
    figures = chapter_figures(chapter)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = plain_markdown(cell.source, figures)
        if cell.cell_type == "code" and SOLUTION_TAG in cell.metadata.get("tags", []):
            cell.source = f"{SOLUTION_TITLE}\n{cell.source}"
            cell.metadata["cellView"] = "form"
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        cells.append(cell)
        figure = figure_of(cell) if cell.cell_type == "code" else None
        if figure:
            caption = plain_markdown(" ".join(figure["caption"].split()), figures)
            number = figures[figure["name"]]
            cells.append(nbformat.v4.new_markdown_cell(f"*Fig. {number}: {caption}*"))
    for index, cell in enumerate(cells):
        cell.id = f"{chapter.stem[:2]}-{index:03d}"  # stable ids: no drift between runs
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    notebook.cells = cells
    notebook.metadata = {
        "accelerator": "GPU",
        "colab": {"gpuType": "T4", "provenance": [], "toc_visible": True},
        "kernelspec": {
            "display_name": "Python 3",
            "language": "python",
            "name": "python3",
        },
        "language_info": {"name": "python"},
    }
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    return json.dumps(notebook, indent=1, ensure_ascii=False, sort_keys=True) + "\n"


def links_block() -> str:
    """The Markdown table of Colab links that README.md and book/intro.md carry."""
    rows = ["| chapter | notebook |", "|---|---|"]
    for chapter in chapter_files():
        notebook = chapter.stem + ".ipynb"
        title = re.search(r"^# (.+)$", chapter.read_text(encoding="utf-8"), re.M)
        name = title.group(1).split(":")[0] if title else chapter.stem
        rows.append(
            f"| {name} | [![Open In Colab]({BADGE})]({colab_url(notebook)}) "
            f"`notebooks/{notebook}` |"
        )
    return "\n".join([LINKS_START, *rows, LINKS_END])


def pages_url() -> str:
    """Where GitHub Pages publishes the book (.github/workflows/pages.yml)."""
    org, repo = repository()[0].removeprefix("https://github.com/").split("/")
    return f"https://{org.lower()}.github.io/{repo}/"


def badges_block() -> str:
    """README.md's badges (CI, the published book, Colab), from ``repository.url``."""
    url, branch = repository()
    actions = f"{url}/actions/workflows"
    first = chapter_files()[0].stem + ".ipynb"
    badges = [
        f"[![CI]({actions}/ci.yml/badge.svg?branch={branch})]({actions}/ci.yml)",
        f"[![Book]({actions}/pages.yml/badge.svg?branch={branch})]({pages_url()})",
        f"[![Open In Colab]({BADGE})]({colab_url(first)})",
    ]
    return "\n".join([BADGES_START, " ".join(badges), BADGES_END])


def with_badges(text: str, path: Path) -> str:
    pattern = re.compile(re.escape(BADGES_START) + r".*?" + re.escape(BADGES_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no {BADGES_START} ... {BADGES_END} block")
    return pattern.sub(lambda _: badges_block(), text)


def with_links(text: str, path: Path) -> str:
    pattern = re.compile(re.escape(LINKS_START) + r".*?" + re.escape(LINKS_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path}: no {LINKS_START} ... {LINKS_END} block")
    return pattern.sub(lambda _: links_block(), text)


def expected_files() -> dict[Path, str]:
    """Every file this script writes, with its content."""
    files = {NOTEBOOKS / (ch.stem + ".ipynb"): render(ch) for ch in chapter_files()}
    for path in LINK_FILES:
        files[path] = with_links(path.read_text(encoding="utf-8"), path)
    readme = ROOT / "README.md"
    files[readme] = with_badges(files[readme], readme)
    return files


def stale_files() -> list[Path]:
    """Files that differ from what this script would write, and notebooks of no chapter."""
    expected = expected_files()
    stale = [
        path
        for path, text in expected.items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    stale += sorted(set(NOTEBOOKS.glob("*.ipynb")) - set(expected))
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="report drift, write nothing"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)}")
        if stale:
            print("run `python tools/notebooks.py` to regenerate them")
        return 1 if stale else 0
    NOTEBOOKS.mkdir(exist_ok=True)
    expected = expected_files()
    for orphan in set(NOTEBOOKS.glob("*.ipynb")) - set(expected):
        orphan.unlink()
    for path, text in expected.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
