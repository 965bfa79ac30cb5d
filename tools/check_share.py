"""How much of ``lib`` is argument checking: the measure behind CONTRIBUTING's rule.

Counted with the AST, per generated module (and ``lib/_checks.py``):

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
    ``check_`` (and every function of ``lib/_checks.py``).

    python tools/check_share.py            # a table, and the totals
    python tools/check_share.py --max-module 20 --max-total 12   # exit 1 above the limits

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


def _check_lines(tree: ast.AST, whole_module: bool) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if whole_module or _is_checker_name(node.name):
                lines |= _span(node)
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
    checks = _check_lines(tree, whole_module=path.name == "_checks.py") & code
    nonblank = sum(1 for line in source.splitlines() if line.strip())
    return Share(path.stem, len(code), len(checks), nonblank)


def measured_modules() -> list[Path]:
    """The generated modules of ``lib`` and the shared checks."""
    paths = [
        p
        for p in sorted(LIB.glob("*.py"))
        if GENERATED_MARK in p.read_text(encoding="utf-8")[:300]
        or p.name == "_checks.py"
    ]
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-module", type=float, default=None)
    parser.add_argument("--max-total", type=float, default=None)
    args = parser.parse_args(argv)
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
    generated = [s for s in shares if s.module != "_checks"]
    total = Share(
        "total",
        sum(s.code_lines for s in generated),
        sum(s.check_lines for s in generated),
        sum(s.nonblank_lines for s in generated),
    )
    print(row(total) + "  (generated modules; _checks.py not included)")
    print("lines: non-blank lines; code: without docstrings and comments; the limits")
    print("apply to 'of lines' (checks per non-blank line)")
    failed = False
    if args.max_module is not None:
        for share in shares:
            if share.module != "_checks" and share.percent > args.max_module:
                print(f"{share.module}: {share.percent:.1f}% > {args.max_module}%")
                failed = True
    if args.max_total is not None and total.percent > args.max_total:
        print(f"total: {total.percent:.1f}% > {args.max_total}%")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
