"""How much of ``lib`` is argument checking: the measure behind CONTRIBUTING's rule.

Counted with the AST, per generated module, and in the hand-written ``lib/_checks.py``
(the shared checks: every code line of it counts as checking, the trust machinery
included) and ``lib/utils.py`` (measured as a generated module is). The totals cover all
of them:

* **lines**: the non-blank lines of the module, which the limits are stated against (the
  measure issue 18 used); and, as a stricter second figure, **code lines**: lines that hold
  code, docstrings and comments left out;
* **check lines**: the code lines of

  - ``if ...: raise ...`` blocks (an ``if`` whose body ends in ``raise``, or an ``elif``/
    ``else`` branch that does), the test included;
  - ``assert`` statements;
  - calls to the shared checks (``check.name(...)`` of ``lib._checks``) and to a module's
    own checker functions, whole statements;
  - checker functions themselves: a function whose name starts with ``_check`` or
    ``check_``;
  - a decorator that is a shared check (``@check.front_door(checker)``);
  - in ``lib/_checks.py``, every code line.

    python tools/check_share.py            # a table, and the totals
    python tools/check_share.py --max-module 20 --max-total 14   # exit 1 above the limits
    python tools/check_share.py --pages --max-page 10   # per page, the code the book shows

``tests/test_check_share.py`` holds ``lib`` to the limits CONTRIBUTING gives.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "lib"
GENERATED_MARK = "# This file is generated from"
SHARED_CHECKS = "_checks.py"
#: Hand-written modules measured beside the generated ones.
HAND_WRITTEN = (SHARED_CHECKS, "utils.py")


@dataclass(frozen=True)
class Share:
    module: str
    code_lines: int
    check_lines: int
    nonblank_lines: int = 0

    @property
    def percent(self) -> float:
        """Check lines per line of non-blank source: the measure the rule's limits are
        stated in (issue 18 counted this way: docstrings and comments are part of the
        module a reader reads)."""
        return 100.0 * self.check_lines / max(self.nonblank_lines, 1)

    @property
    def percent_of_code(self) -> float:
        """The stricter share: check lines per code line (docstrings, comments out)."""
        return 100.0 * self.check_lines / max(self.code_lines, 1)


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _code_lines(source: str, tree: ast.AST) -> set[int]:
    """Lines holding at least one token that is not a comment, newline or indentation."""
    skip = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - _docstring_lines(tree)


def _span(node: ast.AST) -> set[int]:
    return set(range(node.lineno, node.end_lineno + 1))


def _is_checker_name(name: str) -> bool:
    return name.startswith(("_check", "check_"))


def _is_check_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id == "check"
    if isinstance(func, ast.Name):
        return _is_checker_name(func.id)
    if isinstance(func, ast.Attribute):  # self._check_input(...)
        return _is_checker_name(func.attr)
    return False


def _raises(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Raise)


def _check_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if _is_checker_name(node.name):
                lines |= _span(node)
            for decorator in node.decorator_list:
                if _is_check_call(decorator):
                    lines |= _span(decorator)
        elif isinstance(node, ast.If):
            if _raises(node.body):
                # the test and the raising body; an else branch that is ordinary code is not
                lines |= set(range(node.lineno, node.body[-1].end_lineno + 1))
            if (
                node.orelse
                and _raises(node.orelse)
                and not isinstance(node.orelse[0], ast.If)
            ):
                lines |= set(
                    range(node.orelse[0].lineno - 1, node.orelse[-1].end_lineno + 1)
                )
        elif isinstance(node, ast.Assert):
            lines |= _span(node)
        elif isinstance(node, ast.Expr | ast.Assign | ast.AnnAssign | ast.Return):
            value = node.value
            if value is not None and _is_check_call(value):
                lines |= _span(node)
    return lines


def measure(path: Path) -> Share:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    code = _code_lines(source, tree)
    # the shared checks are all checking code; elsewhere, the lines the rules name
    checks = code if path.name == SHARED_CHECKS else _check_lines(tree) & code
    nonblank = sum(1 for line in source.splitlines() if line.strip())
    return Share(path.stem, len(code), len(checks), nonblank)


def measured_modules() -> list[Path]:
    """The generated modules of ``lib``, the shared checks and ``utils``."""
    return [
        p
        for p in sorted(LIB.glob("*.py"))
        if GENERATED_MARK in p.read_text(encoding="utf-8")[:300]
        or p.name in HAND_WRITTEN
    ]


def chapter_modules() -> list[Path]:
    """The modules a chapter generates (held to the per-module limit)."""
    return [p for p in measured_modules() if p.name not in HAND_WRITTEN]


def total(shares: list[Share]) -> Share:
    """All measured modules together: what the rule's total limit is about."""
    return Share(
        "total",
        sum(s.code_lines for s in shares),
        sum(s.check_lines for s in shares),
        sum(s.nonblank_lines for s in shares),
    )


#: Cell tags under which the book does not show a cell's code unless the reader opens it.
FOLDED_TAGS = frozenset({"hide-input", "hide-cell", "remove-input", "remove-cell"})


def page_cells(chapter: Path) -> tuple[list[str], list[str]]:
    """The exported code cells of one chapter page: those the book shows, and those it
    folds (or removes), each as the source the reader sees."""
    import jupytext

    from tools.tangle import cell_target

    shown: list[str] = []
    folded: list[str] = []
    for cell in jupytext.read(chapter).cells:
        if cell.cell_type != "code":
            continue
        tags = list(cell.metadata.get("tags", []))
        if cell_target(tags, "page") is None:
            continue
        (folded if FOLDED_TAGS & set(tags) else shown).append(cell.source)
    return shown, folded


def measure_source(name: str, source: str) -> Share:
    """:func:`measure` for a piece of source rather than a file."""
    tree = ast.parse(source)
    code = _code_lines(source, tree)
    nonblank = sum(1 for line in source.splitlines() if line.strip())
    return Share(name, len(code), len(_check_lines(tree) & code), nonblank)


def measure_page(chapter: Path) -> Share:
    """What a reader of the rendered page has to read past: the check lines of the
    exported code the page shows (its folded cells left out). Its
    :attr:`Share.percent_of_code` (checks per code line, docstrings and comments out)
    is the page's measure, the stricter of the two."""
    shown, _ = page_cells(chapter)
    shares = [measure_source(chapter.stem, cell) for cell in shown]
    return Share(
        chapter.stem,
        sum(s.code_lines for s in shares),
        sum(s.check_lines for s in shares),
        sum(s.nonblank_lines for s in shares),
    )


def chapter_pages() -> list[Path]:
    """Every chapter page that exports code to ``lib``."""
    from tools.tangle import chapter_files, export_cells_by_module

    return [p for p in chapter_files() if export_cells_by_module(p)]


def pages_main(max_page: float | None) -> int:
    print(f"{'page':<22}{'shown':>7}{'checks':>8}{'of shown':>10}{'folded':>8}")
    limit = "" if max_page is None else f" (limit {max_page} %)"
    failed = False
    for chapter in chapter_pages():
        share = measure_page(chapter)
        _, folded = page_cells(chapter)
        folded_lines = sum(
            1 for cell in folded for line in cell.splitlines() if line.strip()
        )
        print(
            f"{share.module:<22}{share.code_lines:>7}{share.check_lines:>8}"
            f"{share.percent_of_code:>9.1f}%{folded_lines:>8}"
        )
        if max_page is not None and share.percent_of_code > max_page:
            failed = True
    print("shown: code lines (docstrings and comments out) of the exported cells the")
    print("page shows, folded cells left out; checks: argument-check lines among")
    print(f"them; folded: non-blank lines of the folded exported cells{limit}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-module", type=float, default=None)
    parser.add_argument("--max-total", type=float, default=None)
    parser.add_argument(
        "--pages",
        action="store_true",
        help="per chapter page: the share of the exported code the book shows",
    )
    parser.add_argument("--max-page", type=float, default=None)
    args = parser.parse_args(argv)
    if args.pages:
        return pages_main(args.max_page)
    shares = [measure(p) for p in measured_modules()]
    print(
        f"{'module':<14}{'lines':>7}{'code':>7}{'checks':>8}{'of lines':>10}{'of code':>9}"
    )

    def row(share: Share) -> str:
        return (
            f"{share.module:<14}{share.nonblank_lines:>7}{share.code_lines:>7}"
            f"{share.check_lines:>8}{share.percent:>9.1f}%{share.percent_of_code:>8.1f}%"
        )

    for share in shares:
        print(row(share))
    whole = total(shares)
    print(row(whole) + "  (every module above, _checks.py and utils.py included)")
    print("lines: non-blank lines; code: without docstrings and comments; the limits")
    print("apply to 'of code' (checks per code line); a chapter's module is held to")
    print("--max-module, the total to --max-total")
    failed = False
    chapters = {p.stem for p in chapter_modules()}
    if args.max_module is not None:
        for share in shares:
            if share.module in chapters and share.percent_of_code > args.max_module:
                print(
                    f"{share.module}: {share.percent_of_code:.1f}% > {args.max_module}%"
                )
                failed = True
    if args.max_total is not None and whole.percent_of_code > args.max_total:
        print(f"total: {whole.percent_of_code:.1f}% > {args.max_total}%")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
