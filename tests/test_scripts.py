"""The record scripts of book/results/: re-running a record, refusing to record on a CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_rerun_record_runs_the_recorded_command(tmp_path: Path):
    marker = tmp_path / "ran.txt"
    record = tmp_path / "metrics.json"
    code = f"import os; open({str(marker)!r}, 'w').write(os.environ['TFS_MARK'])"
    command = f'TFS_MARK=yes {sys.executable} -c "{code}"'
    record.write_text(json.dumps({"metrics": {}, "command": command}), encoding="utf-8")
    shown = _script("rerun_record.py", str(record), "--print")
    assert shown.returncode == 0 and "-c" in shown.stdout and not marker.exists()
    done = _script("rerun_record.py", str(record))
    assert done.returncode == 0 and marker.read_text() == "yes"


def test_rerun_record_explains_a_bad_record(tmp_path: Path):
    missing = _script("rerun_record.py", str(tmp_path / "nope.json"))
    assert missing.returncode != 0 and "no record at" in missing.stderr
    record = tmp_path / "metrics.json"
    record.write_text(json.dumps({"metrics": {}}), encoding="utf-8")
    no_command = _script("rerun_record.py", str(record))
    assert no_command.returncode != 0 and "has no 'command'" in no_command.stderr


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message a CPU machine gets"
)
def test_gpu_records_refuse_to_run_without_a_gpu():
    done = _script("gpu_records.py", "notebooks")
    assert done.returncode != 0 and "no CUDA GPU here" in done.stderr
