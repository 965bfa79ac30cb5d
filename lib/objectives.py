# This file is generated from chapters/07-3-objectives.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/07-3-objectives.md, section "7.3 How each family is trained".
"""Training objectives of the model families (chapter 7 of the course):
batch builders.

Each builder turns a batch of token ids into what a training step needs: the
ids the model reads, the ids it must predict and, for the prefix LM, the
attention mask. The loss is chapter 8's. Positions that carry no loss hold
``IGNORE_INDEX`` (-100, the value ``torch.nn.functional.cross_entropy``
skips by default).

* :func:`causal_lm_batch`: inputs and targets shifted by one (GPT).
* :func:`masked_lm_batch`: 15 % of the tokens chosen; 80/10/10
  mask/random/kept (BERT).
* :func:`random_spans`, :func:`span_corruption_batch`: spans become
  sentinels (T5).
* :func:`prefix_lm_mask`, :func:`prefix_lm_batch`: a bidirectional prefix,
  then causal.

Shapes: ``token_ids`` is ``(batch seq)``, right-padded with ``pad_id`` when
the rows differ in length. Every builder that draws random numbers takes a
``torch.Generator``: one seed, one batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import torch
from einops import rearrange, repeat
from torch.nn.utils.rnn import pad_sequence

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "IGNORE_INDEX",
    "ObjectiveBatch",
    "causal_lm_batch",
    "masked_lm_batch",
    "random_spans",
    "span_corruption_batch",
    "prefix_lm_mask",
    "prefix_lm_batch",
]


IGNORE_INDEX = -100  # a target that carries no loss


@dataclass(frozen=True)
class ObjectiveBatch:
    """One training batch.

    * ``inputs`` ``(batch in_seq)``: the ids the model (for T5, the encoder)
      reads.
    * ``targets`` ``(batch out_seq)``: the id to predict at each position;
      ``IGNORE_INDEX`` where there is no loss.
    * ``mask``: a boolean attention mask ``(batch 1 q_pos k_pos)``, True =
      may attend, when the objective needs its own (the prefix LM); else
      ``None``.
    * ``decoder_inputs`` ``(batch out_seq)``: for an encoder-decoder, the
      targets shifted right behind the decoder's start token (teacher
      forcing); else ``None``.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor | None = None
    decoder_inputs: torch.Tensor | None = None


# From chapters/07-3-objectives.md, section "7.3 How each family is trained".
# in (0, 1)
_FRACTION = dict(low=0.0, high=1.0, low_open=True, high_open=True)


_SEED_HINT = "for example torch.Generator().manual_seed(0)"
_IDS_HINT = "for one sequence, pass ids[None]"


def _check_token_ids(token_ids, pad_id, *generator, vocab_size=None) -> torch.Tensor:
    """Check ids ``(batch seq)`` (in ``0..vocab_size-1``), ``pad_id`` (and
    the generator, when one is passed); return each row's real length
    ``(batch,)``."""
    check.tensor("token_ids", token_ids, "batch seq", integer=True, hint=_IDS_HINT)
    # the builders that draw random numbers pass theirs
    for given in generator:
        check.instance("generator", given, torch.Generator, hint=_SEED_HINT)
    hint = "encode the text with the model's tokenizer"
    check.ids_in_range("token_ids", token_ids, vocab_size, hint=hint)
    return _lengths(token_ids, pad_id)


def _lengths(token_ids: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """Each row's real length ``(batch,)``; a row padded on the left is an
    error."""
    batch, seq = token_ids.shape
    if pad_id is None:
        return torch.full((batch,), seq, dtype=torch.long, device=token_ids.device)
    is_real = token_ids != check.int_at_least("pad_id", pad_id, 0)
    lengths = is_real.sum(dim=1)
    wrong = (is_real != _real_positions(lengths, seq)).any(dim=1)
    if bool(wrong.any()):
        first = int(wrong.nonzero()[0])
        row = f"row {first} has a pad token before a real one"
        raise ValueError(f"token_ids must be right-padded with pad_id={pad_id}: {row}")
    return lengths


def _check_id_list(name, ids, *, high=None, avoid=(), distinct=False) -> list[int]:
    """A non-empty list of ids in ``0..high-1``, none in ``avoid`` (none
    repeated)."""
    values = [check.integer(f"{name}[{k}]", i) for k, i in enumerate(ids)]
    fine = values and all(0 <= i < (high or i + 1) and i not in avoid for i in values)
    if not fine or (distinct and len({*values}) < len(values)):
        rule = f"{'distinct ' * distinct}ids in 0..{high or 'inf'} (excluded), none of"
        raise ValueError(f"{name} must be a non-empty list of {rule} {sorted(avoid)}")
    return values


def _real_positions(lengths: torch.Tensor, seq: int) -> torch.Tensor:
    """``(batch seq)`` boolean: True at the first ``lengths[b]`` positions
    of row b."""
    positions = torch.arange(seq, device=lengths.device)
    return rearrange(positions, "seq -> 1 seq") < rearrange(lengths, "batch -> batch 1")


# From chapters/07-3-objectives.md, section "Causal language modelling (GPT)".
def _check_causal_lm(token_ids, pad_id) -> torch.Tensor:
    """``causal_lm_batch``'s ids and ``pad_id``; each row's real length."""
    lengths = _check_token_ids(token_ids, pad_id)
    hint = "causal LM needs >= 2 tokens"
    check.int_at_least("token_ids.shape[1]", token_ids.shape[1], 2, hint=hint)
    return lengths


# From chapters/07-3-objectives.md, section "Causal language modelling (GPT)".
def causal_lm_batch(
    token_ids: torch.Tensor, *, pad_id: int | None = None
) -> ObjectiveBatch:
    """Next-token prediction: ``inputs = ids[:, :-1]``, ``targets = ids[:,
    1:]``.

    Shapes: ``token_ids`` ``(batch seq)`` (right-padded with ``pad_id``, if
    given) -> ``inputs`` and ``targets`` ``(batch seq-1)``; targets that are
    padding hold ``IGNORE_INDEX``. No mask: the model applies its own causal
    mask. Nothing is random, so no generator.
    """
    lengths = _check_causal_lm(token_ids, pad_id)
    is_real = _real_positions(lengths, token_ids.shape[1])
    targets = token_ids[:, 1:].masked_fill(~is_real[:, 1:], IGNORE_INDEX)
    return ObjectiveBatch(inputs=token_ids[:, :-1].clone(), targets=targets)


# From chapters/07-3-objectives.md, section "Masked language modelling (BERT)".
def _check_masked_lm(
    token_ids,
    *,
    mask_id,
    vocab_size,
    generator,
    special_ids=(),
    pad_id=None,
    mask_prob=0.15,
    replace_ids=None,
) -> None:
    """``masked_lm_batch``'s arguments: ids in the vocabulary, special and
    replacement ids that are, replacements that are not special."""
    check.positive_int("vocab_size", vocab_size)
    _check_token_ids(token_ids, pad_id, generator, vocab_size=vocab_size)
    check.int_in_range("mask_id", mask_id, 0, vocab_size - 1)
    check.finite_float("mask_prob", mask_prob, **_FRACTION)
    special = {*_check_id_list("special_ids", [*special_ids, mask_id], high=vocab_size)}
    special |= set() if pad_id is None else {pad_id}
    if replace_ids is None:  # the default: none left is an error too
        replace_ids = [i for i in range(vocab_size) if i not in special]
    _check_id_list("replace_ids", replace_ids, high=vocab_size, avoid=special)


# From chapters/07-3-objectives.md, section "Masked language modelling (BERT)".
@check.front_door(_check_masked_lm)
def masked_lm_batch(
    token_ids: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator,
    special_ids: Sequence[int] = (),
    pad_id: int | None = None,
    mask_prob: float = 0.15,
    replace_ids: Sequence[int] | torch.Tensor | None = None,
) -> ObjectiveBatch:
    """BERT's masked LM: choose tokens, corrupt them 80/10/10, predict the
    originals.

    In each row, ``round(mask_prob * n)`` (at least 1) of the ``n`` eligible
    tokens are chosen uniformly; eligible means neither padding nor in
    ``special_ids`` (``mask_id`` and ``pad_id`` are always special). A
    chosen token becomes ``mask_id`` with probability 0.8, a random id from
    ``replace_ids`` (default: every id in ``0..vocab_size-1`` that is not
    special) with probability 0.1, and stays as it is with probability 0.1.

    Shapes: ``token_ids`` ``(batch seq)`` -> ``inputs`` ``(batch seq)`` (the
    corrupted ids) and ``targets`` ``(batch seq)``: the original id at
    chosen positions, ``IGNORE_INDEX`` elsewhere.
    """
    lengths = _lengths(token_ids, pad_id)
    device = token_ids.device
    special = {int(i) for i in (*special_ids, mask_id)}
    special |= set() if pad_id is None else {int(pad_id)}
    special_t = torch.tensor(sorted(special), device=device)
    if replace_ids is None:  # every ordinary id of the vocabulary
        replace_ids = [i for i in range(vocab_size) if i not in special]
    replace_ids = torch.as_tensor(replace_ids, dtype=torch.long)
    replace_ids = replace_ids.to(device)

    shape = token_ids.shape
    is_special = torch.isin(token_ids, special_t)
    eligible = _real_positions(lengths, shape[1]) & ~is_special
    n_eligible = eligible.sum(dim=1)
    n_chosen = (n_eligible * mask_prob).round().long().clamp(min=1).minimum(n_eligible)
    # Each eligible position gets a random key in [0, 1); the rest get 2 and
    # sort last.
    keys = torch.rand(shape, generator=generator).to(device).masked_fill(~eligible, 2.0)
    # rank of each position's key in its row
    rank = keys.argsort(dim=1).argsort(dim=1)
    chosen = rank < rearrange(n_chosen, "batch -> batch 1")

    # one draw per token
    action = torch.rand(shape, generator=generator).to(device)
    picks = torch.randint(len(replace_ids), shape, generator=generator)
    picks = picks.to(device)
    inputs = token_ids.masked_fill(chosen & (action < 0.8), mask_id)
    use_random = chosen & (action >= 0.8) & (action < 0.9)
    inputs = torch.where(use_random, replace_ids[picks], inputs)
    targets = token_ids.masked_fill(~chosen, IGNORE_INDEX)
    return ObjectiveBatch(inputs=inputs, targets=targets)


# From chapters/07-3-objectives.md, section "Span corruption (T5)".
def _check_random_spans(
    length, *, generator, noise_density=0.15, mean_span_length=3.0
) -> None:
    check.int_at_least("length", length, 0)
    check.instance("generator", generator, torch.Generator, hint=_SEED_HINT)
    check.finite_float("noise_density", noise_density, **_FRACTION)
    check.finite_float("mean_span_length", mean_span_length, low=1)


# From chapters/07-3-objectives.md, section "Span corruption (T5)".
def _random_composition(total: int, parts: int, generator: torch.Generator) -> list:
    """``parts`` positive ints summing to ``total``, uniform over all such
    lists."""
    cuts = torch.randperm(total - 1, generator=generator)[: parts - 1] + 1
    bounds = [0, *sorted(cuts.tolist()), total]
    return [right - left for left, right in pairwise(bounds)]


@check.front_door(_check_random_spans)
def random_spans(
    length: int,
    *,
    generator: torch.Generator,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
) -> list[tuple[int, int]]:
    """T5's noise layout for one sequence: ``[(start, end), ...]``,
    half-open, in order.

    ``round(noise_density * length)`` tokens (at least 1, at most ``length -
    1``) are noise, in ``round(noise / mean_span_length)`` spans (at least
    1); consecutive spans are separated by at least one kept token. A
    sequence shorter than 2 gets no span.
    """
    if length < 2:
        return []
    n_noise = min(max(round(length * noise_density), 1), length - 1)
    n_spans = max(1, round(n_noise / mean_span_length))
    # kept tokens separate spans
    n_spans = min(n_spans, n_noise, length - n_noise + 1)
    noise_lengths = _random_composition(n_noise, n_spans, generator)
    # k+1 runs of kept tokens, the first and last possibly empty: a
    # composition of (kept + 2) into positive parts, minus one at both ends.
    kept_lengths = _random_composition(length - n_noise + 2, n_spans + 1, generator)
    kept_lengths[0] -= 1
    kept_lengths[-1] -= 1
    spans, position = [], 0
    for kept, noise in zip(kept_lengths, noise_lengths):
        position += kept
        spans.append((position, position + noise))
        position += noise
    return spans


# From chapters/07-3-objectives.md, section "Span corruption (T5)".
def _check_span_corruption(
    token_ids,
    *,
    sentinel_ids,
    pad_id,
    vocab_size,
    generator,
    eos_id=None,
    noise_density=0.15,
    mean_span_length=3.0,
    decoder_start_id=None,
) -> None:
    """``span_corruption_batch``'s arguments, in the order it reads them."""
    vocab_size = check.int_at_least("vocab_size", vocab_size, 1)
    below = dict(high=vocab_size - 1)
    pad_id = check.int_in_range("pad_id", pad_id, 0, **below)
    lengths = _check_token_ids(token_ids, pad_id, generator, vocab_size=vocab_size)
    check.finite_float("noise_density", noise_density, **_FRACTION)
    check.finite_float("mean_span_length", mean_span_length, low=1)
    extra = []
    if eos_id is not None:
        extra = [check.int_in_range("eos_id", eos_id, 0, **below)]
        if eos_id == pad_id:  # every input would end in "padding"
            raise ValueError(
                f"eos_id and pad_id are both {pad_id}: every input would "
                "end in what reads as padding; give </s> its own id"
            )
    avoid = {pad_id, *extra}  # a sentinel must mean only "a span was here"
    sentinels = _check_id_list(
        "sentinel_ids", sentinel_ids, high=vocab_size, avoid=avoid, distinct=True
    )
    sentinels = torch.tensor(sentinels, device=token_ids.device)
    is_real = _real_positions(lengths, token_ids.shape[1])
    if (torch.isin(token_ids, sentinels) & is_real).any():
        raise ValueError("token_ids hold a sentinel id; text must not hold sentinels")
    start_id = pad_id if decoder_start_id is None else decoder_start_id
    check.int_in_range("decoder_start_id", start_id, 0, **below)


def _check_enough_sentinels(length: int, spans: list, sentinels) -> None:
    """One sentinel per span of a row, and one more to end its target."""
    if len(spans) + 1 > len(sentinels):
        needs = f"{length} tokens get {len(spans)} spans and needs "
        needs += f"{len(spans) + 1} sentinel ids"
        raise ValueError(f"{needs}, sentinel_ids has {len(sentinels)}")


# From chapters/07-3-objectives.md, section "Span corruption (T5)".
@check.front_door(_check_span_corruption)
def span_corruption_batch(
    token_ids: torch.Tensor,
    *,
    sentinel_ids: Sequence[int],
    pad_id: int,
    vocab_size: int,
    generator: torch.Generator,
    eos_id: int | None = None,
    noise_density: float = 0.15,
    mean_span_length: float = 3.0,
    decoder_start_id: int | None = None,
) -> ObjectiveBatch:
    """T5's span corruption: spans of the input become sentinels, predicted
    in order.

    For each row, :func:`random_spans` lays out the noise over its real
    tokens; span ``i`` is replaced by ``sentinel_ids[i]`` in the input, and
    the target is ``sentinel_0 span_0 sentinel_1 span_1 ... sentinel_k``
    (``k`` spans, then one more sentinel), with ``eos_id`` appended to both
    input and target when given.

    Shapes: ``token_ids`` ``(batch seq)``, right-padded with ``pad_id`` ->
    ``inputs`` ``(batch in_seq)`` padded with ``pad_id``; ``targets``
    ``(batch out_seq)`` padded with ``IGNORE_INDEX``; ``decoder_inputs``
    ``(batch out_seq)``: ``decoder_start_id`` (default ``pad_id``) then the
    targets but the last, padded with ``pad_id``. Every id (the text's, the
    sentinels, ``pad_id``, ``eos_id``, ``decoder_start_id``) must be below
    ``vocab_size``, the model's, so that a bad id is refused here rather
    than deep inside the model's embedding.
    """
    lengths = _lengths(token_ids, pad_id)
    device = token_ids.device
    sentinels = torch.as_tensor(sentinel_ids, dtype=torch.long).to(device)
    extra = [] if eos_id is None else [eos_id]
    extra = torch.tensor(extra, dtype=torch.long, device=device)
    start_id = pad_id if decoder_start_id is None else decoder_start_id
    densities = dict(noise_density=noise_density, mean_span_length=mean_span_length)

    encoder_rows, target_rows = [], []
    for row, length in zip(token_ids, lengths.tolist()):
        spans = random_spans(length, generator=generator, **densities)
        _check_enough_sentinels(length, spans, sentinels)
        encoder_pieces, target_pieces, kept_from = [], [], 0
        for i, (start, end) in enumerate(spans):
            encoder_pieces += [row[kept_from:start], sentinels[i : i + 1]]
            target_pieces += [sentinels[i : i + 1], row[start:end]]
            kept_from = end
        encoder_pieces += [row[kept_from:length], extra]
        target_pieces += [sentinels[len(spans) : len(spans) + 1], extra]
        encoder_rows.append(torch.cat(encoder_pieces))
        target_rows.append(torch.cat(target_pieces))

    inputs = pad_sequence(encoder_rows, batch_first=True, padding_value=pad_id)
    targets = pad_sequence(target_rows, batch_first=True, padding_value=IGNORE_INDEX)
    start = torch.full_like(targets[:, :1], start_id)
    decoder_inputs = torch.cat([start, targets[:, :-1]], dim=1)
    decoder_inputs = decoder_inputs.masked_fill(decoder_inputs == IGNORE_INDEX, pad_id)
    return ObjectiveBatch(inputs=inputs, targets=targets, decoder_inputs=decoder_inputs)


# From chapters/07-3-objectives.md, section "Prefix language modelling".
def prefix_lm_mask(
    prefix_lengths: torch.Tensor | Sequence[int],
    seq_len: int,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean prefix-LM mask ``(batch 1 q_pos k_pos)``, True = may attend.

    Query ``i`` of row ``b`` may see key ``j`` iff ``j <= i`` or ``j <
    prefix_lengths[b]``: bidirectional over the prefix, causal after it. A
    prefix of 0 gives the causal mask, one of ``seq_len`` the full
    (bidirectional) mask. The result broadcasts over heads and can be passed
    as ``mask`` to ``lib.attention``.
    """
    check.int_at_least("seq_len", seq_len, 0)
    prefix = torch.as_tensor(prefix_lengths, device=device)
    # [] would be float
    prefix = prefix if prefix.numel() else prefix.long()
    check.tensor("prefix_lengths", prefix, "batch", integer=True)
    hint = "each prefix length must lie in 0..seq_len"
    check.ids_in_range("prefix_lengths", prefix, seq_len + 1, hint=hint)
    positions = torch.arange(seq_len, device=prefix.device)
    keys = rearrange(positions, "k_pos -> 1 1 k_pos")
    queries = rearrange(positions, "q_pos -> 1 q_pos 1")
    in_prefix = keys < rearrange(prefix, "batch -> batch 1 1")
    mask = (keys <= queries) | in_prefix  # causal, or a key in the prefix
    return rearrange(mask, "batch q_pos k_pos -> batch 1 q_pos k_pos")


# From chapters/07-3-objectives.md, section "Prefix language modelling".
def _check_prefix_lm(token_ids, pad_id, generator) -> torch.Tensor:
    """``prefix_lm_batch``'s arguments; each row's real length."""
    lengths = _check_token_ids(token_ids, pad_id, generator)
    if token_ids.shape[0]:
        hint = "prefix LM needs >= 2 real tokens per row"
        shortest = int(lengths.min())
        check.int_at_least("the shortest row's length", shortest, 2, hint=hint)
    return lengths


# From chapters/07-3-objectives.md, section "Prefix language modelling".
def prefix_lm_batch(
    token_ids: torch.Tensor, *, generator: torch.Generator, pad_id: int | None = None
) -> ObjectiveBatch:
    """Prefix LM: a random bidirectional prefix, then next-token prediction.

    Each row of ``n`` real tokens gets a prefix length ``P`` drawn uniformly
    from ``1..n-1``. Shapes: ``token_ids`` ``(batch seq)`` -> ``inputs`` and
    ``targets`` ``(batch seq-1)``, as in :func:`causal_lm_batch` but with
    ``IGNORE_INDEX`` at the targets inside the prefix (positions ``< P-1``),
    and ``mask`` ``(batch 1 seq-1 seq-1)``: :func:`prefix_lm_mask` without
    the padding keys.
    """
    lengths = _check_prefix_lm(token_ids, pad_id, generator)
    draws = torch.rand(token_ids.shape[0], generator=generator)
    draws = draws.to(lengths.device)
    prefix = 1 + (draws * (lengths - 1)).long()  # uniform in 1..n-1
    seq = token_ids.shape[1] - 1
    positions = rearrange(torch.arange(seq, device=lengths.device), "seq -> 1 seq")
    no_loss = (positions < rearrange(prefix - 1, "batch -> batch 1")) | (
        positions >= rearrange(lengths - 1, "batch -> batch 1")
    )
    targets = token_ids[:, 1:].masked_fill(no_loss, IGNORE_INDEX)
    real = _real_positions(lengths, seq)
    key_is_real = repeat(real, "batch k_pos -> batch 1 1 k_pos")
    mask = prefix_lm_mask(prefix, seq) & key_is_real
    return ObjectiveBatch(inputs=token_ids[:, :-1].clone(), targets=targets, mask=mask)
