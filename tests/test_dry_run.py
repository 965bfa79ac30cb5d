"""The dry run: a GPU profile's shapes executed on the CPU, loops cut (lib.utils.pick's
``dry=``, assert_trained, ``tasks.py dry``), and what the full profile adds to colab's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tasks
from lib.utils import assert_trained, is_dry, pick

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def dry_colab(monkeypatch):
    monkeypatch.setenv("TFS_PROFILE", "colab")
    monkeypatch.setenv("TFS_DRY", "1")


def test_a_dry_run_cuts_loop_counts_and_keeps_sizes(dry_colab):
    assert is_dry()
    assert pick(smoke=300, full=3_000, dry=2) == 2  # a loop count
    assert pick(smoke=64, full=512) == 512  # a size: the profile's
    assert pick(smoke=64, colab=256, full=512) == 256
    # another profile named explicitly (an estimate for it) is not cut
    assert pick(smoke=300, full=3_000, dry=2, profile="full") == 3_000


def test_without_a_dry_run_dry_values_are_ignored(monkeypatch):
    monkeypatch.setenv("TFS_PROFILE", "colab")
    monkeypatch.delenv("TFS_DRY", raising=False)
    assert not is_dry()
    assert pick(smoke=300, full=3_000, dry=2) == 3_000
    monkeypatch.setenv("TFS_DRY", "0")
    assert pick(smoke=300, full=3_000, dry=2) == 3_000


def test_a_wrong_dry_setting_is_named(monkeypatch):
    monkeypatch.setenv("TFS_DRY", "maybe")
    with pytest.raises(ValueError, match="TFS_DRY='maybe'"):
        is_dry()


def test_assert_trained_asserts_in_a_real_run(monkeypatch):
    monkeypatch.delenv("TFS_DRY", raising=False)
    assert_trained(True, "holds")
    with pytest.raises(AssertionError, match="accuracy above 98"):
        assert_trained(False, "accuracy above 98")


def test_assert_trained_reports_in_a_dry_run(dry_colab, capsys):
    assert_trained(False, "accuracy above 98")
    assert "not checked" in capsys.readouterr().out


def test_the_dry_report_has_one_line_per_chapter(tmp_path):
    report = tmp_path / "dry.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="chapters.07-families.md" '
        'name="07-families.md" time="41.2"/>'
        '<testcase classname="chapters.08-training.md" name="08-training.md" '
        'time="12.0"><failure message="x"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert tasks.dry_report(report, "colab") == [
        "[dry] chapters/07-families (colab): passed in 41 s",
        "[dry] chapters/08-training (colab): FAILED in 12 s",
    ]


def pick_calls() -> list[tuple[str, dict[str, str]]]:
    """Every ``pick(...)`` call (or a local alias of it) with ``smoke=`` and ``full=`` in
    the chapters (lib's generated modules repeat them): ``(chapter, {keyword: source})``."""
    import jupytext

    calls = []
    for path in sorted((ROOT / "chapters").glob("*.md")):
        for cell in jupytext.read(path).cells:
            if cell.cell_type != "code":
                continue
            lines = [
                line
                for line in cell.source.splitlines()
                if not line.lstrip().startswith(("%", "!"))
            ]
            try:
                tree = ast.parse("\n".join(lines))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    keywords = {
                        k.arg: ast.unparse(k.value) for k in node.keywords if k.arg
                    }
                    if {"smoke", "full"} <= keywords.keys():
                        calls.append((path.name, keywords))
    return calls


# Where the full profile chooses another value than colab, in a call without ``dry=``:
# (chapter, colab's value, full's value) and why the colab dry run in CI covers it.
FULL_NOT_COLAB = {
    ("08-3-runs.md", "True", "False"): "every_run: twelve seeds check each warm-up "
    "claim on most runs, not all; `python3 tasks.py dry --profile full` runs it",
    ("08-3-runs.md", "600", "1500"): "GPT steps: cut by the dry run's sizes",
    ("08-3-runs.md", "200", "500"): "GPT eval_every: cut by the dry run's sizes",
    ("08-3-runs.md", "10", "20"): "GPT eval_iters: cut by the dry run's sizes",
    ("08-3-runs.md", "2000", "4000"): "BERT steps: cut by the dry run's sizes",
    ("08-3-runs.md", "1000", "3000"): "T5 steps: cut by the dry run's sizes",
    ("08-3-runs.md", "4096", "16384"): "T5 max_tokens: colab keeps the CPU recipe's "
    "batches for a T4's budget; the full profile's ran in `python3 tasks.py dry "
    "--profile full`",
    # the ledger's GPT at a T4's and at a recent GPU's sizes: `python3 tasks.py dry
    # --profile full chapters/08-5-ledger.md` passed with them (287 s on a CPU)
    ("08-5-ledger.md", "128", "256"): "ledger seq_len: passed the full dry run",
    ("08-5-ledger.md", "256", "384"): "ledger d_model: passed the full dry run",
    ("08-5-ledger.md", "4", "6"): "ledger heads and layers: passed the full dry run",
    ("08-5-ledger.md", "60", "100"): "ledger warm-up: passed the full dry run",
}


def test_full_differs_from_colab_only_in_loops_and_where_listed():
    """The colab dry run in CI executes the full profile's shapes too: `full` chooses
    other values than `colab` only in loop counts (a ``dry=`` value cuts them in every
    dry run) and in the places listed in FULL_NOT_COLAB. A new difference goes into
    that list once ``python3 tasks.py dry --profile full`` has passed with it."""
    calls = pick_calls()
    assert len(calls) > 40  # the chapters' picks were found
    differs = {
        (name, kw["colab"], kw["full"])
        for name, kw in calls
        if "colab" in kw and kw["colab"] != kw["full"] and "dry" not in kw
    }
    assert differs == set(FULL_NOT_COLAB), sorted(differs ^ set(FULL_NOT_COLAB))
