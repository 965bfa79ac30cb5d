"""Transformers from Scratch: the library the course's chapters build.

Each module is generated from the chapter that explains it (``tools/tangle.py``):

* :mod:`lib.tokenizer` (chapter 1): characters and byte-level BPE.
* :mod:`lib.embeddings` (chapter 2): token embeddings, the un-embedding, weight tying.
* :mod:`lib.positions` (chapter 3): sinusoidal, learned, RoPE, ALiBi, T5 relative buckets.
* :mod:`lib.attention` (chapter 4): masks, scaled dot-product and multi-head attention, KV cache.
* :mod:`lib.ffn` (chapter 5): position-wise and gated feed-forward networks.
* :mod:`lib.norms` (chapter 6): LayerNorm, RMSNorm, pre-LN and post-LN residual blocks.

Hand-written plumbing: :mod:`lib.utils` (profile, device, precision, seeding, plot style),
:mod:`lib.datasets` (shipped data, checked downloads), :mod:`lib.exercises` (checkers).
"""

__version__ = "0.1.0"
