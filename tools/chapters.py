"""The course's chapters, registered in one place.

Each chapter has a number, a title, the part of the book it belongs to, its pages (the
Jupytext sources in ``chapters/``, in reading order: a long chapter is split into pages of
its own, each with its own Colab notebook) and the ``lib`` modules it generates.

What else lists the chapters is checked against this registry by
``tests/test_registry.py``: the files in ``chapters/``, the table of contents
(``_toc.yml``), the API reference (``book/api.md``), ``lib/__init__.py`` (its submodules
and docstring), the README's two tables and CONTRIBUTING's layout. To add a chapter or a
page, add it here first; the test then names every place that still disagrees.

    python tools/chapters.py        # the registry as a table
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chapter:
    number: int
    title: str  # as the Colab table of the README names it
    part: str  # the caption of its part in _toc.yml
    pages: tuple[str, ...]  # sources in chapters/, without ".md", in reading order
    modules: tuple[str, ...]  # the lib modules its export cells write, in order


BLOCKS, LAYER, MODELS = (
    "Building blocks",
    "The transformer layer",
    "Models, training and speed",
)

CHAPTERS: tuple[Chapter, ...] = (
    Chapter(1, "Tokenization", BLOCKS, ("01-tokenizer",), ("tokenizer",)),
    Chapter(2, "Embeddings", BLOCKS, ("02-embeddings",), ("embeddings",)),
    Chapter(3, "Positions", BLOCKS, ("03-positions",), ("positions",)),
    Chapter(4, "Attention", LAYER, ("04-attention",), ("attention",)),
    Chapter(5, "The feed-forward network", LAYER, ("05-ffn",), ("ffn",)),
    Chapter(
        6, "Normalisation and residual connections", LAYER, ("06-norms",), ("norms",)
    ),
    Chapter(
        7,
        "The model families",
        MODELS,
        (
            "07-1-families",
            "07-2-reference",
            "07-3-objectives",
            "07-4-decoding",
            "07-5-pretrained",
        ),
        (
            "models",
            "hf_weights",
            "objectives",
            "generation",
            "model_file",
            "pretrained",
        ),
    ),
    Chapter(
        8,
        "Training",
        MODELS,
        (
            "08-1-training",
            "08-2-efficiency",
            "08-3-runs",
            "08-4-shipped",
            "08-5-ledger",
        ),
        ("training", "batches", "efficiency", "runs", "shipped", "ledger"),
    ),
    Chapter(
        9,
        "FlashAttention",
        MODELS,
        ("09-1-tiling", "09-2-triton"),
        ("flash", "flash_triton"),
    ),
    Chapter(
        10,
        "The Vision Transformer",
        MODELS,
        ("10-1-vit", "10-2-training"),
        ("vit", "vit_training"),
    ),
)

#: The pages slowest to execute in the smoke profile on 2 CPU cores, slowest first (CI,
#: 2026-11-28: 66, 35 and 25 s; every other page under 12 s). The test runner starts
#: them first, so that its two workers finish together (conftest.py).
SLOWEST_PAGES = ("08-3-runs", "07-5-pretrained", "10-2-training")

#: The hand-written modules of lib, after the generated ones in lib/__init__.py.
HAND_WRITTEN = ("utils", "datasets", "exercises")


def pages() -> list[str]:
    """Every page of every chapter, in reading order."""
    return [page for chapter in CHAPTERS for page in chapter.pages]


def modules() -> list[str]:
    """Every generated module, in chapter order."""
    return [module for chapter in CHAPTERS for module in chapter.modules]


def chapter_of_page(page: str) -> Chapter:
    """The chapter a page (``"07-2-reference"``) belongs to."""
    for chapter in CHAPTERS:
        if page in chapter.pages:
            return chapter
    raise KeyError(f"no registered chapter has the page {page!r} (tools/chapters.py)")


if __name__ == "__main__":
    for chapter in CHAPTERS:
        print(
            f"{chapter.number:>2}. {chapter.title:<42} {', '.join(chapter.pages):<24} "
            + ", ".join(f"lib.{m}" for m in chapter.modules)
        )
