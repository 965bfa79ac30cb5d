"""lib.generation on toy models that follow the step protocol, and on lib.models.

The toy language model's logits at position t depend on the token at t, the token before
it and on t itself, so any mistake in how a cache is extended, reordered (``select``) or
rolled back (``crop``) changes the logits. Its cache keeps the ids seen so far.
"""

from __future__ import annotations

import importlib.util
import math
from collections import defaultdict
from dataclasses import dataclass
from itertools import product
from types import SimpleNamespace

import pytest
import torch

from lib.generation import (
    TorchSampler,
    beam_search,
    generate,
    length_penalty,
    next_token_probs,
    residual_distribution,
    sample_next_token,
    speculative_generate,
    top_k_filter,
    top_p_filter,
)
from lib.models import GPT, TransformerConfig


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these tests run thousands of tiny ops, and on a busy machine
    some shapes (a 3x3 float64 softmax) wait milliseconds for a second thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- toy models following the step protocol ------------------------------------------


@dataclass(frozen=True)
class HistoryCache:
    ids: torch.Tensor  # (batch seq)
    memory: torch.Tensor | None = None  # (batch vocab): a toy "encoder output"
    log: list | None = None  # records select and crop calls

    @property
    def seq_len(self) -> int:
        return self.ids.shape[1]

    def select(self, indices: torch.Tensor) -> HistoryCache:
        assert indices.dtype == torch.long and indices.dim() == 1
        if self.log is not None:
            self.log.append(("select", indices.tolist()))
        memory = None if self.memory is None else self.memory[indices]
        return HistoryCache(self.ids[indices], memory, self.log)

    def crop(self, length: int) -> HistoryCache:
        assert 0 <= length <= self.seq_len
        if self.log is not None:
            self.log.append(("crop", length))
        return HistoryCache(self.ids[:, :length], self.memory, self.log)


class ToyLM:
    """Logits = current[token] + previous[token before] + position[t]."""

    def __init__(self, vocab_size=7, seed=0, scale=1.0, dtype=torch.float64):
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        randn = lambda *shape: scale * torch.randn(*shape, generator=gen, dtype=dtype)
        self.current = randn(vocab_size, vocab_size)
        self.previous = randn(vocab_size + 1, vocab_size)  # last row: no token before
        self.position = 0.5 * randn(128, vocab_size)
        self.calls: list[tuple[int, ...]] = []
        self.log: list = []

    def full_logits(self, ids: torch.Tensor) -> torch.Tensor:
        """(batch seq) -> (batch seq vocab), no cache."""
        before = torch.full_like(ids[:, :1], self.vocab_size)
        previous = torch.cat([before, ids[:, :-1]], dim=1)
        positions = torch.arange(ids.shape[1])
        return self.current[ids] + self.previous[previous] + self.position[positions]

    def step(self, ids, cache):
        self.calls.append(tuple(ids.shape))
        history = ids if cache is None else torch.cat([cache.ids, ids], dim=1)
        logits = self.full_logits(history)[:, -ids.shape[1] :]
        return logits, HistoryCache(history, log=self.log)


class ToySeq2Seq:
    """An encoder-decoder: bind(src) 'encodes' once; the cache carries the encoding."""

    def __init__(self, vocab_size=6, seed=1):
        self.decoder = ToyLM(vocab_size, seed)
        gen = torch.Generator().manual_seed(seed + 100)
        shape = (vocab_size, vocab_size)
        self.source = torch.randn(shape, generator=gen, dtype=torch.float64)
        self.vocab_size = vocab_size
        self.encoder_runs = 0

    def bind(self, src_ids):
        self.encoder_runs += 1
        return BoundToy(self, self.source[src_ids].mean(dim=1))


class BoundToy:
    start_id = 0

    def __init__(self, model, memory):
        self.model, self.memory, self.vocab_size = model, memory, model.vocab_size
        self.batch_sizes: list[int] = []

    def step(self, ids, cache):
        memory = self.memory if cache is None else cache.memory
        assert memory.shape[0] == ids.shape[0], "cache and ids disagree on the batch"
        self.batch_sizes.append(ids.shape[0])
        history = ids if cache is None else torch.cat([cache.ids, ids], dim=1)
        logits = self.model.decoder.full_logits(history)[:, -ids.shape[1] :]
        return logits + memory[:, None], HistoryCache(history, memory)

    def full_logits(self, ids):
        return self.model.decoder.full_logits(ids) + self.memory[:, None]


def greedy_without_cache(model, prompt, n_new):
    ids = prompt
    for _ in range(n_new):
        next_id = model.full_logits(ids)[:, -1].argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, next_id], dim=1)
    return ids


# -- filters and sampling ------------------------------------------------------------


def test_top_k_filter_keeps_the_k_largest():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(0))
    for k in (1, 4, 30, 100):
        kept = top_k_filter(logits, k).isfinite()
        assert (kept.sum(dim=-1) == min(k, 30)).all()
        smallest_kept = logits.masked_fill(~kept, math.inf).amin(dim=-1)
        largest_removed = logits.masked_fill(kept, -math.inf).amax(dim=-1)
        assert (smallest_kept > largest_removed).all()


def test_top_p_filter_keeps_the_smallest_nucleus():
    gen = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(50, 20, generator=gen)
    probs = logits.softmax(-1)
    for p in (0.05, 0.3, 0.5, 0.9, 0.999):
        kept = top_p_filter(logits, p).isfinite()
        mass = (probs * kept).sum(-1)
        least = probs.masked_fill(~kept, math.inf).amin(-1)
        assert (mass >= p - 1e-6).all()  # enough mass ...
        assert (mass - least < p).all()  # ... and none to spare
        assert kept.gather(1, probs.argmax(-1, keepdim=True)).all()  # the top stays
        # the nucleus holds the most probable tokens
        assert (probs.masked_fill(kept, -1).amax(-1) <= least).all()
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    # permuting the vocabulary permutes the result
    order = torch.randperm(20, generator=gen)
    permuted_first = top_p_filter(logits[:, order], 0.5)
    assert torch.equal(permuted_first, top_p_filter(logits, 0.5)[:, order])


def test_next_token_probs_temperature():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    assert torch.allclose(next_token_probs(logits), logits.softmax(-1))
    sharper = next_token_probs(logits, temperature=0.5)
    assert torch.allclose(sharper, (2 * logits).softmax(-1))
    greedy = next_token_probs(logits, temperature=0)
    assert torch.equal(greedy, torch.tensor([[0.0, 0.0, 1.0, 0.0]]))
    filtered = next_token_probs(logits, top_k=2)
    assert torch.allclose(filtered[0, 2] / filtered[0, 1], torch.tensor(math.e))
    assert filtered[0, [0, 3]].sum() == 0
    half = next_token_probs(torch.zeros(1, 4, dtype=torch.float16))
    assert half.dtype == torch.float32


def test_sampling_follows_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5]).repeat(20000, 1)
    for knobs in ({}, dict(temperature=2.0), dict(top_k=3), dict(top_p=0.8)):
        gen = torch.Generator().manual_seed(0)
        tokens = sample_next_token(logits, generator=gen, **knobs)
        frequencies = torch.bincount(tokens, minlength=5) / len(tokens)
        want = next_token_probs(logits[0], **knobs)
        assert torch.allclose(frequencies, want, atol=0.015), knobs
        assert (frequencies[want == 0] == 0).all()  # nothing outside the filter


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(temperature=-0.5), ValueError, "temperature must be .* >= 0"),
        (dict(temperature=float("nan")), ValueError, "temperature .*; 0 means greedy"),
        (dict(top_k=0), ValueError, "top_k must be an int >= 1"),
        (dict(top_k=2.5), TypeError, "top_k must be an int"),
        (dict(top_p=0.0), ValueError, r"top_p must be a finite number in \(0, 1\]"),
        (dict(top_p=1.5), ValueError, r"top_p must be a finite number in \(0, 1\]"),
    ],
)
def test_bad_sampling_arguments(kwargs, error, match):
    model = ToyLM()
    with pytest.raises(error, match=match):
        generate(model, torch.tensor([1, 2]), 3, **kwargs)
    with pytest.raises(error, match=match):
        speculative_generate(model, model, torch.tensor([1, 2]), 3, **kwargs)
    with pytest.raises(error, match=match):
        sample_next_token(torch.zeros(1, 7), **kwargs)


# -- generate -------------------------------------------------------------------------


def test_greedy_with_cache_equals_greedy_without():
    model = ToyLM(vocab_size=11, seed=3)
    prompt = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(0))
    got = generate(model, prompt, 20, temperature=0)
    assert torch.equal(got, greedy_without_cache(model, prompt, 20))
    # the prompt once, then one token per step: only the new position is computed
    assert model.calls == [(3, 4)] + [(3, 1)] * 19


def test_generate_shapes_and_reproducibility():
    model = ToyLM()
    prompt = torch.tensor([1, 2, 3])
    out = generate(model, prompt, 5, generator=torch.Generator().manual_seed(0))
    assert out.shape == (8,) and torch.equal(out[:3], prompt)
    again = generate(model, prompt, 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    outs = set()
    for seed in range(10):
        gen = torch.Generator().manual_seed(seed)
        outs.add(tuple(generate(model, prompt, 8, generator=gen).tolist()))
    assert len(outs) > 5
    assert torch.equal(generate(model, prompt, 0), prompt)
    assert generate(model, prompt[None].repeat(2, 1), 4, top_k=1).shape == (2, 7)
    # top_k=1 is greedy
    assert torch.equal(
        generate(model, prompt, 6, top_k=1), generate(model, prompt, 6, temperature=0)
    )


def test_stop_tokens_end_rows_and_pad_them():
    model = ToyLM(vocab_size=5, seed=2, scale=0.3)  # flat: every token is likely
    prompt = torch.zeros(64, 2, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    out = generate(model, prompt, 30, stop_ids=[4], pad_id=3, generator=gen)
    new = out[:, 2:]
    assert new.shape[1] < 30 or (new == 4).any(1).all()
    for row in new:
        stops = (row == 4).nonzero().flatten()
        if len(stops):
            first = int(stops[0])
            assert (row[first + 1 :] == 3).all()
        else:
            assert len(row) == new.shape[1]
    # the loop ends once every row has stopped
    ends_at = [int((row == 4).nonzero()[0]) if (row == 4).any() else 99 for row in new]
    assert new.shape[1] == min(30, max(ends_at) + 1)
    # default padding: the stop token itself
    gen = torch.Generator().manual_seed(0)
    out = generate(model, prompt, 30, stop_ids=[4], generator=gen)[:, 2:]
    for row in out:
        if (row == 4).any():
            assert (row[int((row == 4).nonzero()[0]) :] == 4).all()


class _NoVocabModel:
    """A step protocol model that does not say its vocabulary size."""

    def __init__(self):
        self.inner = ToyLM()

    def step(self, ids, cache):
        return self.inner.step(ids.clamp(max=6), cache)


@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        (torch.tensor([], dtype=torch.long), ValueError, "prompt_ids is empty"),
        (torch.zeros(0, 3, dtype=torch.long), ValueError, "prompt_ids is empty"),
        (torch.tensor([1.0, 2.0]), TypeError, "prompt_ids must be an integer tensor"),
        ([1, 2], TypeError, "torch.Tensor"),
        (
            torch.zeros(1, 2, 3, dtype=torch.long),
            ValueError,
            r"\(batch, seq\) or \(seq,\)",
        ),
        (
            torch.tensor([1, 7]),
            ValueError,
            r"prompt_ids must be in 0\.\.6, got 1\.\.7",
        ),
        (torch.tensor([-1, 2]), ValueError, r"prompt_ids must be in 0\.\.6, got -1"),
    ],
)
def test_bad_prompts(prompt, error, match):
    model = ToyLM()
    for run in (
        lambda: generate(model, prompt, 3),
        lambda: beam_search(model, prompt, 3),
        lambda: speculative_generate(model, model, prompt, 3),
    ):
        with pytest.raises(error, match=match):
            run()


def test_vocab_size_from_config_or_from_the_logits():
    model = ToyLM()
    configured = SimpleNamespace(step=model.step, config=SimpleNamespace(vocab_size=7))
    with pytest.raises(ValueError, match="0..6"):
        generate(configured, torch.tensor([9]), 2)
    assert model.calls == []  # caught before the model ran
    with pytest.raises(ValueError, match="0..6"):
        generate(_NoVocabModel(), torch.tensor([9]), 2)  # caught after the first step


def test_bad_counts():
    model = ToyLM()
    prompt = torch.tensor([1])
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        generate(model, prompt, -1)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        beam_search(model, prompt, -1)
    with pytest.raises(ValueError, match="beam_size must be an int >= 1"):
        beam_search(model, prompt, 3, beam_size=0)
    with pytest.raises(ValueError, match="n_draft must be an int >= 1"):
        speculative_generate(model, model, prompt, 3, n_draft=0)
    with pytest.raises(ValueError, match="batch 1"):
        speculative_generate(model, model, torch.zeros(2, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"stop_ids\[0\] must be an int >= 0"):
        generate(model, prompt, 3, stop_ids=[-1])


# -- beam search ----------------------------------------------------------------------


def reference_beam_search(model, prompt, n_new, beam_size, alpha, stops=()):
    """Beam search on one prompt, written plainly: no cache, no early stop."""
    beams, finished, length = [(0.0, list(prompt))], [], 0
    for length in range(1, n_new + 1):
        candidates = []
        for score, seq in beams:
            logits = model.full_logits(torch.tensor([seq]))[0, -1]
            log_probs = logits.double().log_softmax(-1).tolist()
            candidates += [(score + lp, [*seq, v]) for v, lp in enumerate(log_probs)]
        candidates.sort(key=lambda c: -c[0])
        candidates = candidates[: beam_size * (1 + len(stops))]
        for score, seq in candidates[:beam_size]:
            if seq[-1] in stops:
                finished.append((score / length_penalty(length, alpha), seq))
        beams = [c for c in candidates if c[1][-1] not in stops][:beam_size]
        if not beams:
            break
    finished += [(score / length_penalty(length, alpha), seq) for score, seq in beams]
    return max(finished, key=lambda h: h[0])


@pytest.mark.parametrize(
    ("beam_size", "alpha", "stops"),
    [(1, 0.6, ()), (3, 0.6, ()), (4, 0.0, (2,)), (4, 1.0, (2,)), (5, 2.0, (1, 2))],
)
def test_beam_search_matches_a_plain_reference(beam_size, alpha, stops):
    model = ToyLM(vocab_size=6, seed=4, scale=0.7)
    prompts = torch.tensor([[0, 1], [3, 3], [5, 2]])
    out, scores = beam_search(
        model,
        prompts,
        7,
        beam_size=beam_size,
        length_alpha=alpha,
        stop_ids=stops,
        pad_id=0,
        return_scores=True,
    )
    for b, prompt in enumerate(prompts.tolist()):
        want_score, want = reference_beam_search(
            model,
            prompt,
            7,
            beam_size,
            alpha,
            stops,
        )
        assert out[b, : len(want)].tolist() == want
        assert (out[b, len(want) :] == 0).all()
        assert scores[b].item() == pytest.approx(want_score, abs=1e-9)


def test_a_wide_beam_finds_the_best_sequence():
    """With a beam wider than the number of sequences, beam search is exhaustive."""
    model = ToyLM(vocab_size=3, seed=5)
    prompt = torch.tensor([1])
    for alpha, stops in ((0.0, ()), (0.8, (0,)), (3.0, (0,))):
        best, best_score = None, -math.inf
        for n in (1, 2, 3):
            for tail in product(range(3), repeat=n):
                if any(t in stops for t in tail[:-1]):
                    continue  # a sequence ends at its first stop
                if n < 3 and tail[-1] not in stops:
                    continue
                ids = torch.tensor([[1, *tail]])
                log_probs = model.full_logits(ids)[0, :-1].log_softmax(-1)
                score = log_probs.gather(1, ids[0, 1:, None]).sum().item()
                score /= length_penalty(n, alpha)
                if score > best_score:
                    best, best_score = [1, *tail], score
        out, score = beam_search(
            model,
            prompt,
            3,
            beam_size=27,
            length_alpha=alpha,
            stop_ids=stops,
            return_scores=True,
        )
        assert out[: len(best)].tolist() == best
        assert score.item() == pytest.approx(best_score)


def test_beam_size_one_is_greedy():
    model = ToyLM(vocab_size=9, seed=6)
    prompt = torch.randint(0, 9, (4, 3), generator=torch.Generator().manual_seed(1))
    greedy = generate(model, prompt, 12, temperature=0)
    assert torch.equal(beam_search(model, prompt, 12, beam_size=1), greedy)
    # with a stop token and no length normalisation too
    greedy = generate(model, prompt, 12, temperature=0, stop_ids=[3], pad_id=0)
    beam = beam_search(
        model,
        prompt,
        12,
        beam_size=1,
        length_alpha=0.0,
        stop_ids=[3],
        pad_id=0,
    )
    assert torch.equal(beam, greedy[:, : beam.shape[1]])
    assert (greedy[:, beam.shape[1] :] == 0).all()


def test_beam_search_reorders_the_cache_and_never_reencodes():
    model = ToySeq2Seq(vocab_size=6)
    src = torch.randint(0, 6, (3, 5), generator=torch.Generator().manual_seed(2))
    bound = model.bind(src)
    start = torch.full((3, 1), bound.start_id)
    out = beam_search(bound, start, 6, beam_size=4, length_alpha=0.0)
    assert model.encoder_runs == 1
    # the first step at batch 3, then 3 rows x 4 beams, via cache.select
    assert bound.batch_sizes == [3] + [12] * 5
    for b in range(3):
        row_logits = lambda ids, b=b: bound.full_logits(ids)[b : b + 1]
        row = SimpleNamespace(full_logits=row_logits)
        _, want = reference_beam_search(row, [0], 6, 4, 0.0)
        assert out[b].tolist() == want
    # and beam size 1 is greedy here too
    greedy = generate(bound, start, 6, temperature=0)
    assert torch.equal(beam_search(bound, start, 6, beam_size=1), greedy)


def test_beam_search_output_forms():
    model = ToyLM()
    out = beam_search(model, torch.tensor([1, 2]), 4, beam_size=3)
    assert out.shape == (6,)
    out, scores = beam_search(model, torch.tensor([[1, 2]]), 0, return_scores=True)
    assert torch.equal(out, torch.tensor([[1, 2]])) and scores.shape == (1,)


# -- speculative decoding -------------------------------------------------------------


def test_residual_distribution():
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(4, 9, generator=gen).softmax(-1)
    q = torch.randn(4, 9, generator=gen).softmax(-1)
    r = residual_distribution(p, q)
    assert torch.allclose(r.sum(-1), torch.ones(4))
    assert (r[p <= q] == 0).all()
    excess = (p - q).clamp(min=0)
    assert torch.allclose(r, excess / excess.sum(-1, keepdim=True))
    assert torch.equal(residual_distribution(p, p), p)


class PathSampler:
    """Follows a list of choices (then always the first option), recording each."""

    def __init__(self, path):
        self.path, self.taken, self.n_options, self.probability = path, [], [], 1.0

    def _choose(self, options):
        options = [(value, prob) for value, prob in options if prob > 0]
        depth = len(self.taken)
        pick = self.path[depth] if depth < len(self.path) else 0
        self.taken.append(pick)
        self.n_options.append(len(options))
        self.probability *= options[pick][1]
        return options[pick][0]

    def categorical(self, probs):
        assert probs.dim() == 1
        return self._choose(list(enumerate(probs.tolist())))

    def accept(self, probability):
        assert 0.0 <= probability <= 1.0
        return self._choose([(True, probability), (False, 1.0 - probability)])


def enumerate_outputs(run):
    distribution, paths = defaultdict(float), [[]]
    while paths:
        sampler = PathSampler(paths.pop())
        distribution[tuple(run(sampler).tolist())] += sampler.probability
        for depth in range(len(sampler.path), len(sampler.taken)):
            for other in range(1, sampler.n_options[depth]):
                paths.append([*sampler.taken[:depth], other])
    return distribution


def sampling_distribution(model, prompt, n_new, stops=(), **knobs):
    distribution = defaultdict(float)

    def extend(ids, probability):
        stopped = len(ids) > len(prompt) and ids[-1] in stops
        if len(ids) - len(prompt) == n_new or stopped:
            distribution[tuple(ids)] += probability
            return
        logits = model.full_logits(torch.tensor([ids]))[0, -1]
        for token, p in enumerate(next_token_probs(logits, **knobs).tolist()):
            if p > 0:
                extend([*ids, token], probability * p)

    extend(list(prompt), 1.0)
    return distribution


@pytest.mark.parametrize(
    ("prompt", "n_new", "n_draft", "knobs", "stops"),
    [
        ([2], 4, 2, {}, ()),
        ([0, 1, 2], 4, 3, {}, ()),
        ([1, 1], 3, 1, {}, ()),
        ([1], 4, 2, dict(temperature=0.6, top_k=2), ()),
        ([2, 0], 4, 2, dict(temperature=1.5, top_p=0.7), ()),
        ([0], 4, 2, {}, (1,)),
        ([0], 4, 3, dict(temperature=0), ()),
    ],
)
def test_speculative_output_distribution_is_exactly_the_targets(
    prompt, n_new, n_draft, knobs, stops
):
    target = ToyLM(vocab_size=3, seed=10)
    draft = ToyLM(vocab_size=3, seed=11, scale=0.6)
    got = enumerate_outputs(
        lambda sampler: speculative_generate(
            target,
            draft,
            torch.tensor(prompt),
            n_new,
            n_draft=n_draft,
            stop_ids=stops,
            sampler=sampler,
            **knobs,
        )
    )
    want = sampling_distribution(target, prompt, n_new, stops, **knobs)
    assert set(got) <= set(want)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    for output, probability in want.items():
        assert got[output] == pytest.approx(probability, abs=1e-12), output


def test_speculative_greedy_and_seeded_sampling():
    target, draft = ToyLM(vocab_size=13, seed=20), ToyLM(vocab_size=13, seed=21)
    prompt = torch.tensor([3, 4, 5])
    greedy = speculative_generate(target, draft, prompt, 30, temperature=0)
    assert torch.equal(greedy, generate(target, prompt, 30, temperature=0))
    run = lambda seed: speculative_generate(
        target, draft, prompt, 30, generator=torch.Generator().manual_seed(seed)
    )
    assert torch.equal(run(0), run(0)) and not torch.equal(run(0), run(1))
    assert run(0).shape == (33,)


def test_speculative_stats_crops_and_calls():
    target = ToyLM(vocab_size=13, seed=20)
    _, stats = speculative_generate(
        target, target, torch.tensor([1, 2]), 20, n_draft=4, return_stats=True
    )
    # a draft that is the target is always right: 5 tokens per call, no rollback
    assert stats["accepted"] == stats["proposed"]
    assert stats["target_calls"] == 4
    assert stats["draft_calls"] == stats["proposed"] == stats["examined"] == 16
    assert not [entry for entry in target.log if entry[0] == "crop"]

    target, draft = ToyLM(vocab_size=13, seed=20), ToyLM(vocab_size=13, seed=21)
    out, stats = speculative_generate(
        target,
        draft,
        torch.tensor([1, 2]),
        40,
        n_draft=3,
        return_stats=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert len(out) == 42
    assert stats["accepted"] < stats["proposed"]
    # the drafts after a rejection are never examined; one rejection a call at most
    assert stats["accepted"] < stats["examined"] < stats["proposed"]
    assert stats["examined"] - stats["accepted"] <= stats["target_calls"]
    assert 40 == stats["accepted"] + stats["target_calls"]  # one own token per call
    # rejected proposals were rolled back
    assert [entry for entry in target.log if entry[0] == "crop"]
    # every target call scores the pending token and all proposals at once
    assert max(new for _, new in target.calls[1:]) == 4


def test_speculative_with_nothing_to_generate():
    model = ToyLM()
    prompt = torch.tensor([1, 2])
    out, stats = speculative_generate(model, model, prompt, 0, return_stats=True)
    assert torch.equal(out, torch.tensor([1, 2])) and model.calls == []
    assert stats == {
        "target_calls": 0,
        "draft_calls": 0,
        "proposed": 0,
        "examined": 0,
        "accepted": 0,
    }


def test_speculative_checks_the_vocabularies():
    for target_vocab, draft_vocab in ((5, 6), (6, 5)):
        target, draft = ToyLM(vocab_size=target_vocab), ToyLM(vocab_size=draft_vocab)
        for prompt in (torch.tensor([1]), torch.tensor([1, 2, 3])):
            with pytest.raises(ValueError, match="disagree on the vocabulary"):
                speculative_generate(target, draft, prompt, 3)


def test_torch_sampler():
    sampler = TorchSampler(torch.Generator().manual_seed(0))
    assert sampler.accept(1.0) and not sampler.accept(0.0)
    draws = [sampler.categorical(torch.tensor([0.0, 0.25, 0.75])) for _ in range(2000)]
    assert 0 not in draws and abs(draws.count(2) / 2000 - 0.75) < 0.04
    accepted = sum(sampler.accept(0.3) for _ in range(4000))
    assert abs(accepted / 4000 - 0.3) < 0.03


# -- the real models, once lib.models exists -----------------------------------------

needs_models = pytest.mark.skipif(
    importlib.util.find_spec("lib.models") is None,
    reason="lib.models is not written yet",
)


def _tiny_gpt():
    from lib.models import GPT, TransformerConfig

    config = TransformerConfig(
        vocab_size=37,
        d_model=32,
        n_heads=4,
        n_layers=2,
        max_len=64,
    )
    torch.manual_seed(0)
    return GPT(config).eval()


@needs_models
def test_gpt_greedy_with_cache_equals_the_full_forward():
    model = _tiny_gpt()
    prompt = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ids = prompt
        for _ in range(20):
            logits = model(ids)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        assert torch.equal(generate(model, prompt, 20, temperature=0), ids)


@needs_models
def test_gpt_beam_search_runs_and_beam_one_is_greedy():
    model = _tiny_gpt()
    prompt = torch.randint(0, 37, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        greedy = generate(model, prompt, 10, temperature=0)
        assert torch.equal(beam_search(model, prompt, 10, beam_size=1), greedy)
        out, scores = beam_search(model, prompt, 10, beam_size=4, return_scores=True)
        assert out.shape == (2, 15) and torch.isfinite(scores).all()
        sampled = speculative_generate(
            model, model, prompt[0], 10, generator=torch.Generator().manual_seed(0)
        )
        assert sampled.shape == (15,)


@needs_models
def test_t5_beam_search_runs_and_beam_one_is_greedy():
    from lib.models import T5, TransformerConfig

    config = TransformerConfig(
        vocab_size=37,
        d_model=32,
        n_heads=4,
        n_layers=2,
        n_decoder_layers=2,
        positions="t5",
        bias=False,
    )
    torch.manual_seed(0)
    model = T5(config).eval()
    src = torch.randint(1, 37, (3, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        bound = model.bind(src)
        start = torch.full((3, 1), bound.start_id)
        greedy = generate(bound, start, 8, temperature=0)
        assert torch.equal(beam_search(bound, start, 8, beam_size=1), greedy)
        out, scores = beam_search(bound, start, 8, beam_size=4, return_scores=True)
        assert out.shape == (3, 9) and torch.isfinite(scores).all()


@needs_models
def test_translate_pads_binds_and_decodes_each_sentence():
    """translate: each sentence's ids and eos, right-padded, decoded from the pad id by
    beam search (beam 1: greedy), cut at eos and without pads; the model's mode kept."""
    from lib.generation import translate
    from lib.models import T5, TransformerConfig
    from lib.tokenizer import CharTokenizer

    chars = CharTokenizer("abcdefgh .")
    pad, eos = chars.vocab_size, chars.vocab_size + 1
    config = TransformerConfig(
        vocab_size=chars.vocab_size + 2, d_model=32, n_heads=4, n_layers=1,
        n_decoder_layers=1, positions="t5", bias=False, dropout=0.1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T5(config, start_id=pad).train()
    sentences = ["abc.", "a bad cafe.", "h"]
    special = dict(pad_id=pad, eos_id=eos)
    found = translate(model, chars, sentences, beam_size=1, max_new_tokens=6, **special)
    assert model.training  # put back in training mode
    assert len(found) == 3 and all(isinstance(text, str) for text in found)
    # by hand: the same greedy decoding of the padded batch
    rows = [torch.tensor([*chars.encode(s), eos]) for s in sentences]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad)
    model.eval()
    with torch.no_grad():
        bound = model.bind(src, src != pad)
        start = torch.full((3, 1), pad)
        ids = generate(bound, start, 6, temperature=0, stop_ids=[eos], pad_id=pad)
    expected = []
    for row in ids[:, 1:].tolist():
        row = row[: row.index(eos)] if eos in row else row
        expected.append(chars.decode([i for i in row if i != pad]))
    assert found == expected
    # one sentence at a time gives the same (padding changes nothing)
    one_by_one = translate(
        model, chars, sentences, beam_size=1, max_new_tokens=6, chunk=1, **special
    )
    assert one_by_one == found
    with pytest.raises(TypeError, match="list of sentences"):
        translate(model, chars, "abc", **special)


# -- issue 19: no token from unusable logits, no id outside the vocabulary --------------


class BrokenLM(ToyLM):
    """A ToyLM whose logits turn bad (NaN, or all -inf) from position ``at`` on."""

    def __init__(self, bad, at=4, **kwargs):
        super().__init__(**kwargs)
        self.bad, self.at = bad, at

    def full_logits(self, ids):
        logits = super().full_logits(ids).clone()
        logits[:, self.at :] = self.bad
        return logits


@pytest.mark.parametrize(
    "bad", [math.nan, -math.inf, math.inf], ids=["nan", "-inf", "inf"]
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generate_refuses_tokens_from_unusable_logits(bad, temperature):
    model = BrokenLM(bad)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="logits hold NaN or \\+inf, or a row"):
        generate(model, torch.tensor([1, 2]), 6, temperature=temperature, generator=gen)
    with pytest.raises(ValueError, match="logits hold NaN"):
        beam_search(model, torch.tensor([1, 2]), 6)
    with pytest.raises(ValueError, match="logits hold NaN"):
        speculative_generate(model, ToyLM(), torch.tensor([1, 2]), 6)
    # bad logits only where the output does not depend on them: fine
    assert generate(BrokenLM(bad, at=20), torch.tensor([1, 2]), 6).shape == (8,)


class RowBrokenLM(ToyLM):
    """A ToyLM whose row ``row`` gets all -inf logits from position ``at`` on."""

    def __init__(self, row=1, at=4, **kwargs):
        super().__init__(**kwargs)
        self.row, self.at = row, at

    def full_logits(self, ids):
        logits = super().full_logits(ids).clone()
        logits[self.row, self.at :] = -math.inf
        return logits


def test_generate_names_the_bad_row_and_skips_finished_ones():
    """generate reads the rows' largest logits once, at the end: it names the row whose
    logits were unusable while it was live, and ignores a row after its stop token."""
    prompt = torch.tensor([[1, 2], [3, 4]])  # greedy: 3 0 3 3 3 3 and 1 2 5 ...
    with pytest.raises(ValueError, match=r"for rows \[1\]$"):
        generate(RowBrokenLM(at=3), prompt, 6, temperature=0)
    # stop id 1: row 1 finishes at its first token, before its logits turn bad
    out = generate(RowBrokenLM(at=3), prompt, 6, temperature=0, stop_ids=[1])
    assert out.tolist() == [[1, 2, 3, 0, 3, 3, 3, 3], [3, 4, 1, 1, 1, 1, 1, 1]]


def test_next_token_probs_and_sampling_refuse_unusable_logits():
    for row in ([math.nan, 0.0], [-math.inf, -math.inf], [math.inf, 0.0]):
        logits = torch.tensor([[0.0, 1.0], row])
        with pytest.raises(ValueError, match="logits hold NaN or \\+inf"):
            next_token_probs(logits)
        with pytest.raises(ValueError, match="logits hold NaN or \\+inf"):
            sample_next_token(logits, temperature=0)
    # -inf in some entries is what filters make: fine
    probs = next_token_probs(torch.tensor([[-math.inf, 0.0]]))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0]]))


def test_stop_and_pad_ids_must_be_in_the_vocabulary():
    model = ToyLM()  # vocabulary 0..6
    prompt = torch.tensor([1, 2])
    for run in (generate, beam_search):
        with pytest.raises(ValueError, match=r"stop_ids must be in 0\.\.6, got 7\.\.7"):
            run(model, prompt, 3, stop_ids=[7])
        with pytest.raises(ValueError, match=r"pad_id must be in 0\.\.6, got 9\.\.9"):
            run(model, prompt, 3, stop_ids=[1], pad_id=9)
        with pytest.raises(ValueError, match="pad_id must be an int >= 0"):
            run(model, prompt, 3, pad_id=-1)  # no more rows padded with -1
    with pytest.raises(ValueError, match=r"stop_ids must be in 0\.\.6"):
        speculative_generate(model, model, prompt, 3, stop_ids=[7])
    # a model that does not say its vocabulary: checked against the first logits
    with pytest.raises(ValueError, match=r"stop_ids must be in 0\.\.6, got 7\.\.7"):
        generate(_NoVocabModel(), prompt, 3, stop_ids=[7])


def test_beam_search_pads_with_a_documented_id():
    model = ToyLM(vocab_size=6, seed=4, scale=0.7)
    prompts = torch.tensor([[0, 1], [3, 3]])
    out = beam_search(model, prompts, 6, beam_size=3, stop_ids=[2, 5], length_alpha=0.0)
    assert out.min() >= 0  # padding is the first stop id, a token of the vocabulary
    out = beam_search(model, prompts, 6, beam_size=3, stop_ids=[2], pad_id=4)
    assert out.min() >= 0 and out.max() < 6


def _generation_calls():
    model, prompt = ToyLM(), torch.tensor([1, 2])
    no_step = SimpleNamespace(vocab_size=7)
    return [
        (lambda: generate(no_step, prompt, 3), TypeError, "step"),
        (lambda: generate(model, prompt, 2.0), TypeError, "max_new_tokens must be an int"),
        (lambda: generate(model, prompt, 3, stop_ids="ab"), TypeError, "stop_ids must be"),
        (lambda: generate(model, prompt, 3, stop_ids=5), TypeError, "stop_ids must be"),
        (lambda: generate(model, prompt, 3, generator=3), TypeError, "torch.Generator"),
        (lambda: generate(model, prompt, 3, pad_id=1.5), TypeError, "pad_id must be"),
        (lambda: beam_search(model, prompt, 3, length_alpha=math.nan), ValueError,
         "length_alpha"),
        (lambda: beam_search(model, prompt, 3, return_scores=1), TypeError,
         "return_scores must be True or False"),
        (lambda: speculative_generate(model, None, prompt, 3), TypeError, "step"),
        (lambda: speculative_generate(model, model, prompt, 3, sampler=object()),
         TypeError, "sampler needs"),
        (lambda: speculative_generate(model, model, prompt, 3, return_stats="y"),
         TypeError, "return_stats"),
        (lambda: top_k_filter(torch.arange(5), 2), TypeError, "floating-point"),
        (lambda: top_k_filter(torch.zeros(2, 0), 2), ValueError, "no vocab"),
        (lambda: top_p_filter([0.1, 0.2], 0.5), TypeError, "torch.Tensor"),
        (lambda: next_token_probs(torch.zeros(3), top_k=-1), ValueError, "top_k"),
        (lambda: sample_next_token(torch.zeros(3)), ValueError, r"shape \(batch vocab\)"),
        (lambda: sample_next_token(torch.zeros(1, 3), generator="seed"), TypeError,
         "generator must be"),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(17))
def test_every_generation_function_names_the_bad_argument(index):
    call, error, match = _generation_calls()[index]
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_decoding_refuses_more_positions_than_the_table_up_front(positions):
    """A prompt of 3 and 6 new tokens feed 8 positions (the last new token is
    not fed back): that fits max_len=8; 7 new tokens do not, and with
    ``crop=False`` (speculative decoding: always) every decoding loop says so
    before it starts."""
    cfg = TransformerConfig(
        vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=8, positions=positions
    )
    model = GPT(cfg).eval()
    prompt = torch.tensor([1, 2, 3])
    assert generate(model, prompt, 6, temperature=0, crop=False).shape == (9,)
    assert beam_search(model, prompt, 6, beam_size=2, crop=False).shape == (9,)
    for decode in (
        lambda: generate(model, prompt, 7, temperature=0, crop=False),
        lambda: beam_search(model, prompt, 7, beam_size=2, crop=False),
        lambda: speculative_generate(model, model, prompt, 7, temperature=0),
    ):
        with pytest.raises(ValueError, match="need 9 positions.*max_len=8"):
            decode()
    with pytest.raises(ValueError, match="max_len=8: pass crop=True to decode with"):
        generate(model, prompt, 7, crop=False)


def test_a_list_prompt_is_told_to_become_a_tensor():
    model = GPT(TransformerConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1))
    with pytest.raises(TypeError, match=r"torch.tensor\(ids\)"):
        generate(model, [1, 2], 3)


# -- issue 28: past the position table, the context is cropped -----------------------


class TabledToyLM(ToyLM):
    """A ToyLM that says it has a learned table of ``max_len`` positions (its logits
    read row t of ``position`` at position t, so a window that slides changes them)."""

    def __init__(self, max_len, **kwargs):
        super().__init__(**kwargs)
        self.cfg = SimpleNamespace(
            max_positions=max_len, max_len=max_len, positions="learned"
        )


class CroppedByHand:
    """The reference for cropping: no cache reused and no table declared; each new
    position's logits come from ``logits_of`` (``(batch seq) -> (batch seq vocab)``)
    run on the last ``window`` ids up to it."""

    def __init__(self, logits_of, window, vocab_size):
        self.logits_of, self.window, self.vocab_size = logits_of, window, vocab_size

    def step(self, ids, cache):
        history = ids if cache is None else torch.cat([cache.ids, ids], dim=1)
        ends = range(history.shape[1] - ids.shape[1] + 1, history.shape[1] + 1)
        logits = [
            self.logits_of(history[:, :end][:, -self.window :])[:, -1] for end in ends
        ]
        return torch.stack(logits, dim=1), HistoryCache(history)


def _greedy_by_hand(logits_of, prompt, n_new, window):
    ids = prompt
    for _ in range(n_new):
        logits = logits_of(ids[:, -window:])[:, -1]
        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return ids


def _sample_by_hand(logits_of, prompt, n_new, window, temperature, seed):
    generator = torch.Generator().manual_seed(seed)
    ids = prompt
    for _ in range(n_new):
        logits = logits_of(ids[:, -window:])[:, -1]
        probs = (logits.double() / temperature).softmax(dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
    return ids


def _all_decoders_match_the_cropping_by_hand(
    model, logits_of, window, vocab, prompt, n_new
):
    """Greedy, sampling and beam search of ``model`` (cropped by lib.generation) equal
    the same decoding with the context cropped by hand."""
    n_prompt = prompt.shape[1]
    greedy = generate(model, prompt, n_new, temperature=0)
    assert greedy.shape == (prompt.shape[0], n_prompt + n_new)
    assert torch.equal(greedy, _greedy_by_hand(logits_of, prompt, n_new, window))

    sampled = generate(
        model,
        prompt,
        n_new,
        temperature=0.9,
        generator=torch.Generator().manual_seed(3),
    )
    by_hand = _sample_by_hand(logits_of, prompt, n_new, window, 0.9, seed=3)
    assert torch.equal(sampled, by_hand)

    reference = CroppedByHand(logits_of, window, vocab)
    for stop_ids in ((), (2,)):
        kwargs = dict(beam_size=3, stop_ids=stop_ids, return_scores=True)
        out, scores = beam_search(model, prompt, n_new, **kwargs)
        ref_out, ref_scores = beam_search(reference, prompt, n_new, **kwargs)
        assert torch.equal(out, ref_out)
        assert torch.allclose(scores, ref_scores)
        if not stop_ids:
            assert out.shape == (prompt.shape[0], n_prompt + n_new)


@pytest.mark.parametrize("n_prompt", [2, 9])  # shorter, and longer, than the table
def test_toy_decoding_past_the_table_crops_the_context(n_prompt):
    model = TabledToyLM(6, vocab_size=7, seed=5)
    prompt = torch.randint(
        0, 7, (2, n_prompt), generator=torch.Generator().manual_seed(6)
    )
    _all_decoders_match_the_cropping_by_hand(model, model.full_logits, 6, 7, prompt, 15)


def test_cropping_costs_a_full_window_per_token_only_once_the_table_is_full():
    """The calls to ``step``: the prompt, then one cached token per step while the
    context fits the 6 positions, then a fresh pass over 6 ids per token. Within the
    table, the cached loop is the one without cropping."""
    model = TabledToyLM(6, vocab_size=7, seed=5)
    prompt = torch.tensor([[1, 2], [3, 4]])
    out = generate(model, prompt, 15, temperature=0)
    assert model.calls == [(2, 2)] + [(2, 1)] * 4 + [(2, 6)] * 10
    assert out.shape == (2, 17)

    model.calls.clear()
    within = generate(model, prompt, 5, temperature=0)  # 2 + 5 - 1 = 6 positions
    assert model.calls == [(2, 2)] + [(2, 1)] * 4
    assert torch.equal(within, generate(model, prompt, 5, temperature=0, crop=False))
    assert torch.equal(within, out[:, :7])

    model.calls.clear()
    beam_search(model, prompt, 9, beam_size=3)
    assert model.calls == [(2, 2)] + [(6, 1)] * 4 + [(6, 6)] * 4
    for decode in (generate, beam_search):
        with pytest.raises(TypeError, match="crop must be True or False"):
            decode(model, prompt, 3, crop=1)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_gpt_decoding_past_the_table_equals_the_cropped_forward(positions):
    cfg = TransformerConfig(
        vocab_size=20, d_model=16, n_heads=2, n_layers=2, max_len=8, positions=positions
    )
    torch.manual_seed(0)
    model = GPT(cfg).eval().double()  # float64: cached and full passes agree to 1e-15
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for n_prompt in (3, 11):
            prompt = torch.randint(0, 20, (2, n_prompt), generator=gen)
            _all_decoders_match_the_cropping_by_hand(model, model, 8, 20, prompt, 14)


@needs_models
def test_t5_has_no_table_and_decodes_past_max_len_uncropped():
    from lib.models import T5

    config = TransformerConfig(
        vocab_size=37, d_model=32, n_heads=4, n_layers=2, n_decoder_layers=2,
        positions="t5", bias=False, max_len=8,
    )  # fmt: skip
    torch.manual_seed(0)
    model = T5(config).eval().double()
    src = torch.randint(1, 37, (3, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        bound = model.bind(src)
        start = torch.full((3, 1), bound.start_id)
        greedy = generate(bound, start, 12, temperature=0)
        assert torch.equal(
            greedy, generate(bound, start, 12, temperature=0, crop=False)
        )
        ids = start  # the whole target, never cropped
        for _ in range(12):
            next_id = model(src, ids)[:, -1].argmax(dim=-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
        assert torch.equal(greedy, ids)


def test_speculative_decoding_refuses_tables_it_would_outgrow():
    """Speculative decoding never crops: target and draft tables of different
    lengths are each checked, up front."""
    small, large = (
        GPT(
            TransformerConfig(
                vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=n
            )
        )
        for n in (8, 16)
    )
    prompt = torch.tensor([1, 2, 3])
    for target, draft in ((small, large), (large, small)):
        assert speculative_generate(target, draft, prompt, 6, temperature=0).shape == (
            9,
        )
        with pytest.raises(ValueError, match="need 9 positions.*max_len=8: lower"):
            speculative_generate(target, draft, prompt, 7, temperature=0)


# -- issue 32: a tiny temperature is named, not blamed on the logits -------------------


class _Loud:
    """A model whose logits are large and finite: /temperature overflows float32 early."""

    vocab_size = 5

    def step(self, ids, cache=None):
        row = torch.tensor([0.0, 1e3, 2e3, 0.0, 0.0])
        logits = row.expand(ids.shape[0], ids.shape[1], 5)
        return logits.clone(), (cache or 0) + ids.shape[1]


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_a_temperature_below_float32s_range_is_refused_by_name(temperature):
    with pytest.raises(ValueError, match=r"temperature=.* is too small.*temperature=0"):
        generate(_Loud(), torch.tensor([1, 2]), 3, temperature=temperature)
    with pytest.raises(ValueError, match="temperature=.* is too small"):
        sample_next_token(torch.zeros(1, 5), temperature=temperature)


def test_a_temperature_that_overflows_the_logits_names_temperature_not_the_logits():
    # 2e3 / 1e-36 overflows float32 to inf: the logits are fine, the temperature is not
    with pytest.raises(ValueError, match=r"temperature=1e-36 is too small") as info:
        generate(_Loud(), torch.tensor([1, 2]), 3, temperature=1e-36)
    assert "logits hold NaN" not in str(info.value)
    # logits that are really bad are still blamed
    bad = torch.tensor([[0.0, float("nan"), 1.0]])
    with pytest.raises(ValueError, match="logits hold NaN"):
        sample_next_token(bad, temperature=1.0)
    # a small temperature that does not overflow is simply near-greedy
    out = generate(_Loud(), torch.tensor([1, 2]), 3, temperature=1e-6)
    assert out.tolist() == [1, 2, 2, 2, 2]
