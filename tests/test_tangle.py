"""lib is generated from the chapters: nothing may drift, and nothing may be defined twice."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from tools import tangle

LIB = Path(__file__).resolve().parent.parent / "lib"
CHAPTERS = tangle.chapter_files()


def test_there_are_chapters():
    assert len(CHAPTERS) >= 1, "no chapters/NN-name.md found"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_module_matches_its_chapter(chapter: Path):
    for name, text in tangle.render_all(chapter).items():
        module = LIB / f"{name}.py"
        assert module.exists(), (
            f"{module.name} is missing: run `python tools/tangle.py`"
        )
        assert module.read_text(encoding="utf-8") == text, (
            f"lib/{module.name} differs from the export cells of chapters/{chapter.name}: "
            "edit the chapter, not the module, then run `python tools/tangle.py`"
        )


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_does_not_import_what_it_generates(chapter: Path):
    lines = tangle.self_imports(chapter)
    assert not lines, (
        f"chapters/{chapter.name} imports from a module it generates, so the reader runs the "
        f"committed copy instead of the code on the page: {lines}"
    )


def test_self_import_detector_and_export_targets(tmp_path: Path, monkeypatch):
    chapter = tmp_path / "07-demo.md"
    chapter.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n---\n\n"
        "```{code-cell} ipython3\n:tags: [export]\n\ndef f():\n    return 1\n```\n\n"
        "```{code-cell} ipython3\n:tags: [export:other]\n\n# lib: from lib.demo import f\n"
        "def g():\n    return f()\n```\n\n"
        "```{code-cell} ipython3\n:tags: [export:third]\n\nfrom lib.demo import f\n```\n\n"
        "```{code-cell} ipython3\nfrom lib.other import g\nfrom lib.utils import pick\n```\n",
        encoding="utf-8",
    )
    modules = tangle.export_cells_by_module(chapter)
    assert set(modules) == {"demo", "other", "third"}
    assert modules["other"][0].startswith(
        "# From chapters/07-demo.md.\nfrom lib.demo import f\ndef g():"
    )  # uncommented, after the origin comment
    assert tangle.self_imports(chapter) == [
        "from lib.demo import f",
        "from lib.other import g",
    ]
    assert tangle.cell_target(["export:models"], "demo") == "models"
    with pytest.raises(ValueError, match="one module only"):
        tangle.cell_target(["export", "export:models"], "demo")


def _top_level_names(path: Path) -> list[tuple[str, int]]:
    """Names bound at module level by def, class and assignment (imports excluded)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append((node.name, node.lineno))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.append((leaf.id, node.lineno))
    return names


def _lib_modules() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize(
    "module", _lib_modules(), ids=lambda p: str(p.relative_to(LIB))
)
def test_no_name_defined_twice_in_a_module(module: Path):
    seen: dict[str, int] = {}
    twice = []
    for name, line in _top_level_names(module):
        if name in seen and name != "__all__":
            twice.append(f"{name} (lines {seen[name]} and {line})")
        seen.setdefault(name, line)
    assert not twice, (
        f"{module.name} defines these names more than once: {', '.join(twice)}"
    )


def test_no_public_function_or_class_defined_in_two_modules():
    where: dict[str, list[str]] = defaultdict(list)
    for module in _lib_modules():
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(
                node, (ast.FunctionDef, ast.ClassDef)
            ) and not node.name.startswith("_"):
                where[node.name].append(str(module.relative_to(LIB)))
    twice = {name: mods for name, mods in where.items() if len(mods) > 1}
    assert not twice, f"public names defined in more than one lib module: {twice}"


def test_duplicate_detector_catches_a_redefinition(tmp_path: Path):
    # The check above must be able to fail: a module defining f twice is caught.
    module = tmp_path / "m.py"
    module.write_text("def f():\n    return 1\n\n\ndef f():\n    return 2\n")
    names = [name for name, _ in _top_level_names(module)]
    assert names.count("f") == 2


def test_each_exported_cell_says_where_it_was_written(tmp_path: Path):
    chapter = tmp_path / "07-demo.md"
    chapter.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n---\n\n"
        "# 7. Demo\n\n```{code-cell} ipython3\n:tags: [export]\n\nimport math\n```\n\n"
        "## The `first` part\n\nText.\n\n```python\n# not a heading\n```\n\n"
        "```{code-cell} ipython3\n:tags: [export]\n\ndef first():\n    return 1\n```\n\n"
        "```{code-cell} ipython3\nhelper = 2\n```\n\n"
        "### Second\n\n```{code-cell} ipython3\n:tags: [export]\n\nLIMIT = 3\n"
        "_private = 4\n\n\nclass Second:\n    pass\n```\n",
        encoding="utf-8",
    )
    text = tangle.render_all(chapter)["demo"]
    assert '# From chapters/07-demo.md, section "7. Demo".\nimport math' in text
    assert '# From chapters/07-demo.md, section "The first part".\ndef first' in text
    assert '# From chapters/07-demo.md, section "Second".\nLIMIT = 3' in text
    # __all__ lists what the export cells define, in order, and nothing private
    namespace: dict = {}
    exec(compile(text, "demo.py", "exec"), namespace)
    assert namespace["__all__"] == ["first", "LIMIT", "Second"]
    assert text.index("import math") < text.index("__all__") < text.index("def first")


@pytest.mark.parametrize("module", sorted(LIB.glob("*.py")), ids=lambda p: p.name)
def test_every_generated_module_names_the_origin_of_each_cell(module: Path):
    text = module.read_text(encoding="utf-8")
    if "# This file is generated from" not in text[:200]:
        pytest.skip("hand-written")
    tree = ast.parse(text)
    lines = text.splitlines()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = [line for line in lines[: first - 1] if line.startswith("# From ")]
            assert above, f"{module.name}: {node.name} has no origin comment above it"
    exported = ast.literal_eval(
        next(
            n.value
            for n in tree.body
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
        )
    )
    assert exported == tangle.public_names([text]), (
        f"{module.name}: __all__ is not the list of its public top-level names"
    )


def test_a_hand_kept_all_is_refused(tmp_path: Path):
    chapter = tmp_path / "07-demo.md"
    chapter.write_text(
        "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n---\n\n"
        "```{code-cell} ipython3\n:tags: [export]\n\nimport math\n\n__all__ = ['f']\n```\n\n"
        "```{code-cell} ipython3\n:tags: [export]\n\ndef f():\n    return math.pi\n```\n",
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match="assigns __all__.*derives it"):
        tangle.render_all(chapter)
