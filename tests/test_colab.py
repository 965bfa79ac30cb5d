"""The Colab notebooks: generated from the chapters, installing themselves, run as a new
user would run them (a fresh virtual environment with nothing but torch)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from packaging.requirements import Requirement

from tools import notebooks
from tools.tangle import chapter_files

ROOT = Path(__file__).resolve().parent.parent


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_notebooks_and_colab_links_match_their_sources():
    stale = notebooks.stale_files()
    assert not stale, (
        f"out of date: {[str(p.relative_to(ROOT)) for p in stale]}; "
        "run `python3 tasks.py notebooks`"
    )
    assert sorted(p.stem for p in notebooks.NOTEBOOKS.glob("*.ipynb")) == [
        c.stem for c in chapter_files()
    ]


def test_one_setting_gives_every_colab_address():
    url, branch = notebooks.repository()
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert config["launch_buttons"]["colab_url"] == notebooks.COLAB
    for chapter in chapter_files():
        name = chapter.stem + ".ipynb"
        address = notebooks.colab_url(name)
        assert address.endswith(f"/blob/{branch}/notebooks/{name}")
        # The README agrees with the cell; the book's buttons (book/_ext/colab.py calls
        # colab_url too) are checked after the strict build: tasks.py check_colab_buttons.
        assert address in (ROOT / "README.md").read_text(encoding="utf-8")
        cell = "".join(load(notebooks.NOTEBOOKS / name)["cells"][1]["source"])
        assert f'REPOSITORY = "{url}"' in cell and f'BRANCH = "{branch}"' in cell


def test_a_bad_repository_setting_is_a_clear_error(monkeypatch, tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text("repository:\n  url: https://example.org/course\n")
    monkeypatch.setattr(notebooks, "CONFIG", config)
    with pytest.raises(SystemExit, match="must be https://github.com/ORG/REPO"):
        notebooks.repository()


def test_each_notebook_installs_only_what_its_chapter_imports():
    needs = {
        c.stem: notebooks.chapter_needs(c.read_text(encoding="utf-8"))
        for c in chapter_files()
    }
    assert list(needs["01-tokenizer"]) == ["tokenizers"]
    assert list(needs["07-2-reference"]) == ["transformers"]
    assert list(needs["08-3-runs"]) == ["sacrebleu"]
    assert needs["08-1-training"] == needs["08-2-efficiency"] == {}
    assert needs["02-embeddings"] == {}
    # The requirement strings are the `chapters` extra's, so the ranges cannot drift.
    assert needs["07-2-reference"]["transformers"] == "transformers>=4.46"


def test_solutions_are_collapsed_and_myst_roles_are_plain_markdown():
    for path in sorted(notebooks.NOTEBOOKS.glob("*.ipynb")):
        nb = load(path)
        assert nb["metadata"]["accelerator"] == "GPU"
        assert nb["cells"][1]["cell_type"] == "code"  # the install cell comes first
        for cell in nb["cells"]:
            source = "".join(cell["source"])
            if "solution" in cell["metadata"].get("tags", []):
                assert source.startswith("# @title Solution"), path.name
                assert cell["metadata"]["cellView"] == "form"
                assert cell["metadata"]["jupyter"]["source_hidden"] is True
            if cell["cell_type"] == "markdown":
                assert not re.search(r"\{(cite|numref|ref|doc)\}`", source), path.name
            else:
                assert cell["outputs"] == [] and cell["execution_count"] is None


def test_citations_become_linked_author_year_labels():
    text = notebooks.plain_markdown(
        "as shown {cite}`vaswani2017attention,gage1994bpe`", {}
    )
    assert text == (
        "as shown ([Vaswani et al., 2017](https://arxiv.org/abs/1706.03762); "
        "[Gage, 1994](http://www.pennelynn.com/Documents/CUJ/HTML/94HTML/19940045.HTM))"
    )
    assert notebooks.plain_markdown("see {numref}`fig-a`", {"fig-a": 2}) == "see Fig. 2"
    # a module's name as code (the sentences around it are often in italics)
    assert notebooks.plain_markdown("{ref}`lib.x <api-lib-x>`", {}) == "`lib.x`"
    assert notebooks.plain_markdown("{ref}`the rule <sec-rule>`", {}) == "*the rule*"
    # another page of the course links to its own Colab notebook
    linked = notebooks.plain_markdown("{doc}`page 7.2 <07-2-reference>`", {})
    assert linked == f"[page 7.2]({notebooks.colab_url('07-2-reference.ipynb')})"
    untitled = notebooks.plain_markdown("{doc}`../chapters/08-2-efficiency`", {})
    assert untitled.startswith("[8.2 Memory and speed")  # the page's own title
    assert untitled.endswith(f"({notebooks.colab_url('08-2-efficiency.ipynb')})")
    with pytest.raises(SystemExit, match="no such entry"):
        notebooks.plain_markdown("{cite}`nobody1999`", {})


def test_install_cell_installs_nothing_where_lib_is_installed(tmp_path):
    cell = "".join(
        load(notebooks.NOTEBOOKS / "01-tokenizer.ipynb")["cells"][1]["source"]
    )
    env = {k: v for k, v in os.environ.items() if k != "TFS_REPO"}
    done = subprocess.run(
        [sys.executable, "-c", cell],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ready: lib from"), done.stdout
    assert "installing" not in done.stdout
    assert not any(tmp_path.iterdir())  # nothing cloned


def test_install_cell_checks_versions_and_platforms(capsys):
    cell = "".join(
        load(notebooks.NOTEBOOKS / "07-2-reference.ipynb")["cells"][1]["source"]
    )
    definitions = cell[: cell.index("# TFS_REPO names")]  # imports, settings, helpers
    scope: dict = {}
    exec(definitions, scope)
    satisfied = scope["satisfied"]
    assert scope["NEEDS"] == ["transformers>=4.46"]
    assert satisfied(f"torch=={torch.__version__}") and satisfied("torch>=2.4")
    assert not satisfied("torch<2")  # present, but in a version the chapter cannot use
    assert not satisfied("no-such-package-anywhere>=1")
    assert satisfied("no-such-package-anywhere>=1; sys_platform == 'no-such-os'")
    # A package present in the wrong version is named with both versions.
    torch_too_new = 'NEEDS = ["torch<2", "no-such-package-anywhere>=1"]'
    checks = cell[: cell.index("try:\n    importlib.metadata.version(PACKAGE)")]
    checks = checks.replace('NEEDS = ["transformers>=4.46"]', torch_too_new)
    exec(checks, scope := {})
    assert scope["missing"] == ["torch<2", "no-such-package-anywhere>=1"]
    out = capsys.readouterr().out
    assert f"torch {torch.__version__} is installed; this chapter needs torch<2" in out
    assert "no-such-package" not in out


# What a Colab runtime had installed when this was written (issue 20): transformers 5.24,
# tokenizers 0.23, huggingface_hub 2.4, with sentence-transformers and datasets beside them.
COLAB_LIKE = {
    "torch": "2.9.0",
    "numpy": "2.0.2",
    "transformers": "5.24.0",
    "tokenizers": "0.23.0",
    "huggingface-hub": "2.4.0",
    "triton": "3.5.0",
    "sacrebleu": None,  # not on Colab: the one package chapter 8's cell adds
}


def test_on_a_colab_like_runtime_the_cells_install_lib_and_nothing_else(monkeypatch):
    import importlib.metadata

    def version(name):
        found = COLAB_LIKE.get(name.lower().replace("_", "-"))
        if found is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return found

    monkeypatch.setattr(importlib.metadata, "version", version)
    for chapter in chapter_files():
        cell = "".join(
            load(notebooks.NOTEBOOKS / f"{chapter.stem}.ipynb")["cells"][1]["source"]
        )
        scope: dict = {}
        exec(cell[: cell.index("# TFS_REPO names")], scope)
        missing = [req for req in scope["NEEDS"] if not scope["satisfied"](req)]
        wanted = ["sacrebleu>=2.3"] if "sacrebleu" in cell else []
        assert missing == wanted, f"{chapter.name} would install {missing}"
    # and whatever pip does change is named with its versions, before and after
    assert 'print(f"  {name}: {was} -> {now}")' in cell


def pyproject_requirements() -> dict[str, Requirement]:
    """Every requirement of the package and of the extras environment.yml installs."""
    project = notebooks.project()
    lines = list(project["dependencies"])
    for extra in ("chapters", "test", "book", "notebooks"):
        lines += project["optional-dependencies"][extra]
    found = {}
    for line in lines:
        req = Requirement(line)
        if req.name != project["name"]:  # the extras that include other extras
            found.setdefault(req.name.lower(), req)
    return found


def test_environment_yml_agrees_with_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    conda_names = {"pytorch": "torch"}  # conda-forge's name for a PyPI package
    listed: dict[str, str] = {}
    for dep in env["dependencies"]:
        entries = dep["pip"] if isinstance(dep, dict) else [dep]
        for entry in entries:
            if entry.startswith("-e"):
                assert entry == '-e ".[test,book,notebooks]"'
                continue
            req = Requirement(entry)
            name = conda_names.get(req.name.lower(), req.name.lower())
            listed[name] = str(req.specifier)
    wanted = pyproject_requirements()
    for name, req in wanted.items():
        if req.marker is not None:  # platform-limited (triton): via the -e line only
            assert name not in listed
            continue
        assert name in listed, f"environment.yml lacks {name} ({req})"
        assert listed[name] == str(req.specifier), (name, listed[name], str(req))
    extra = set(listed) - set(wanted) - {"python", "pip"}
    assert not extra, f"environment.yml lists what pyproject.toml does not: {extra}"


def ignore_untracked(directory: str, names: list[str]) -> list[str]:
    skip = {".venv", "_build", ".git", ".pytest_cache", ".ruff_cache", ".hypothesis"}
    return [
        n for n in names if n in skip or n.endswith(".egg-info") or n == "__pycache__"
    ]


def _requirements(names: list[str]) -> list:
    """The installed distributions ``names`` and every one they require, extras
    included (this environment's)."""
    from importlib.metadata import distribution

    from packaging.utils import canonicalize_name

    found: dict[str, tuple] = {}
    todo = [(name, frozenset()) for name in names]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in found and extras <= found[key][1]:
            continue
        extras |= found[key][1] if key in found else frozenset()
        dist = distribution(name)
        found[key] = (dist, extras)
        for text in dist.requires or []:
            req = Requirement(text)
            environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if req.marker is None or any(map(req.marker.evaluate, environments)):
                todo.append((req.name, frozenset(req.extras)))
    return [dist for dist, _ in found.values()]


def _install_from_here(names: list[str], site: Path) -> None:
    """Install ``names``, with all they require, into another environment's
    site-packages ``site`` as they are installed here: each file of their records
    hard-linked (copied where no link can be made). What pip installs from the same
    wheels, without unpacking and byte-compiling torch again (pip and Python replace a
    file rather than write into it, so this environment's files are never changed)."""
    for dist in _requirements(names):
        assert dist.files is not None, f"{dist.metadata['Name']} has no record of files"
        for file in dist.files:
            source = Path(dist.locate_file(file))
            if ".." in file.parts or not source.is_file():
                continue  # scripts and data outside site-packages, files never made
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:  # another file system
                shutil.copy2(source, target)


@pytest.mark.slow
def test_a_notebook_runs_in_a_fresh_environment_with_only_torch(tmp_path):
    """As a new Colab user: a new virtual environment with torch (Colab's is preinstalled)
    and a notebook runner, then the generated notebook from its first cell, whose install
    cell finds no `lib` and installs it, with the chapter's extra package, from a copy of
    this checkout (``TFS_REPO``, standing in for the repository's address)."""
    checkout = tmp_path / "course"
    shutil.copytree(ROOT, checkout, ignore=ignore_untracked)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # pip, torch (Colab's is preinstalled) and a notebook runner (Colab has Jupyter;
    # here nbmake runs the kernel), the versions this machine's tests use
    _install_from_here(["pip", "torch", "nbmake"], Path(site))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
    }
    env |= {
        "PATH": f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        "TFS_REPO": str(checkout),
        "TFS_PROFILE": "smoke",
        "MPLBACKEND": "Agg",
    }

    def run(*cmd: str, cwd: Path = tmp_path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, (
            f"{' '.join(cmd)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
        return done

    listed = run(str(python), "-m", "pip", "list", "--format=json").stdout
    assert "transformers-from-scratch" not in listed and "tokenizers" not in listed

    # The notebook alone, outside the checkout (on Colab it sits in /content).
    workdir = tmp_path / "content"
    workdir.mkdir()
    shutil.copy(notebooks.NOTEBOOKS / "01-tokenizer.ipynb", workdir)
    run(str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbmake",
        "01-tokenizer.ipynb", cwd=workdir)  # fmt: skip

    listed = json.loads(run(str(python), "-m", "pip", "list", "--format=json").stdout)
    versions = {p["name"].lower(): p["version"] for p in listed}
    assert "transformers-from-scratch" in versions and "tokenizers" in versions
    assert versions["torch"] == torch.__version__  # the preinstalled torch was kept
    # Run again, the install cell finds everything and installs nothing.
    nb = load(workdir / "01-tokenizer.ipynb")
    again = run(str(python), "-c", "".join(nb["cells"][1]["source"]), cwd=workdir)
    assert again.stdout.startswith(f"ready: lib from {checkout / 'lib'}"), again.stdout
    assert "installing" not in again.stdout
    # With lib installed but the chapter's extra package gone, only that one comes back.
    run(str(python), "-m", "pip", "uninstall", "--yes", "--quiet", "tokenizers")
    again = run(str(python), "-c", "".join(nb["cells"][1]["source"]), cwd=workdir)
    assert again.stdout.startswith("installing ['tokenizers>=0.15']"), again.stdout
    assert "installing lib" not in again.stdout
    assert "tokenizers" in run(str(python), "-m", "pip", "list").stdout
