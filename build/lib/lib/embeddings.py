# This file is generated from chapters/02-embeddings.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""Token embeddings and the un-embedding (chapter 2 of the course).

* :class:`TokenEmbedding` maps token ids ``(...)`` to vectors ``(... d_model)``, optionally
  multiplied by ``sqrt(d_model)`` as in the original transformer.
* :class:`Unembedding` maps vectors ``(... d_model)`` to logits ``(... vocab)``, with its own
  matrix or tied to a :class:`TokenEmbedding`'s.
* :func:`init_embedding_` draws an embedding matrix from ``N(0, std^2)``.
* :func:`embedding_param_count` counts the parameters of the embeddings and output layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum
from torch import nn

__all__ = [
    "init_embedding_",
    "TokenEmbedding",
    "Unembedding",
    "embedding_param_count",
]


def _require_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


@torch.no_grad()
def init_embedding_(
    weight: torch.Tensor,
    std: float,
    *,
    padding_idx: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Fill ``weight`` in place from ``N(0, std^2)`` and zero the padding row; return it.

    Shapes: ``weight`` is ``(vocab d_model)``.
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a 2-D tensor (vocab d_model), got {shape}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be floating point, got {weight.dtype}")
    if (
        isinstance(std, bool)
        or not isinstance(std, (int, float))
        or not math.isfinite(std)
        or std < 0
    ):
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    weight.normal_(0.0, float(std), generator=generator)
    if padding_idx is not None:
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, int):
            raise TypeError(f"padding_idx must be an int or None, got {padding_idx!r}")
        if not 0 <= padding_idx < weight.shape[0]:
            raise ValueError(
                f"padding_idx={padding_idx} is outside the vocabulary of {weight.shape[0]} "
                f"tokens (valid ids are 0..{weight.shape[0] - 1})"
            )
        weight[padding_idx].zero_()
    return weight


def _validate_token_ids(token_ids: object, vocab_size: int, owner: str) -> torch.Tensor:
    """Return ``token_ids`` as an int64 or int32 tensor, or raise a clear error."""
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"{owner} takes a tensor of token ids, got {type(token_ids).__name__}")
    if token_ids.dtype == torch.bool or token_ids.is_floating_point() or token_ids.is_complex():
        raise TypeError(
            f"{owner} takes integer token ids, got dtype {token_ids.dtype}; "
            "token ids are indices, convert them with .long() (and check they are whole numbers)"
        )
    if token_ids.dtype not in (torch.int64, torch.int32):
        token_ids = token_ids.long()
    if token_ids.numel() > 0:
        low, high = (int(v) for v in torch.aminmax(token_ids))
        if low < 0:
            raise ValueError(
                f"{owner}: token id {low} is negative; ids must be in 0..{vocab_size - 1}"
            )
        if high >= vocab_size:
            raise ValueError(
                f"{owner}: token id {high} is out of range for vocab_size={vocab_size} "
                f"(the largest valid id is {vocab_size - 1}); was the tokenizer's vocabulary "
                "larger than the model's?"
            )
    return token_ids


class TokenEmbedding(nn.Module):
    """A learned vector per token id: ``(...)`` integer ids to ``(... d_model)`` vectors.

    Args:
        vocab_size: number of rows of the table, ``|V|``.
        d_model: the width of each vector.
        scale: multiply the vectors by ``sqrt(d_model)`` (the original transformer does;
            GPT-style models do not).
        padding_idx: a token whose row starts at zero and never receives a gradient.
        init_std: standard deviation of the ``N(0, std^2)`` initialisation; the default
            ``1/sqrt(d_model)`` gives rows of norm about 1.
        check_ids: check every call's ids are integers in ``0..vocab_size-1``.

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
        self.vocab_size = _require_positive_int("vocab_size", vocab_size)
        self.d_model = _require_positive_int("d_model", d_model)
        if padding_idx is not None and (
            isinstance(padding_idx, bool)
            or not isinstance(padding_idx, int)
            or not 0 <= padding_idx < vocab_size
        ):
            raise ValueError(
                f"padding_idx must be None or an id in 0..{vocab_size - 1}, got {padding_idx!r}"
            )
        self.scale = bool(scale)
        self.padding_idx = padding_idx
        self.init_std = d_model**-0.5 if init_std is None else init_std
        self.check_ids = bool(check_ids)
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init_embedding_(self.weight, self.init_std, padding_idx=self.padding_idx)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``token_ids (...)`` integers -> ``(... d_model)`` vectors."""
        if self.check_ids:
            token_ids = _validate_token_ids(token_ids, self.vocab_size, "TokenEmbedding")
        vectors = F.embedding(token_ids, self.weight, padding_idx=self.padding_idx)
        if self.scale:
            vectors = vectors * math.sqrt(self.d_model)
        return vectors

    def extra_repr(self) -> str:
        extras = f", scale=sqrt({self.d_model})" if self.scale else ""
        if self.padding_idx is not None:
            extras += f", padding_idx={self.padding_idx}"
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}{extras}"


class Unembedding(nn.Module):
    """Scores every token of the vocabulary: ``(... d_model)`` vectors to ``(... vocab)`` logits.

    ``logits = hidden @ weight.T (+ bias)``, with ``weight`` of shape ``(vocab d_model)``.

    Args:
        d_model: the width of the incoming vectors.
        vocab_size: the number of tokens to score.
        tie_to: an embedding (anything with a ``weight`` parameter of shape
            ``(vocab_size, d_model)``, such as :class:`TokenEmbedding`) whose table is reused
            as the output matrix; ``None`` gives the layer a matrix of its own.
        bias: add a learned bias per token.
        init_std: standard deviation of an untied matrix's ``N(0, std^2)`` initialisation;
            default ``1/sqrt(d_model)``; ignored when tied (the table keeps the embedding's).

    Returns logits; apply ``softmax`` (or let ``F.cross_entropy`` do it) for probabilities.
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
        self.d_model = _require_positive_int("d_model", d_model)
        self.vocab_size = _require_positive_int("vocab_size", vocab_size)
        if tie_to is not None:
            tied_weight = getattr(tie_to, "weight", None)
            if not isinstance(tied_weight, nn.Parameter):
                raise TypeError(
                    f"tie_to must be an embedding module with a weight parameter, "
                    f"got {type(tie_to).__name__}"
                )
            if tuple(tied_weight.shape) != (vocab_size, d_model):
                raise ValueError(
                    f"cannot tie: the embedding's weight has shape {tuple(tied_weight.shape)}, "
                    f"but this layer needs (vocab_size, d_model) = ({vocab_size}, {d_model})"
                )
            self.weight = tied_weight  # the same Parameter object: one tensor, two roles
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
            init_embedding_(self.weight, d_model**-0.5 if init_std is None else init_std)
        self.is_tied = tie_to is not None
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if bias else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden (... d_model)`` -> ``logits (... vocab)``."""
        if not isinstance(hidden, torch.Tensor):
            raise TypeError(f"Unembedding takes a tensor, got {type(hidden).__name__}")
        if not hidden.is_floating_point():
            raise TypeError(
                f"Unembedding takes float vectors (... d_model), got dtype {hidden.dtype}; "
                "did you pass token ids? Embed them first."
            )
        if hidden.dim() == 0 or hidden.shape[-1] != self.d_model:
            raise ValueError(
                f"Unembedding expects (... d_model={self.d_model}), got shape {tuple(hidden.shape)}"
            )
        logits = einsum(hidden, self.weight, "... d_model, vocab d_model -> ... vocab")
        if self.bias is not None:
            logits = logits + self.bias
        return logits

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, vocab_size={self.vocab_size}, "
            f"tied={self.is_tied}, bias={self.bias is not None}"
        )


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

    Token table ``vocab_size * d_model``; a second matrix of that size if the output layer
    is not tied; ``n_positions`` learned position vectors and ``n_segment_types`` segment
    vectors of width ``d_model`` (0 for sinusoidal positions or no segments); a bias per
    token if ``output_bias``.
    """
    _require_positive_int("vocab_size", vocab_size)
    _require_positive_int("d_model", d_model)
    for name, value in (("n_positions", n_positions), ("n_segment_types", n_segment_types)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    token_tables = 1 if tied else 2
    return (
        token_tables * vocab_size * d_model
        + (n_positions + n_segment_types) * d_model
        + (vocab_size if output_bias else 0)
    )
