# This file is generated from chapters/02-embeddings.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/02-embeddings.md, section "The module".
"""Token embeddings and the un-embedding (chapter 2 of the course).

* :class:`TokenEmbedding` maps token ids ``(...)`` to vectors
  ``(... d_model)``, optionally multiplied by ``sqrt(d_model)`` as in the
  original transformer.
* :class:`Unembedding` maps vectors ``(... d_model)`` to logits
  ``(... vocab)``, with its own matrix or tied to a
  :class:`TokenEmbedding`'s.
* :func:`init_embedding_` draws an embedding matrix from ``N(0, std^2)``.
* :func:`embedding_param_count` counts the parameters of the embeddings and
  output layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = ["init_embedding_", "TokenEmbedding", "Unembedding", "embedding_param_count"]


# From chapters/02-embeddings.md, section "The module".
def _check_init(weight, std, *, padding_idx=None, generator=None) -> None:
    check.tensor("weight", weight, "vocab d_model", floating=True)
    check.finite_float("std", std, low=0)
    if padding_idx is not None:  # checked before the weight is touched
        check.int_in_range("padding_idx", padding_idx, 0, len(weight) - 1)


# From chapters/02-embeddings.md, section "The module".
@check.front_door(_check_init)
@torch.no_grad()
def init_embedding_(
    weight: torch.Tensor,
    std: float,
    *,
    padding_idx: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Fill ``weight`` from ``N(0, std^2)`` in place, zero the padding row;
    return it.

    Shapes: ``weight`` is ``(vocab d_model)``.
    """
    weight.normal_(0.0, std, generator=generator)
    if padding_idx is not None:
        weight[padding_idx].zero_()
    return weight


# From chapters/02-embeddings.md, section "The module".
_IDS_HINT = "token ids are indices: convert them with .long()"
_RANGE_HINT = "was the tokenizer's vocabulary larger than the model's?"
_OWNER = dict(owner="TokenEmbedding")
_AS_IDS = dict(_OWNER, hint=_IDS_HINT)
# for ids out of range
_IN_VOCAB = dict(_OWNER, hint=_RANGE_HINT)


def _check_sizes(owner, vocab_size, d_model, init_std) -> tuple:
    """The checked ``vocab_size``, ``d_model`` and ``init_std`` (``None``
    stays ``None``)."""
    sizes = check.positive_ints(vocab_size=vocab_size, d_model=d_model, owner=owner)
    if init_std is not None:
        init_std = check.finite_float("init_std", init_std, low=0, owner=owner)
    return (*sizes, init_std)


def _check_lookup(embedding, token_ids) -> None:
    check.tensor("token_ids", token_ids, integer=True, **_AS_IDS)
    check.same_device(token_ids=token_ids, weight=embedding.weight, **_OWNER)
    # reads the ids: only on the CPU, where that costs no GPU sync
    if embedding.check_ids and token_ids.device.type == "cpu":
        check.ids_in_range("token_ids", token_ids, embedding.vocab_size, **_IN_VOCAB)


# From chapters/02-embeddings.md, section "The module".
class TokenEmbedding(nn.Module):
    """A learned vector per token id: ``(...)`` int ids to ``(... d_model)``
    vectors.

    Args: vocab_size: number of rows of the table, ``|V|``. d_model: the
        width of each vector. scale: multiply the vectors by
        ``sqrt(d_model)`` (the original transformer does; GPT-style models
        do not). padding_idx: a token whose row starts at zero and never
        receives a gradient. init_std: standard deviation of the
        ``N(0, std^2)`` initialisation; the default ``1/sqrt(d_model)``
        gives rows of norm about 1. check_ids: check every call's ids are in
        ``0..vocab_size-1`` when they are on the CPU (ids on a GPU are not
        read: that would wait for the GPU).

    The table is ``self.weight``, shape ``(vocab d_model)``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        *,
        scale: bool = False,
        padding_idx: int | None = None,
        init_std: float | None = None,
        check_ids: bool = True,
    ) -> None:
        super().__init__()
        args = _check_sizes("TokenEmbedding", vocab_size, d_model, init_std)
        self.vocab_size, self.d_model, init_std = args
        check.booleans(scale=scale, check_ids=check_ids, **_OWNER)
        # init_embedding_ (called by reset_parameters) checks padding_idx
        self.padding_idx = padding_idx
        self.scale, self.check_ids = scale, check_ids
        self.init_std = d_model**-0.5 if init_std is None else init_std
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_embedding_(self.weight, self.init_std, padding_idx=self.padding_idx)

    @check.front_door(_check_lookup)
    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Look up the vectors of ``token_ids``.

        Shapes: ``token_ids`` is ``(...)``, typically ``(batch seq)``, of
        any integer dtype, on the table's device; the result is
        ``(... d_model)`` in the table's dtype.
        """
        # what F.embedding accepts
        if token_ids.dtype not in (torch.int64, torch.int32):
            token_ids = token_ids.long()
        vectors = F.embedding(token_ids, self.weight, padding_idx=self.padding_idx)
        if self.scale:
            vectors = vectors * math.sqrt(self.d_model)
        return vectors

    def extra_repr(self) -> str:
        extras = f", scale=sqrt({self.d_model})" if self.scale else ""
        if self.padding_idx is not None:
            extras += f", padding_idx={self.padding_idx}"
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}{extras}"


# From chapters/02-embeddings.md, section "The un-embedding: from vectors back to tokens".
def _check_tie(tie_to, vocab_size, d_model) -> None:
    """``tie_to`` holds a weight parameter ``(vocab_size, d_model)``."""
    tied_weight, got = (getattr(tie_to, "weight", None), type(tie_to).__name__)
    if not isinstance(tied_weight, nn.Parameter):
        what = "an embedding module (with a weight)"
        raise TypeError(f"tie_to must be {what}, got {got}")
    shape, wanted = tuple(tied_weight.shape), (vocab_size, d_model)
    if shape != wanted:
        got = f"cannot tie: the embedding's weight has shape {shape}"
        raise ValueError(f"{got}, not (vocab_size, d_model) = {wanted}")


_check_hidden = check.layer_forward("... d_model", "weight", name="hidden")


# From chapters/02-embeddings.md, section "The un-embedding: from vectors back to tokens".
class Unembedding(nn.Module):
    """Scores every token: ``(... d_model)`` vectors to ``(... vocab)``
    logits.

    ``logits = hidden @ weight.T (+ bias)``, with ``weight`` of shape
    ``(vocab d_model)``.

    Args: d_model: the width of the incoming vectors. vocab_size: the number
        of tokens to score. tie_to: an embedding (anything with a ``weight``
        parameter of shape ``(vocab_size, d_model)``, such as
        :class:`TokenEmbedding`) whose table is reused as the output matrix;
        ``None`` gives the layer a matrix of its own. bias: add a learned
        bias per token. init_std: standard deviation of an untied matrix's
        ``N(0, std^2)`` initialisation; default ``1/sqrt(d_model)``; ignored
        when tied (the table keeps the embedding's).

    Returns logits; apply ``softmax`` (or let ``F.cross_entropy`` do it) for
    probabilities.
    """

    def __init__(
        self,
        d_model: int,
        vocab_size: int,
        *,
        tie_to: nn.Module | None = None,
        bias: bool = False,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        args = _check_sizes("Unembedding", vocab_size, d_model, init_std)
        vocab_size, d_model, init_std = args
        check.boolean("bias", bias, owner="Unembedding")
        self.d_model, self.vocab_size = d_model, vocab_size
        if tie_to is not None:
            _check_tie(tie_to, vocab_size, d_model)
            # The same Parameter object: one tensor, two roles.
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
            if init_std is None:
                init_std = d_model**-0.5
            init_embedding_(self.weight, init_std)
        self.is_tied = tie_to is not None
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    @check.front_door(_check_hidden)
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Score every token of the vocabulary.

        Shapes: ``hidden`` is ``(... d_model)``, typically
        ``(batch seq d_model)``, in the weight's dtype (any dtype under
        autocast) and on its device; the result is ``(... vocab)``.
        """
        # einsum(hidden, weight, "... d_model, vocab d_model -> ... vocab")
        # plus the bias: PyTorch's fused linear op computes exactly that
        return F.linear(hidden, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, vocab_size={self.vocab_size}, "
            f"tied={self.is_tied}, bias={self.bias is not None}"
        )


# From chapters/02-embeddings.md, section "How many parameters is that?".
def _check_param_count(
    vocab_size,
    d_model,
    *,
    tied=True,
    n_positions=0,
    n_segment_types=0,
    output_bias=False,
) -> None:
    owner = "embedding_param_count()"
    check.positive_ints(vocab_size=vocab_size, d_model=d_model, owner=owner)
    check.int_at_least("n_positions", n_positions, 0, owner=owner)
    check.int_at_least("n_segment_types", n_segment_types, 0, owner=owner)
    check.booleans(tied=tied, output_bias=output_bias, owner=owner)


# From chapters/02-embeddings.md, section "How many parameters is that?".
@check.front_door(_check_param_count)
def embedding_param_count(
    vocab_size: int,
    d_model: int,
    *,
    tied: bool = True,
    n_positions: int = 0,
    n_segment_types: int = 0,
    output_bias: bool = False,
) -> int:
    """Parameters in a model's embeddings and output layer.

    Token table ``vocab_size * d_model``; a second matrix of that size if
    the output layer is not tied; ``n_positions`` learned position vectors
    and ``n_segment_types`` segment vectors of width ``d_model`` (0 for
    sinusoidal positions or no segments); a bias per token if
    ``output_bias``.
    """
    token_tables = 1 if tied else 2
    return (
        token_tables * vocab_size * d_model
        + (n_positions + n_segment_types) * d_model
        + (vocab_size if output_bias else 0)
    )
