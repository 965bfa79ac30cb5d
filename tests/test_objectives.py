"""lib.objectives: the batch builders of the four training objectives."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from lib.attention import causal_mask, scaled_dot_product_attention
from lib.objectives import (
    IGNORE_INDEX,
    causal_lm_batch,
    masked_lm_batch,
    prefix_lm_batch,
    prefix_lm_mask,
    random_spans,
    span_corruption_batch,
)

PAD = 0


def _padded_batch(lengths, vocab=(1, 50), seed=0):
    """Right-padded random ids (batch max_len), real ids in vocab[0]..vocab[1]-1."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(vocab[0], vocab[1], (n,), generator=gen) for n in lengths]
    return pad_sequence(rows, batch_first=True, padding_value=PAD), rows


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- causal LM ----------------------------------------------------------------------


def test_causal_lm_shifts_by_one():
    ids = torch.arange(1, 11).reshape(2, 5)
    batch = causal_lm_batch(ids)
    assert torch.equal(batch.inputs, ids[:, :-1])
    assert torch.equal(batch.targets, ids[:, 1:])
    assert batch.mask is None and batch.decoder_inputs is None


def test_causal_lm_ignores_padding_targets():
    ids, rows = _padded_batch([6, 3, 1])
    batch = causal_lm_batch(ids, pad_id=PAD)
    for b, row in enumerate(rows):
        n = len(row)
        assert torch.equal(batch.targets[b, : n - 1], row[1:])
        assert (batch.targets[b, n - 1 :] == IGNORE_INDEX).all()


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        (torch.arange(5), ValueError, r"shape \(batch seq\).*ids\[None\]"),
        (torch.ones(2, 5), TypeError, "token_ids must be an integer tensor"),
        (torch.ones(2, 1, dtype=torch.long), ValueError, ">= 2 tokens"),
        (torch.tensor([[-1, 2, 3]]), ValueError, ">= 0"),
        (torch.tensor([[PAD, 2, 3]]), ValueError, "right-padded.*row 0"),
    ],
)
def test_causal_lm_bad_input(ids, error, match):
    with pytest.raises(error, match=match):
        causal_lm_batch(ids, pad_id=PAD)


# -- masked LM ----------------------------------------------------------------------

MASK, CLS, SEP, VOCAB = 1, 2, 3, 1000


def _mlm(ids, seed=0, **kwargs):
    options = dict(mask_id=MASK, vocab_size=VOCAB, special_ids=[CLS, SEP], pad_id=PAD)
    options.update(kwargs)
    return masked_lm_batch(ids, generator=_gen(seed), **options)


def _mlm_input(lengths, seed=0):
    ids, _ = _padded_batch(lengths, vocab=(4, VOCAB), seed=seed)
    ids[:, 0] = CLS  # special tokens that must never be chosen
    for b, n in enumerate(lengths):
        ids[b, n - 1] = SEP
    return ids


def test_mlm_fractions_over_many_tokens():
    ids = _mlm_input([512] * 40 + [100] * 40)
    batch = _mlm(ids)
    real = ids != PAD
    chosen = batch.targets != IGNORE_INDEX
    masked = chosen & (batch.inputs == MASK)
    unchanged = chosen & (batch.inputs == ids)
    random = chosen & ~masked & ~unchanged
    n_chosen = chosen.sum().item()
    assert n_chosen > 3500
    # Exactly round(15 %) of each row's eligible (non-special, real) tokens.
    eligible = real & (ids != CLS) & (ids != SEP)
    want = (eligible.sum(1) * 0.15).round().long()
    assert torch.equal(chosen.sum(1), want)
    assert masked.sum() / n_chosen == pytest.approx(0.8, abs=0.025)
    assert random.sum() / n_chosen == pytest.approx(0.1, abs=0.02)
    assert unchanged.sum() / n_chosen == pytest.approx(0.1, abs=0.02)


def test_mlm_targets_and_untouched_positions():
    ids = _mlm_input([30, 17, 5])
    batch = _mlm(ids, seed=4)
    chosen = batch.targets != IGNORE_INDEX
    assert torch.equal(batch.targets[chosen], ids[chosen])  # originals at chosen ones
    assert torch.equal(batch.inputs[~chosen], ids[~chosen])  # the rest untouched
    assert not chosen[(ids == PAD) | (ids == CLS) | (ids == SEP)].any()
    # Random replacements are ordinary tokens, never special ones.
    replaced = batch.inputs[chosen & (batch.inputs != MASK)]
    assert not torch.isin(replaced, torch.tensor([PAD, MASK, CLS, SEP])).any()


def test_mlm_at_least_one_token_and_replace_ids():
    ids = torch.tensor([[CLS, 7, 8, SEP]])  # 2 eligible: round(0.3) = 0 -> 1
    assert (_mlm(ids).targets != IGNORE_INDEX).sum() == 1
    ids = _mlm_input([400] * 10)
    batch = _mlm(ids, replace_ids=[42])
    chosen = batch.targets != IGNORE_INDEX
    replaced = chosen & (batch.inputs != MASK) & (batch.inputs != ids)
    assert replaced.any() and (batch.inputs[replaced] == 42).all()


def test_mlm_is_reproducible_with_a_seed():
    ids = _mlm_input([64] * 4)
    first, again, other = _mlm(ids, seed=1), _mlm(ids, seed=1), _mlm(ids, seed=2)
    assert torch.equal(first.inputs, again.inputs)
    assert torch.equal(first.targets, again.targets)
    assert not torch.equal(first.targets, other.targets)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(mask_prob=0.0), ValueError, r"mask_prob must .* in \(0, 1\)"),
        (dict(mask_prob=1.5), ValueError, "mask_prob"),
        (dict(vocab_size=10), ValueError, r"token_ids must be in 0\.\.9, got"),
        (dict(mask_id=VOCAB), ValueError, "mask_id"),
        (dict(generator=None), TypeError, "torch.Generator"),
        (dict(replace_ids=[]), ValueError, "replace_ids"),
    ],
)
def test_mlm_bad_input(kwargs, error, match):
    ids = _mlm_input([10, 8])
    options = dict(mask_id=MASK, vocab_size=VOCAB, pad_id=PAD, generator=_gen())
    options.update(kwargs)
    with pytest.raises(error, match=match):
        masked_lm_batch(ids, **options)


# -- span corruption ------------------------------------------------------------

SENTINELS = list(range(1000, 1100))
EOS = 999
SPAN_VOCAB = 1100  # the ids of the text, EOS and the sentinels


def _restore(inputs, targets, sentinels=SENTINELS):
    """The original ids from one example's input and target (padding removed)."""
    spans, current = {}, None
    for token in targets.tolist():
        if token in sentinels:
            current = spans.setdefault(token, [])
        elif current is not None:
            current.append(token)
    out = []
    for token in inputs.tolist():
        out += spans[token] if token in sentinels else [token]
    return out


def test_random_spans_layout():
    gen = _gen(3)
    for length in [*range(40), 100, 257, 1000]:
        spans = random_spans(length, generator=gen)
        if length < 2:
            assert spans == []
            continue
        n_noise = sum(end - start for start, end in spans)
        assert n_noise == min(max(round(0.15 * length), 1), length - 1)
        assert spans[0][0] >= 0 and spans[-1][1] <= length
        for (_, end), (start, _) in pairwise(spans):
            assert start > end  # at least one kept token between two spans
        assert all(end > start for start, end in spans)


def test_random_spans_statistics():
    gen = _gen(0)
    lengths = torch.randint(20, 400, (3000,), generator=_gen(1)).tolist()
    spans = [random_spans(n, generator=gen) for n in lengths]
    span_lengths = [end - start for row in spans for start, end in row]
    assert sum(span_lengths) / sum(lengths) == pytest.approx(0.15, abs=0.003)
    assert sum(span_lengths) / len(span_lengths) == pytest.approx(3.0, abs=0.1)
    # Where the layout leaves no choice, the mean is exactly the requested one.
    exact = [random_spans(100, generator=gen) for _ in range(200)]
    assert all(len(row) == 5 for row in exact)  # 15 noise tokens in 5 spans of mean 3
    starts = Counter(start for row in exact for start, _ in row)
    assert len(starts) > 50  # and the spans do move around


def test_random_spans_other_density_and_span_length():
    gen = _gen(5)
    for _ in range(100):
        spans = random_spans(200, generator=gen, noise_density=0.3, mean_span_length=5)
        assert sum(end - start for start, end in spans) == 60 and len(spans) == 12


def test_span_corruption_reconstructs_exactly_and_respects_padding():
    lengths = [1, 2, 3, 7, 20, 64, 150, 33]
    ids, rows = _padded_batch(lengths, vocab=(1, 900))
    batch = span_corruption_batch(
        ids,
        sentinel_ids=SENTINELS,
        pad_id=PAD,
        vocab_size=SPAN_VOCAB,
        generator=_gen(2),
        eos_id=EOS,
    )
    for b, row in enumerate(rows):
        inputs = batch.inputs[b][batch.inputs[b] != PAD]
        targets = batch.targets[b][batch.targets[b] != IGNORE_INDEX]
        # padding is only at the end of both, and never inside a span
        assert (batch.inputs[b, len(inputs) :] == PAD).all()
        assert (batch.targets[b, len(targets) :] == IGNORE_INDEX).all()
        assert inputs[-1] == EOS and targets[-1] == EOS
        assert _restore(inputs[:-1], targets[:-1]) == row.tolist()
        n_spans = int(torch.isin(inputs, torch.tensor(SENTINELS)).sum())
        # sentinels in order: input <0> <1> ...; target <0> ... <k>, the final one extra
        in_input = inputs[torch.isin(inputs, torch.tensor(SENTINELS))]
        assert in_input.tolist() == SENTINELS[:n_spans]
        assert (
            targets[torch.isin(targets, torch.tensor(SENTINELS))].tolist()
            == SENTINELS[: n_spans + 1]
        )
        assert PAD not in targets.tolist()  # nothing from the padding reached a span
    # decoder inputs: start token (the pad id), then the targets shifted right
    assert (batch.decoder_inputs[:, 0] == PAD).all()
    previous = batch.targets[:, :-1]
    shifted = previous.masked_fill(previous == IGNORE_INDEX, PAD)
    assert torch.equal(batch.decoder_inputs[:, 1:], shifted)


def test_span_corruption_is_deterministic_and_shorter():
    ids, _ = _padded_batch([100] * 8, vocab=(1, 900))
    make = lambda seed: span_corruption_batch(
        ids,
        sentinel_ids=SENTINELS,
        pad_id=PAD,
        vocab_size=SPAN_VOCAB,
        generator=_gen(seed),
    )
    first, again, other = make(0), make(0), make(1)
    assert torch.equal(first.inputs, again.inputs)
    assert torch.equal(first.targets, again.targets)
    assert not torch.equal(first.inputs, other.inputs)
    # 15 noise tokens in 5 spans: input 100 - 15 + 5, target 15 + 6 sentinels
    assert first.inputs.shape == (8, 90) and first.targets.shape == (8, 21)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(eos_id=PAD), "eos_id and pad_id are both 0: every input would end in"),
        (dict(sentinel_ids=[1098, 1099, 1100]), r"sentinel_ids must be .* 0\.\.1100"),
        (dict(pad_id=SPAN_VOCAB), r"pad_id must be an int in 0\.\.1099, got 1100"),
        (dict(eos_id=SPAN_VOCAB + 3), r"eos_id must be an int in 0\.\.1099"),
        (dict(decoder_start_id=SPAN_VOCAB), r"decoder_start_id must be an int in 0\.\."),
        (dict(vocab_size=0), "vocab_size must be an int >= 1"),
    ],
    ids=["eos-is-pad", "sentinel-out-of-vocab", "pad-out-of-vocab", "eos-out-of-vocab",
         "start-out-of-vocab", "no-vocab"],
)  # fmt: skip
def test_span_corruption_refuses_ids_the_model_cannot_read(kwargs, match):
    """eos_id == pad_id (every input would end in padding) and ids outside the
    vocabulary are refused here, before they reach the model's embedding."""
    ids = torch.tensor([[5] + [6] * 60])
    options = dict(
        sentinel_ids=SENTINELS, pad_id=PAD, vocab_size=SPAN_VOCAB, generator=_gen()
    )
    with pytest.raises(ValueError, match=match):
        span_corruption_batch(ids, **{**options, **kwargs})


def test_span_corruption_refuses_text_ids_outside_the_vocabulary():
    ids = torch.tensor([[5, 6, 7, 1200, 8] + [6] * 30, [5] * 35])
    with pytest.raises(
        ValueError,
        match=r"token_ids must be in 0\.\.1099, got 5\.\.1200; encode the text",
    ):
        span_corruption_batch(
            ids, sentinel_ids=SENTINELS, pad_id=PAD, vocab_size=SPAN_VOCAB,
            generator=_gen(),
        )  # fmt: skip


def test_span_corruption_decoder_start_id():
    ids, _ = _padded_batch([30])
    batch = span_corruption_batch(
        ids,
        sentinel_ids=SENTINELS,
        pad_id=PAD,
        vocab_size=SPAN_VOCAB,
        generator=_gen(),
        decoder_start_id=7,
    )
    assert batch.decoder_inputs[0, 0] == 7


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(sentinel_ids=[1000, 1001]), "needs .* sentinel ids"),
        (dict(sentinel_ids=[]), "non-empty"),
        (dict(sentinel_ids=[5, *SENTINELS]), "sentinel id"),
        (dict(noise_density=0.0), "noise_density"),
        (dict(mean_span_length=0.5), "mean_span_length"),
    ],
)
def test_span_corruption_bad_input(kwargs, match):
    ids = torch.tensor([[5] + [6] * 60])
    options = dict(
        sentinel_ids=SENTINELS, pad_id=PAD, vocab_size=SPAN_VOCAB, generator=_gen()
    )
    options.update(kwargs)
    with pytest.raises(ValueError, match=match):
        span_corruption_batch(ids, **options)


# -- prefix LM ----------------------------------------------------------------------


def test_prefix_lm_mask_matches_its_definition():
    prefix = torch.tensor([0, 3, 7])
    mask = prefix_lm_mask(prefix, 7)
    assert mask.shape == (3, 1, 7, 7) and mask.dtype == torch.bool
    for b, p in enumerate(prefix.tolist()):
        for i in range(7):
            for j in range(7):
                assert mask[b, 0, i, j] == (j <= i or j < p)
    assert torch.equal(mask[0, 0], causal_mask(7))  # empty prefix: causal
    assert mask[2].all()  # full prefix: bidirectional


def test_prefix_lm_mask_works_as_an_attention_mask():
    """Changing token j moves the output at i only where the mask lets i see j."""
    x = torch.randn(1, 2, 9, 8, generator=_gen(0))
    mask = prefix_lm_mask([4], 9)
    base = scaled_dot_product_attention(x, x, x, mask)
    for j in range(9):
        y = x.clone()
        y[:, :, j] += 1.0
        after = scaled_dot_product_attention(y, y, y, mask)
        moved = (after - base).abs().amax(dim=(0, 1, 3))
        sees_j = mask[0, 0, :, j].clone()
        sees_j[j] = True  # the query at j changed too
        assert torch.equal(moved > 1e-6, sees_j)


@pytest.mark.parametrize(
    ("prefix", "error", "match"),
    [
        ([8], ValueError, r"prefix_lengths must be in 0\.\.7, got 8\.\.8; each"),
        ([-1], ValueError, r"prefix_lengths must be in 0\.\.7, got -1\.\.-1"),
        ([[1]], ValueError, r"prefix_lengths must have shape \(batch\)"),
        ([1.5], TypeError, "prefix_lengths must be an integer tensor"),
    ],
)
def test_prefix_lm_mask_bad_input(prefix, error, match):
    with pytest.raises(error, match=match):
        prefix_lm_mask(prefix, 7)
    with pytest.raises(ValueError, match="seq_len must be an int >= 0"):
        prefix_lm_mask([0], -1)


def test_prefix_lm_batch():
    lengths = [2, 5, 12, 12, 30]
    ids, rows = _padded_batch(lengths)
    prefixes = Counter()
    for seed in range(40):
        batch = prefix_lm_batch(ids, generator=_gen(seed), pad_id=PAD)
        assert torch.equal(batch.inputs, ids[:, :-1])
        for b, n in enumerate(lengths):
            p = int(batch.mask[b, 0, 0].sum())  # query 0 sees exactly the prefix
            assert 1 <= p <= n - 1
            prefixes[(b, p)] += 1
            want = torch.full((ids.shape[1] - 1,), IGNORE_INDEX)
            want[p - 1 : n - 1] = rows[b][p:]
            assert torch.equal(batch.targets[b], want)
            expected = prefix_lm_mask([p], ids.shape[1] - 1)[0]
            # and no padding keys
            expected = expected & (torch.arange(ids.shape[1] - 1) < n)
            assert torch.equal(batch.mask[b], expected)
    assert len([key for key in prefixes if key[0] == 4]) > 15  # prefixes vary


def test_prefix_lm_batch_is_deterministic_and_checks_lengths():
    ids, _ = _padded_batch([10, 20])
    a = prefix_lm_batch(ids, generator=_gen(3), pad_id=PAD)
    b = prefix_lm_batch(ids, generator=_gen(3), pad_id=PAD)
    assert torch.equal(a.mask, b.mask) and torch.equal(a.targets, b.targets)
    with pytest.raises(ValueError, match=">= 2 real tokens"):
        prefix_lm_batch(torch.tensor([[5, PAD, PAD]]), generator=_gen(), pad_id=PAD)
    with pytest.raises(TypeError, match="torch.Generator"):
        prefix_lm_batch(ids, generator=3)


# -- issue 19: ids that would mean two things, and other bad input ---------------------


@pytest.mark.parametrize(
    "sentinels",
    [[PAD, 1001], [EOS, 1001], [-100, 1001], [1000, 1001, 1000]],
    ids=["pad", "eos", "ignore_index", "duplicated"],
)
def test_span_corruption_refuses_ambiguous_sentinels(sentinels):
    ids = torch.tensor([[5] + [6] * 10])
    with pytest.raises(ValueError, match="sentinel_ids must be a non-empty list of"):
        span_corruption_batch(
            ids,
            sentinel_ids=sentinels,
            pad_id=PAD,
            eos_id=EOS,
            generator=_gen(),
            vocab_size=SPAN_VOCAB,
        )


@pytest.mark.parametrize(
    ("replace_ids", "why"),
    [([VOCAB], "outside"), ([-1], "negative"), ([MASK], "mask"), ([PAD], "pad"),
     ([CLS], "special")],
)  # fmt: skip
def test_mlm_refuses_replace_ids_outside_the_vocabulary_or_special(replace_ids, why):
    with pytest.raises(
        ValueError, match=r"replace_ids must be .* none of \[0, 1, 2, 3\]"
    ):
        _mlm(_mlm_input([10, 8]), replace_ids=replace_ids)


def test_mlm_refuses_special_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match="special_ids must be"):
        _mlm(_mlm_input([10, 8]), special_ids=[CLS, VOCAB + 5])


def _objective_calls():
    ids = _mlm_input([10, 8])
    mlm = dict(mask_id=MASK, vocab_size=VOCAB, pad_id=PAD)
    span = dict(sentinel_ids=SENTINELS, pad_id=PAD, vocab_size=SPAN_VOCAB)
    return [
        # (call, error, match)
        (lambda: causal_lm_batch([[1, 2]]), TypeError, "torch.Tensor"),
        (lambda: causal_lm_batch(ids, pad_id=-1), ValueError, "pad_id must be an int >= 0"),
        (lambda: causal_lm_batch(ids, pad_id=0.5), TypeError, "pad_id must be an int"),
        (lambda: masked_lm_batch(ids, generator=3, **mlm), TypeError, "torch.Generator"),
        (lambda: masked_lm_batch(ids, generator=_gen(), **{**mlm, "vocab_size": 0}),
         ValueError, "vocab_size must be an int >= 1"),
        (lambda: _mlm(ids, mask_prob=float("nan")), ValueError, "mask_prob"),
        (lambda: _mlm(ids.float()), TypeError, "integer tensor"),
        (lambda: _mlm(ids, special_ids=[1.5]), TypeError, r"special_ids\[0\] must be an int"),
        (lambda: random_spans(-1, generator=_gen()), ValueError, "length must be an int >= 0"),
        (lambda: random_spans(10, generator=None), TypeError, "torch.Generator"),
        (lambda: random_spans(10, generator=_gen(), noise_density=1.0), ValueError,
         "noise_density"),
        (lambda: span_corruption_batch(ids, generator=_gen(), eos_id=-2, **span),
         ValueError, r"eos_id must be an int in 0\.\.1099, got -2"),
        (lambda: span_corruption_batch(ids, generator=_gen(), decoder_start_id=-1, **span),
         ValueError, "decoder_start_id"),
        (lambda: span_corruption_batch(ids, generator=_gen(), **{**span, "pad_id": None}),
         TypeError, "pad_id must be an int"),
        (lambda: prefix_lm_mask([1], 3.0), TypeError, "seq_len must be an int"),
        (lambda: prefix_lm_batch(ids[:, :1], generator=_gen()), ValueError, ">= 2 real"),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(16))
def test_every_builder_names_the_bad_argument(index):
    call, error, match = _objective_calls()[index]
    with pytest.raises(error, match=match):
        call()


def test_empty_batches_are_handled():
    empty = torch.zeros(0, 5, dtype=torch.long)
    assert causal_lm_batch(empty).inputs.shape == (0, 4)
    assert prefix_lm_mask([], 4).shape == (0, 1, 4, 4)
