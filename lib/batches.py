# This file is generated from chapters/08-1-training.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-1-training.md, section "The training loop".
"""Batches for training (chapter 8 of the course).

A batch (``Batch``) is a dict of tensors whose first axis is ``batch``:
``inputs`` ``(batch seq)``, ``targets`` (``IGNORE_INDEX`` where there is no
loss), optionally ``mask`` ``(batch seq)`` (True for real tokens) and, for
an encoder-decoder, ``decoder_inputs``. :func:`as_batch` makes one from an
``ObjectiveBatch``; :func:`lm_batches` gives the batch of any step from a
token stream (random windows that depend on the seed and the step only,
drawn from :func:`step_generator`);
:func:`lm_eval_batches` cuts the whole stream into consecutive windows, for
a final evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

import torch
from einops import rearrange

from lib import _checks as check
from lib.objectives import ObjectiveBatch, causal_lm_batch

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = ["Batch", "as_batch", "step_generator", "lm_batches", "lm_eval_batches"]


Batch = dict[str, torch.Tensor]


def as_batch(
    batch: ObjectiveBatch | Mapping[str, torch.Tensor], **more: torch.Tensor
) -> Batch:
    """The tensors of an ``ObjectiveBatch`` (or a dict) as a dict, with
    ``more``."""
    check.instance("batch", batch, (ObjectiveBatch, Mapping), what="a batch dict")
    if isinstance(batch, ObjectiveBatch):
        items = {f.name: getattr(batch, f.name) for f in fields(batch)}
    else:
        items = dict(batch)
    items = {k: v for k, v in {**items, **more}.items() if v is not None}
    for name, value in items.items():
        check.tensor(name, value, owner="as_batch")
    return items


def step_generator(seed: int, step: int) -> torch.Generator:
    """A new generator for the batch of ``step``: its draws depend on
    ``(seed, step)`` only, so any process, resumed or not, draws the same
    batch for the same step. :func:`lm_batches` draws its windows and its
    objective's random choices from it; a batch builder of one's own (as
    :mod:`lib.runs`' pairs of sentences) can do the same."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def lm_batches(
    tokens: torch.Tensor | list[int],
    batch_size: int,
    seq_len: int,
    *,
    seed: int = 0,
    objective: Callable[[torch.Tensor, torch.Generator], Any] | None = None,
) -> Callable[[int], Batch]:
    """``step -> batch`` of ``batch_size`` random windows of ``seq_len + 1``
    tokens.

    ``objective(windows, generator)`` turns the windows ``(batch
    seq_len+1)`` into a batch (an ``ObjectiveBatch`` or a dict); the
    default, ``causal_lm_batch``, gives ``inputs`` and ``targets`` ``(batch
    seq_len)``. The windows and the objective's random choices depend on
    ``(seed, step)`` only.
    """
    tokens, objective = _token_stream(tokens, seq_len, batch_size, seed, objective)
    offsets = torch.arange(seq_len + 1)

    def batch_at(step: int) -> Batch:
        generator = step_generator(seed, step)
        n_starts = len(tokens) - seq_len
        starts = torch.randint(0, n_starts, (batch_size,), generator=generator)
        windows = tokens[rearrange(starts, "batch -> batch 1") + offsets]
        return as_batch(objective(windows, generator))

    return batch_at


def lm_eval_batches(
    tokens: torch.Tensor | list[int],
    batch_size: int,
    seq_len: int,
    *,
    seed: int = 0,
    objective: Callable[[torch.Tensor, torch.Generator], Any] | None = None,
) -> list[Batch]:
    """The whole stream as consecutive windows (each token predicted once),
    in batches: what a final, honest evaluation uses. Arguments as
    :func:`lm_batches`."""
    tokens, objective = _token_stream(tokens, seq_len, batch_size, seed, objective)
    starts = torch.arange((len(tokens) - 1) // seq_len) * seq_len
    positions = rearrange(starts, "w -> w 1") + torch.arange(seq_len + 1)
    windows = tokens[positions]
    chunks = enumerate(windows.split(batch_size))
    return [as_batch(objective(chunk, step_generator(seed, i))) for i, chunk in chunks]


# From chapters/08-1-training.md, section "The training loop".
def _token_stream(tokens, seq_len, batch_size, seed, objective) -> tuple[Any, Any]:
    """The checked arguments of :func:`lm_batches`: the tokens as one long
    tensor, and the objective (``causal_lm_batch`` by default)."""
    if isinstance(tokens, str | bytes):
        raise TypeError(
            "tokens must be token ids, got text: encode it first, e.g. "
            "lm_batches(tokenizer.encode(text), ...)"
        )
    check.positive_ints(batch_size=batch_size, seq_len=seq_len)
    check.int_at_least("seed", seed, 0)
    if objective is not None:
        hint = "(windows, generator) -> batch"
        check.function("objective", objective, hint=hint)
    if isinstance(tokens, torch.Tensor) and tokens.is_floating_point():
        raise TypeError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    tokens = torch.as_tensor(tokens, dtype=torch.long)
    check.tensor("tokens", tokens, "n", hint="one stream of ids")
    if len(tokens) < seq_len + 1:  # a context and the token after it
        n, window = len(tokens), f"seq_len + 1 = {seq_len + 1}"
        raise ValueError(f"it holds {n} tokens, fewer than one window of {window}")
    return tokens, objective or (lambda windows, _: causal_lm_batch(windows))
