"""tasks.py: how PyTorch is chosen on a first install, how installs are told, the compat
environment, the book's profile, the workflows, the lab."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CUDA_REQUIRES = ["filelock", 'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"']
CPU_REQUIRES = ["filelock", "sympy>=1.13.3"]


def load_tasks():
    spec = importlib.util.spec_from_file_location("tasks_under_test", ROOT / "tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tasks = load_tasks()


def project_extras() -> dict[str, list[str]]:
    sys.path.insert(0, str(ROOT))
    from tools.notebooks import project

    return project()["optional-dependencies"]


def plan(*, gpu=False, system="Linux", offers=None, cpu_index=False):
    """plan_torch_install with a fake index: ``offers`` maps a requirement to what the
    index would give (its Requires-Dist), or to None when it has no match."""
    offers = offers or {}
    asked: list[tuple[str, str | None]] = []

    def candidate(requirement, index_url):
        asked.append((requirement, index_url))
        return offers.get(requirement)

    args = tasks.plan_torch_install(
        has_nvidia_gpu=gpu,
        system=system,
        candidate=candidate,
        cpu_index_reachable=lambda: cpu_index,
    )
    return args, asked


def test_a_gpu_or_a_non_linux_machine_takes_the_default_build_without_probing():
    for kwargs in ({"gpu": True}, {"system": "Darwin"}, {"system": "Windows"}):
        args, asked = plan(**kwargs)
        assert args == ["torch>=2.4"] and asked == []


def test_a_mirror_whose_newest_torch_is_a_cpu_build_is_used_as_it_is():
    args, _ = plan(offers={"torch>=2.4": CPU_REQUIRES}, cpu_index=True)
    assert args == ["torch>=2.4"]


def test_the_tested_version_is_taken_when_it_is_a_cpu_build_and_the_newest_is_not():
    # this machine's case: the index's newest torch pulls CUDA, torch==2.13.0 is a CPU wheel
    offers = {"torch>=2.4": CUDA_REQUIRES, tasks.TESTED_TORCH: CPU_REQUIRES}
    args, asked = plan(offers=offers, cpu_index=True)
    assert args == [tasks.TESTED_TORCH]
    assert [a[0] for a in asked] == ["torch>=2.4", tasks.TESTED_TORCH]


def test_pytorchs_cpu_index_is_the_fallback_when_the_index_has_only_cuda_builds():
    offers = {"torch>=2.4": CUDA_REQUIRES, tasks.TESTED_TORCH: CUDA_REQUIRES}
    args, _ = plan(offers=offers, cpu_index=True)
    assert args == ["torch>=2.4", "--index-url", tasks.CPU_INDEX]


def test_no_cpu_build_anywhere_is_a_clear_error_not_a_cuda_download():
    with pytest.raises(SystemExit, match="no CPU-only build of PyTorch"):
        plan(offers={"torch>=2.4": CUDA_REQUIRES}, cpu_index=False)


def test_cuda_builds_are_told_by_their_requirements():
    assert tasks.is_cuda_build(CUDA_REQUIRES)
    assert tasks.is_cuda_build(
        ['cuda-toolkit[cublas]==13.0.3; platform_system == "Linux"']
    )
    assert not tasks.is_cuda_build(CPU_REQUIRES)
    assert not tasks.is_cuda_build([])


def test_the_book_refuses_an_unknown_profile_before_building(monkeypatch):
    monkeypatch.setenv("TFS_PROFILE", "bogus")
    monkeypatch.setattr(tasks.sys, "executable", sys.executable)
    with pytest.raises(SystemExit, match="'bogus' is not a profile"):
        tasks.active_profile()
    monkeypatch.setenv("TFS_PROFILE", "full")
    assert tasks.active_profile() == "full"


def test_the_profile_extension_keys_the_cache_and_the_environment_on_the_profile(
    monkeypatch,
):
    spec = importlib.util.spec_from_file_location(
        "book_profile", ROOT / "book/_ext/run_profile.py"
    )
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)

    class Config:
        pass

    for name in ("smoke", "full"):
        monkeypatch.setenv("TFS_PROFILE", name)
        config = Config()
        ext._config_inited(None, config)
        assert config.tfs_profile == name
        assert config.nb_execution_cache_path.endswith(f".jupyter_cache-{name}")


def test_workflows_run_ci_and_publish_the_book():
    workflows = ROOT / ".github" / "workflows"
    ci = (workflows / "ci.yml").read_text(encoding="utf-8")
    pages = (workflows / "pages.yml").read_text(encoding="utf-8")
    assert "run: .ci/run" in ci and "pull_request" in ci and "cache: pip" in ci
    assert '"3.10"' in ci  # the lowest Python that pyproject.toml admits
    assert 'requires-python = ">=3.10"' in (ROOT / "pyproject.toml").read_text()
    # pages.yml publishes what book-online.yml builds, online, with the hub's cache
    online = (workflows / "book-online.yml").read_text(encoding="utf-8")
    assert "uses: ./.github/workflows/book-online.yml" in pages
    assert "publish: true" in pages and "deploy-pages" in pages
    assert "tasks.py book" in online and "actions/cache" in online
    assert "upload-pages-artifact" in online and "_build/html" in online
    assert "schedule:" in online and "workflow_dispatch:" in online
    assert "HF_HUB_OFFLINE" not in online  # online on purpose
    assert 'HF_HUB_OFFLINE: "1"' in ci  # the tests are offline
    assert "export HF_HUB_OFFLINE=1" in (ROOT / ".ci" / "run").read_text()


def test_workflows_are_valid_against_githubs_schema():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
            *map(str, (ROOT / ".github/workflows").glob("*.yml")),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_lab_opens_chapters_as_notebooks_and_renders_myst(tmp_path):
    import json

    overrides = tasks.write_lab_config(tmp_path)
    settings = json.loads(overrides.read_text(encoding="utf-8"))
    viewers = settings["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers == {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}
    extras = project_extras()
    assert any(r.startswith("jupyterlab-myst") for r in extras["notebooks"])
    assert any(r.startswith("jupytext") for r in extras["notebooks"])


def test_the_book_serves_its_own_mathjax():
    config = (ROOT / "_config.yml").read_text(encoding="utf-8")
    assert "- sphinx-mathjax-offline" in config
    assert any(r.startswith("sphinx-mathjax-offline") for r in project_extras()["book"])


def test_readme_badges_come_from_the_one_repository_setting():
    sys.path.insert(0, str(ROOT))
    from tools import notebooks

    url, branch = notebooks.repository()
    block = notebooks.badges_block()
    assert f"{url}/actions/workflows/ci.yml/badge.svg?branch={branch}" in block
    assert f"{url}/actions/workflows/pages.yml" in block
    assert notebooks.pages_url() in block
    assert notebooks.colab_url("01-tokenizer.ipynb") in block
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert block in readme, "README.md's badges are stale: python3 tasks.py notebooks"


def test_pages_asks_for_chromium_before_installing_anything(monkeypatch):
    """`tasks.py pages` says how to install Chromium where there is none, instead of
    installing Playwright for a browser it cannot drive (tools/page_overflow.py and its
    tests: tests/test_page_overflow.py)."""
    installed = []
    monkeypatch.setattr(tasks.shutil, "which", lambda name: None)
    monkeypatch.setattr(tasks, "ensure_installed", installed.append)
    with pytest.raises(SystemExit, match="apt install chromium"):
        tasks.cmd_pages([])
    assert installed == []
    ran = []
    monkeypatch.setattr(tasks, "run", lambda *cmd: ran.append(cmd))
    tasks.cmd_pages(["--chromium", "/opt/chrome", "--max-wide", "0"])
    assert installed == ["pages"]
    assert ran[0][1:] == (
        "tools/page_overflow.py",
        "--chromium",
        "/opt/chrome",
        "--max-wide",
        "0",
    )


def test_compat_runs_both_versions_by_default_and_refuses_an_unknown_one():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tasks.py"), "compat", "bogus"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "['bogus'] unknown" in done.stderr
    versions = tasks.transformers_versions()
    assert versions == {"lowest": "transformers==4.46.*", "newest": "transformers"}


def test_the_extras_are_read_as_tomllib_reads_them():
    """tasks.py reads pyproject.toml without tomllib (Python 3.10 has none)."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = project["project"]

    def expand(extra):
        listed = (
            project["optional-dependencies"][extra]
            if extra
            else project["dependencies"]
        )
        found = []
        for line in listed:
            req = Requirement(line)
            if req.name == project["name"]:
                for included in req.extras:
                    found += [r for r in expand(included) if r not in found]
            elif (req.marker is None or req.marker.evaluate()) and line not in found:
                found.append(line)
        return found

    for extra in [None, *project["optional-dependencies"]]:
        assert tasks.project_requirements(extra) == expand(extra), extra


@pytest.mark.parametrize(
    "marker",
    [
        "",
        "platform_system == 'Linux' and platform_machine == 'x86_64'",
        "platform_system == 'Windows'",
        "platform_system != 'Darwin'",
        'sys_platform == "linux"',
    ],
)
def test_environment_markers_are_judged_as_pip_judges_them(marker):
    from packaging.markers import Marker

    assert tasks.marker_holds(marker) == (not marker or Marker(marker).evaluate())


PIP_OUTPUT = """\
Obtaining file:///work/main
Requirement already satisfied: torch>=2.4 in ./.venv/lib/python3.11/site-packages
Collecting einops>=0.7 (from transformers-from-scratch==0.1.0)
  Downloading einops-0.8.2-py3-none-any.whl (64 kB)
Processing /opt/files/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl
Collecting regex>=2023.0 (from transformers-from-scratch==0.1.0)
  Downloading regex-2026.11.19-cp311-cp311-manylinux_2_28_x86_64.whl (5.5 MB)
WARNING: Location 'file:///somewhere/simple/regex/' is ignored
Installing collected packages: regex, numpy, einops, transformers-from-scratch
Successfully installed einops-0.8.2 numpy-2.4.6 regex-2026.11.19 transformers-from-scratch-0.1.0
"""


def test_an_install_is_told_in_a_few_lines_of_counts():
    progress = tasks.PipProgress()
    lines = PIP_OUTPUT.splitlines(keepends=True)
    assert [progress.feed(line) for line in lines[:8]] == [None] * 8
    assert progress.status(12) == (
        "12 s: 4 collected (2 downloaded, 6 MB), 1 already installed"
    )
    assert progress.feed(lines[8]) == (
        "installing 4: regex, numpy, einops, transformers-from-scratch"
    )
    assert progress.status(40) == "40 s: still installing 4 packages"
    assert progress.feed(lines[9]) is None
    assert progress.summary(41) == "4 installed in 41 s; its 1 warnings are in the log"
    assert progress.feed("ERROR: No matching distribution\n") == (
        "ERROR: No matching distribution"
    )


@pytest.mark.skipif(
    sys.platform == "win32", reason="the stand-in pip is a shell script"
)
def test_pip_shows_progress_while_it_waits_and_its_last_lines_when_it_fails(
    tmp_path, monkeypatch, capsys
):
    fake = tmp_path / "python"  # called as `python -m pip install ...`
    fake.write_text(
        "#!/bin/sh\necho 'Collecting einops'\necho 'Installing collected packages: "
        "einops'\nsleep 1\necho 'Successfully installed einops-0.8.2'\n"
        "if [ \"$6\" = fail ]; then echo 'ERROR: it broke'; exit 1; fi\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(tasks, "PIP_LOGS", tmp_path / "logs")
    monkeypatch.setattr(tasks, "PROGRESS_EVERY", 0.3)
    assert tasks.pip("ok", "einops", log="demo", python=fake) == 0
    out = capsys.readouterr().out
    assert "[tasks]   installing 1: einops" in out
    assert "still installing 1 packages" in out  # the heartbeat during the sleep
    assert "[tasks]   1 installed in 1 s" in out
    assert "Successfully installed" not in out  # pip's own lines: in the log only
    log = (tmp_path / "logs" / "pip-demo.log").read_text()
    assert "Successfully installed einops-0.8.2" in log
    with pytest.raises(SystemExit, match="pip failed .exit 1.; its whole output: "):
        tasks.pip("fail", log="demo", python=fake)
    assert "Successfully installed einops" in capsys.readouterr().out  # the tail


def test_compat_builds_its_environment_once_and_takes_torch_from_this_one(
    tmp_path, monkeypatch
):
    installs = []
    monkeypatch.setattr(tasks, "COMPAT_DIR", tmp_path / "compat")
    monkeypatch.setattr(tasks, "pip", lambda *args, **kw: installs.append(args))
    monkeypatch.setattr(tasks.sys, "executable", sys.executable)
    env = tasks.compat_env("lowest", "transformers==4.46.*")
    assert env.parent == tmp_path / "compat" and env.name.startswith("lowest-")
    assert tasks.compat_env("lowest", "transformers==4.46.*") == env  # reused
    assert installs == [("transformers==4.46.*",)]
    # its Python finds torch, pytest and lib here, in this environment's copies
    probe = (
        "import importlib.util as u; "
        "print(*(u.find_spec(m).origin for m in ('torch', 'pytest', 'lib')))"
    )
    found = subprocess.run(
        [str(tasks.venv_python(env)), "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    here = [Path(d) for d in tasks.site_dirs()]
    assert all(Path(f).is_relative_to(d) for f in found[:2] for d in here[:1]), found
    assert Path(found[2]) == ROOT / "lib" / "__init__.py"  # the editable lib
    # half built (no stamp): built again; a new requirement: a new one, the old removed
    (env / tasks.COMPAT_STAMP).unlink()
    assert tasks.compat_env("lowest", "transformers==4.46.*") == env
    newer = tasks.compat_env("lowest", "transformers==4.47.*")
    assert newer != env and not env.exists() and len(installs) == 3


def test_jupyterlab_finds_jupyterlab_myst_compatible():
    """With the notebooks extra installed: `jupyter labextension list` marks no extension
    "not compatible" (jupyterlab-myst and JupyterLab's @jupyter/ydoc agree)."""
    pytest.importorskip("jupyterlab")
    pytest.importorskip("jupyterlab_myst")
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"],
        capture_output=True,
        text=True,
    )
    listed = done.stdout + done.stderr
    assert "jupyterlab-myst" in listed and "not compatible" not in listed, listed


@pytest.mark.parametrize(
    "chapter",
    [*sorted((ROOT / "chapters").glob("*.md")), ROOT / "tools" / "chapter_template.md"],
    ids=lambda path: path.stem,
)
def test_a_chapter_saved_from_jupyterlab_is_unchanged(chapter):
    """JupyterLab gives a notebook the kernelspec of the kernel it starts (ipykernel's
    python3, "Python 3 (ipykernel)"), replacing one that differs (its keys then in the
    order name, display_name, language), and its language_info; Jupytext writes the .md
    back with the kernelspec. A chapter opened and saved in the lab reads the same (as a
    save from JupyterLab 4.6 in a browser showed), except that a newer Jupytext writes its
    own version into the header."""
    import re

    import jupytext
    from ipykernel.kernelspec import get_kernel_dict

    text = chapter.read_text(encoding="utf-8")
    notebook = jupytext.reads(text, fmt="md:myst")
    spec = get_kernel_dict()
    lab_spec = {
        "name": "python3",
        "display_name": spec["display_name"],
        "language": spec["language"],
    }
    if notebook.metadata.get("kernelspec") != lab_spec:
        notebook.metadata["kernelspec"] = lab_spec
    notebook.metadata["language_info"] = {"name": "python", "version": "3.11.7"}
    saved = jupytext.writes(notebook, fmt="md:myst")
    version = re.compile(r"jupytext_version: \S+")
    if jupytext.__version__ not in version.search(text).group(0):
        saved = version.sub(version.search(text).group(0), saved)
    assert saved == text


def test_offline_maths_check_reads_each_page():
    """A page with maths needs the book's own MathJax; a page without maths (chapter
    7.2 is code and prose) needs none; MathJax from elsewhere is always wrong."""
    own = '<script defer src="../_static/mathjax/tex-chtml.js"></script>'
    cdn = '<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js"></script>'
    maths = '<span class="math notranslate nohighlight">\\(x\\)</span>'
    assert tasks.maths_problem(own + maths) is None
    assert tasks.maths_problem("<p>code and prose</p>") is None
    assert tasks.maths_problem(maths) == "maths, but MathJax from nowhere"
    assert "MathJax from ['https://cdn" in tasks.maths_problem(cdn + maths)
    assert tasks.maths_problem("") == "no page"
