"""The README's "Using `lib`" example, run as a reader would run it: the block itself."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_example() -> str:
    """The first ``python`` block of the README's "Using `lib`" section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Using `lib`", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_is_short():
    assert len(readme_example().strip().splitlines()) <= 20


def test_the_readme_example_trains_saves_reloads_and_samples(tmp_path: Path):
    """Train 300 steps, save, reload, sample; then the shipped char-GPT's 300
    characters. It took 12 s on one core of this project's CPU; the timeout only stops a
    hang (no timed assert: a busy machine is not the example's fault)."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", readme_example()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.perf_counter() - began
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"README example: {seconds:.1f} s")
    # two samples, each the prompt and its continuation (100, then 300 characters)
    assert done.stdout.startswith("ROMEO:") and done.stdout.count("ROMEO:") >= 2
    assert len(done.stdout) >= 2 * len("ROMEO:\n") + 100 + 300
    assert (tmp_path / "char-gpt.pt").is_file()
    from lib.model_file import load_model

    saved = load_model(tmp_path / "char-gpt.pt")
    assert saved.kind == "gpt" and saved.tokenizer.vocab_size == 65
