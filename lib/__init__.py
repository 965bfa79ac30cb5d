"""Transformers from Scratch: the library the course's chapters build.

Each module is generated from the chapter that explains it (``tools/tangle.py``):

* :mod:`lib.tokenizer` (chapter 1): characters and byte-level BPE.
* :mod:`lib.embeddings` (chapter 2): token embeddings, the un-embedding, weight tying.
* :mod:`lib.positions` (chapter 3): sinusoidal, learned, RoPE, ALiBi, T5 relative buckets.
* :mod:`lib.attention` (chapter 4): masks, scaled dot-product and multi-head attention, KV cache.
* :mod:`lib.ffn` (chapter 5): position-wise and gated feed-forward networks.
* :mod:`lib.norms` (chapter 6): LayerNorm, RMSNorm, pre-LN and post-LN residual blocks.
* :mod:`lib.models`, :mod:`lib.hf_weights`, :mod:`lib.objectives`, :mod:`lib.generation`
  (chapter 7): the model families, loading reference weights, the training objectives,
  decoding; :mod:`lib.model_file` (chapter 7): one file for a trained model (its kind,
  configuration, weights, tokenizer), which training checkpoints hold too, and
  ``LoadedModel``, what every loader returns; :mod:`lib.pretrained` (chapter 7):
  published weights from the Hugging Face hub in our classes (random weights of the same
  configuration offline), and the checkpoints the course ships.
* :mod:`lib.training` (chapter 8): loss, optimiser, schedules, checkpoints, the training
  loop; :mod:`lib.batches` (chapter 8): batches of token windows;
  :mod:`lib.efficiency` (chapter 8): activation checkpointing, FLOPs, GPU time,
  several GPUs;
  :mod:`lib.runs` (chapter 8): the chapter's GPT, BERT and T5 runs (``python -m lib.runs``);
  :mod:`lib.shipped` (chapter 8): their CPU sizes for the models the course ships.
  :mod:`lib.ledger` (chapter 8): Muon, warm-up-stable-decay, z-loss and the ledger of
  training choices.
* :mod:`lib.flash` (chapter 9): FlashAttention in PyTorch, tile by tile;
  :mod:`lib.flash_triton` (chapter 9): the same as Triton kernels.
* :mod:`lib.vit` (chapter 10): the Vision Transformer; :mod:`lib.vit_training`
  (chapter 10): its training on MNIST (the recipe ``vit_run``) and what it learned.

Hand-written plumbing: :mod:`lib.utils` (profile, device, precision, seeding, plot style),
:mod:`lib.datasets` (shipped data, checked downloads), :mod:`lib.exercises` (checkers) and
``lib._checks`` (the argument checks every module shares).

``import lib`` is cheap: a submodule is imported the first time it is used, so
``lib.tokenizer.BPETokenizer`` works after a bare ``import lib``. A module is listed in
``__all__`` only once its file exists.
"""

from __future__ import annotations

import importlib as _importlib
from pathlib import Path as _Path

__version__ = "0.1.0"

#: Every submodule the course has or will have, in chapter order, then the plumbing.
_SUBMODULES = (
    "tokenizer",
    "embeddings",
    "positions",
    "attention",
    "ffn",
    "norms",
    "models",
    "hf_weights",
    "objectives",
    "generation",
    "model_file",
    "pretrained",
    "training",
    "batches",
    "efficiency",
    "runs",
    "shipped",
    "ledger",
    "flash",
    "flash_triton",
    "vit",
    "vit_training",
    "utils",
    "datasets",
    "exercises",
)


def _exists(name: str) -> bool:
    here = _Path(__file__).resolve().parent
    return (here / f"{name}.py").is_file() or (here / name / "__init__.py").is_file()


__all__ = [name for name in _SUBMODULES if _exists(name)]

#: The names a user reaches for, importable from ``lib`` itself (``from lib import GPT,
#: train``), each from the module that defines it, imported on first use.
_NAMES = {
    "CharTokenizer": "tokenizer",
    "BPETokenizer": "tokenizer",
    "TransformerConfig": "models",
    "GPT": "models",
    "BERT": "models",
    "T5": "models",
    "SequenceClassifier": "models",
    "count_parameters": "models",
    "generate": "generation",
    "beam_search": "generation",
    "translate": "generation",
    "load_model": "model_file",
    "save_model": "model_file",
    "LoadedModel": "model_file",
    "load_pretrained": "pretrained",
    "load_shipped": "pretrained",
    "train": "training",
    "evaluate": "training",
    "make_optimizer": "training",
    "make_scheduler": "training",
    "save_checkpoint": "training",
    "load_checkpoint": "training",
    "ViT": "vit",
    "ViTConfig": "vit",
}


def __getattr__(name: str):
    """Import ``lib.<name>`` on first access (the module is then an ordinary attribute),
    or the object ``name`` of :data:`_NAMES` from its module."""
    if name in _NAMES:
        return getattr(_importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    if name in _SUBMODULES:
        if not _exists(name):
            raise AttributeError(
                f"module 'lib' has no attribute {name!r}: lib/{name}.py does not exist yet "
                f"(the chapter that writes it has not been added); available: {', '.join(__all__)}"
            )
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(
        f"module 'lib' has no attribute {name!r}; its modules are {', '.join(__all__)}"
    )


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_NAMES))
