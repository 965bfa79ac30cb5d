# This file is generated from chapters/07-4-decoding.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/07-4-decoding.md, section "The step protocol".
"""Text generation (chapter 7 of the course): greedy, sampling, beams,
speculation.

Every function here works on any model with the *step protocol*::

    logits, cache = model.step(ids, cache)

``ids`` is ``(batch new)``, ``cache`` is ``None`` on the first call and
``logits`` is ``(batch new vocab)``. The returned cache has ``.seq_len``
(positions held), ``.select(indices)`` (a cache of rows ``indices`` of this
one: beam search reorders and duplicates rows with it) and ``.crop(length)``
(a cache of the first ``length`` positions: speculative decoding rolls
rejected tokens back with it).

Prompts are ``(batch seq)`` or ``(seq,)`` integer ids; each function returns
the prompt followed by the new ids, with the prompt's number of axes. For an
encoder-decoder, bind the source first (``t5.bind(src_ids)``) and pass the
decoder's start token as the prompt.

* :func:`top_k_filter`, :func:`top_p_filter`, :func:`next_token_probs`,
  :func:`sample_next_token`: from logits to the next token.
* :func:`generate`: greedy decoding (``temperature=0``) and sampling, with
  stop tokens.
* :func:`length_penalty`, :func:`beam_search`: beam search with GNMT's
  length penalty.
* :func:`residual_distribution`, :class:`TorchSampler`,
  :func:`speculative_generate`: speculative decoding with a draft model; its
  output distribution is the target's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from einops import rearrange
from torch.nn.utils.rnn import pad_sequence

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "top_k_filter",
    "top_p_filter",
    "next_token_probs",
    "sample_next_token",
    "generate",
    "length_penalty",
    "beam_search",
    "translate",
    "residual_distribution",
    "TorchSampler",
    "speculative_generate",
]


# From chapters/07-4-decoding.md, section "The step protocol".
def _check_knobs(temperature=1.0, top_k=None, top_p=None, generator=None, **logits):
    """The sampling options; ``logits=`` or ``finite_logits=`` (whose values
    are read: no NaN or +inf, no row all ``-inf``) a floating tensor ``(...
    vocab)``."""
    check.finite_float("temperature", temperature, low=0.0, hint="0 means greedy")
    if 0 < temperature < _TINY:
        raise ValueError(_too_cold(temperature))
    if top_k is not None:
        check.positive_int("top_k", top_k)
    if top_p is not None:
        check.finite_float("top_p", top_p, low=0.0, high=1.0, low_open=True)
    check.instance("generator", generator, _GENERATOR, what="a torch.Generator or None")
    for kind, x in logits.items():
        check.tensor("logits", x, "... vocab", floating=True)
        if x.shape[-1] == 0 or (kind == "finite_logits" and bool(_bad_rows(x).any())):
            raise ValueError(_BAD_LOGITS if x.shape[-1] else "logits has no vocab axis")


_GENERATOR = (torch.Generator, type(None))
# below float32's smallest normal number, logits / temperature overflow
_TINY = torch.finfo(torch.float32).tiny


def _too_cold(temperature: float) -> str:
    return (
        f"temperature={temperature!r} is too small: logits / temperature "
        "overflow float32; pass temperature=0 for greedy decoding"
    )


_BAD_LOGITS = (
    "logits hold NaN or +inf, or a row whose every logit is -inf (every "
    "token filtered out): no distribution to choose from"
)


def _bad_rows(logits: torch.Tensor) -> torch.Tensor:
    """``(...)`` booleans, computed on the device without reading them: a
    row's largest logit is NaN (max propagates NaN), +inf, or -inf (the
    whole row is)."""
    return ~logits.amax(dim=-1).isfinite()


def _vocab_size(model: Any) -> int | None:
    for owner in (model, getattr(model, "config", None), getattr(model, "cfg", None)):
        size = getattr(owner, "vocab_size", None)
        if isinstance(size, int) and not isinstance(size, bool):
            return size
    return None


def _check_prompt(
    prompt_ids, model, max_new_tokens, crop=None
) -> tuple[torch.Tensor, bool, int | None]:
    """The prompt as ``(batch seq)`` int64, whether it came as ``(seq,)``,
    and the window to crop the context to (the position table's length,
    or None: no cropping needed); the model, ``max_new_tokens`` and
    ``crop`` too (None: this loop cannot crop)."""
    if not callable(getattr(model, "step", None)):
        raise TypeError(f"model needs step(ids, cache), got {type(model).__name__}")
    hint = "a list of ids becomes one with torch.tensor(ids)"
    check.tensor("prompt_ids", prompt_ids, integer=True, hint=hint)
    shape = tuple(prompt_ids.shape)
    if prompt_ids.dim() not in (1, 2):
        raise ValueError(f"prompt_ids must be (batch, seq) or (seq,), got {shape}")
    if 0 in shape:  # for an encoder-decoder, the decoder's start token
        raise ValueError(f"prompt_ids is empty ({shape}): give at least one token")
    ids = prompt_ids if prompt_ids.dim() == 2 else rearrange(prompt_ids, "seq -> 1 seq")
    check.ids_in_range("prompt_ids", ids, _vocab_size(model))
    check.int_at_least("max_new_tokens", max_new_tokens, 0)
    if crop is not None:
        check.boolean("crop", crop)
    # a decoder-only model's prompt and new tokens share its position
    # table: crop, or refuse now, not after hundreds of tokens (the last
    # new token is never fed back)
    cfg = getattr(model, "cfg", None)
    limit = getattr(cfg, "max_positions", None)
    needed = ids.shape[1] + max_new_tokens - 1
    if limit is None or needed <= limit:
        return ids.long(), prompt_ids.dim() == 1, None
    if not crop:
        hint = (
            f"pass crop=True to decode with the last {limit} ids as context, "
            if crop is False
            else ""
        )
        raise ValueError(
            f"a prompt of {ids.shape[1]} tokens and max_new_tokens="
            f"{max_new_tokens} need {needed} positions, but the model's "
            f"{cfg.positions} position table has max_len={limit}: {hint}"
            "lower max_new_tokens or shorten the prompt, or build the "
            "model with a larger max_len"
        )
    return ids.long(), prompt_ids.dim() == 1, limit


def _first_step(model: Any, ids: torch.Tensor, ids_to_check: dict) -> tuple:
    """The prompt's step, its logits checked once: ``(batch new vocab)``,
    finite rows, and the ids in ``ids_to_check`` (prompt, stop and pad ids)
    inside its vocabulary."""
    logits, cache = model.step(ids, None)
    batch, new = ids.shape
    hint = "model.step must return logits (batch, new, vocab)"
    check.tensor("logits", logits, "batch new vocab", batch=batch, new=new, hint=hint)
    for name, values in ids_to_check.items():
        check.ids_in_range(name, values, logits.shape[-1])
    return logits, cache


def _trusted_step(model: Any):
    """``model.step`` for the ids a loop chose itself: called with trust on,
    so a model of ``lib.models`` skips the checks of its ids and cache."""

    def step(ids: torch.Tensor, cache: Any) -> tuple:
        with check.trusting():
            return model.step(ids, cache)

    return step


def _stop_and_pad(stop_ids: Iterable[int], pad_id: int | None, ids, model: Any):
    """Stop ids as a tensor and the pad id: ``pad_id``, else the first stop
    id, else 0; all checked against the vocabulary when the model gives its
    size."""
    kinds, what = (list, tuple, range, torch.Tensor), "a list of ints"
    check.instance("stop_ids", stop_ids, kinds, what=what)
    stops = [check.int_at_least(f"stop_ids[{k}]", i, 0) for k, i in enumerate(stop_ids)]
    if pad_id is not None:
        pad_id = check.int_at_least("pad_id", pad_id, 0)
    fill = pad_id if pad_id is not None else (stops[0] if stops else 0)
    stops = torch.tensor(stops, dtype=torch.long, device=ids.device)
    fills = torch.tensor([fill], device=ids.device)
    vocab = _vocab_size(model)
    if vocab is not None:
        check.ids_in_range("stop_ids", stops, vocab)
        check.ids_in_range("pad_id", fills, vocab)
    return (stops, fill, {"prompt_ids": ids, "stop_ids": stops, "pad_id": fills})


def _output(ids: torch.Tensor, squeeze: bool) -> torch.Tensor:
    return rearrange(ids, "1 seq -> seq") if squeeze else ids


def _rows(flags: torch.Tensor) -> list[int]:
    return flags.nonzero().flatten().tolist()


# From chapters/07-4-decoding.md, section "Temperature, top-k and top-p".
def _check_top_k(logits: torch.Tensor, top_k: int) -> None:
    _check_knobs(top_k=top_k, logits=logits)


def _check_top_p(logits: torch.Tensor, top_p: float) -> None:
    _check_knobs(top_p=top_p, logits=logits)


def _check_probs(
    logits: torch.Tensor, *, temperature=1.0, top_k=None, top_p=None
) -> None:
    _check_knobs(temperature, top_k, top_p, finite_logits=logits)


def _check_sample(
    logits: torch.Tensor, *, temperature=1.0, top_k=None, top_p=None, generator=None
) -> None:
    check.tensor("logits", logits, "batch vocab")
    _check_knobs(temperature, top_k, top_p, generator, finite_logits=logits)


# From chapters/07-4-decoding.md, section "Temperature, top-k and top-p".
@check.front_door(_check_top_k)
def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep each row's ``top_k`` largest logits, set the others to ``-inf``.

    Shapes: ``logits`` ``(... vocab)`` -> ``(... vocab)``. Logits tied with
    the k-th largest are kept too.
    """
    if top_k >= logits.shape[-1]:
        return logits
    kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


@check.front_door(_check_top_p)
def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the fewest most probable tokens holding
    ``top_p`` mass.

    Shapes: ``logits`` ``(... vocab)`` -> ``(... vocab)``, removed tokens at
    ``-inf``. A token is kept when the tokens ranked above it hold less than
    ``top_p`` of the probability, so the most probable token always stays;
    ``top_p=1`` keeps everything.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.float().softmax(dim=-1)
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    remove_sorted = mass_above >= top_p
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


@check.front_door(_check_probs)
def next_token_probs(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The sampling distribution: temperature, then top-k, then top-p, then
    softmax.

    Shapes: ``logits`` ``(... vocab)`` -> probabilities ``(... vocab)``, in
    float32 or wider. ``temperature=0`` gives a one-hot distribution on the
    argmax (greedy). Logits with NaN or +inf, or a row that is all ``-inf``,
    are a ``ValueError``.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if temperature == 0:
        one_hot = torch.zeros_like(logits, dtype=dtype)
        return one_hot.scatter(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    logits = logits.to(dtype) / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return logits.softmax(dim=-1)


@check.front_door(_check_sample)
def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row: ``logits`` ``(batch vocab)`` -> ids ``(batch,)``.

    ``temperature=0`` takes the argmax; otherwise one draw from
    :func:`next_token_probs`, made with ``generator`` (reproducible when
    seeded; a CPU generator also serves logits on a GPU, drawing on the
    CPU).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = next_token_probs(logits, **knobs)
    if generator is not None and generator.device != probs.device:
        probs = probs.to(generator.device)
    try:
        token = torch.multinomial(probs, 1, generator=generator)
        token = token.to(logits.device)
    except RuntimeError as error:  # NaN or inf in probs: name the cause
        # finite logits: the division by the temperature overflowed
        cause = _BAD_LOGITS
        if not bool(_bad_rows(logits).any()):
            cause = _too_cold(temperature)
        raise ValueError(f"{cause} ({error})") from None
    return rearrange(token, "batch 1 -> batch")


# From chapters/07-4-decoding.md, section "The generation loop".
def _advance(step, new_ids, cache, context, window):
    """Logits ``(batch new vocab)`` and cache after ``new_ids`` ``(batch
    new)``: one cached step while the context fits ``window`` (None:
    always), else a fresh pass over the last ``window`` ids of ``context``
    ``(batch seq)``, which ends with ``new_ids``."""
    if window is None or cache.seq_len + new_ids.shape[1] <= window:
        return step(new_ids, cache)
    return step(context[:, -window:], None)


# From chapters/07-4-decoding.md, section "The generation loop".
@torch.no_grad()  # decoding needs no gradients
def generate(
    model: Any,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Iterable[int] = (),
    pad_id: int | None = None,
    generator: torch.Generator | None = None,
    crop: bool = True,
) -> torch.Tensor:
    """Greedy decoding (``temperature=0``) or sampling, with the model's
    cache.

    Shapes: ``prompt_ids`` ``(batch seq)`` or ``(seq,)`` -> the prompt
    followed by up to ``max_new_tokens`` new ids, ``(batch seq+new)`` or
    ``(seq+new,)``. A row ends at the first of ``stop_ids`` it produces
    (kept in the output); after that it holds ``pad_id`` (default: the first
    stop id, or 0 without stop ids). ``generator`` makes sampling
    reproducible. Logits with NaN or +inf, or a row all ``-inf``, are a
    ``ValueError``, never a token.

    The prompt goes through ``model.step`` (checked); the loop's own tokens
    through ``model.step`` with trust on (no checks of the loop's own ids).

    Past the model's position table (learned, sinusoidal, RoPE:
    ``model.cfg.max_positions``), ``crop=True`` keeps the last ``max_len``
    ids as context, as nanoGPT does. The cache cannot slide with that
    window (in every layer above the first, the cached keys were computed
    from tokens that have left it),
    so once it is full each new token is a fresh pass over ``max_len``
    tokens instead of one cached step: O(max_len) tokens per step instead
    of 1. ``crop=False`` refuses such a call up front. Within the table,
    or without one (ALiBi, T5), the cached loop is unchanged.
    """
    ids, squeeze, window = _check_prompt(prompt_ids, model, max_new_tokens, crop)
    _check_knobs(temperature, top_k, top_p, generator)
    stops, fill, to_check = _stop_and_pad(stop_ids, pad_id, ids, model)
    if max_new_tokens == 0:
        return _output(ids.clone(), squeeze)

    # the ids the model sees: all of them, or the last `window`
    context = ids if window is None else ids[:, -window:]
    logits, cache = _first_step(model, context, to_check)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    # each step's largest logit per row (0 for a finished row), read once
    # at the end: NaN, +inf or -inf (a row all -inf) there is a bad row
    peaks, new_tokens, has_stops = [], [], len(stops) > 0
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    # the knobs are checked and the logits are read below: the loop's own
    # calls (the sampler, model.step on its own ids) skip their checks
    with check.trusting():
        for position in range(max_new_tokens):
            last = logits[:, -1]
            token = sample_next_token(last, **knobs, generator=generator)
            if has_stops:  # only stop ids finish a row
                peaks.append(last.amax(dim=-1).masked_fill(finished, 0.0))
                token = token.masked_fill(finished, fill)
                finished = finished | torch.isin(token, stops)
            else:
                peaks.append(last.amax(dim=-1))
            new_tokens.append(token)
            if has_stops and bool(finished.all()):
                break
            if position + 1 < max_new_tokens:
                column = token.unsqueeze(1)  # (batch) -> (batch 1)
                if window is not None:
                    context = torch.cat([context, column], dim=1)
                    context = context[:, -window:]
                logits, cache = _advance(model.step, column, cache, context, window)
    bad = ~torch.stack(peaks).isfinite().all(dim=0)
    if bool(bad.any()):
        raise ValueError(f"{_BAD_LOGITS}: model.step gave them for rows {_rows(bad)}")
    generated = rearrange(torch.stack(new_tokens), "new batch -> batch new")
    return _output(torch.cat([ids, generated], dim=1), squeeze)


# From chapters/07-4-decoding.md, section "Beam search".
def _last_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``(batch vocab)`` at the last position, in float32
    or wider."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    return logits[:, -1].to(dtype).log_softmax(dim=-1)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's length normaliser ``((5 + length) / 6) ** alpha`` (Wu et al.,
    2016)."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()  # decoding needs no gradients
def beam_search(
    model: Any,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    beam_size: int = 4,
    length_alpha: float = 0.6,
    stop_ids: Iterable[int] = (),
    pad_id: int | None = None,
    return_scores: bool = False,
    crop: bool = True,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The most probable continuation found by a beam of ``beam_size``
    hypotheses.

    A hypothesis's score is its summed log-probability divided by
    :func:`length_penalty` of its new tokens (``length_alpha=0``: no
    normalisation). A candidate ending with one of ``stop_ids`` among the
    ``beam_size`` best of a step is finished; the ``beam_size`` best other
    candidates go on. With ``beam_size=1`` and no stop tokens this is greedy
    decoding.

    Shapes: ``prompt_ids`` ``(batch seq)`` or ``(seq,)`` -> the prompt and
    the best continuation of each row, ``(batch seq+new)``, shorter rows
    padded with ``pad_id`` (default: the first stop id, or 0 without stop
    ids; a pad id is always a token of the vocabulary); with
    ``return_scores``, also the normalised scores ``(batch,)``. Logits with
    NaN or +inf, or a row all ``-inf``, are a ``ValueError``.

    ``crop``: as in :func:`generate`, past the position table each beam
    sees its last ``max_len`` ids, in a fresh pass over them per step
    (O(max_len) tokens per beam and step instead of 1); ``crop=False``
    refuses up front.
    """
    ids, squeeze, window = _check_prompt(prompt_ids, model, max_new_tokens, crop)
    check.positive_int("beam_size", beam_size)
    alpha = check.finite_float("length_alpha", length_alpha)
    check.boolean("return_scores", return_scores)
    stops, fill, to_check = _stop_and_pad(stop_ids, pad_id, ids, model)
    batch, device = ids.shape[0], ids.device
    if max_new_tokens == 0:
        out = _output(ids.clone(), squeeze)
        return (out, torch.zeros(batch, device=device)) if return_scores else out

    context = ids if window is None else ids[:, -window:]
    logits, cache = _first_step(model, context, to_check)
    step = _trusted_step(model)
    vocab = logits.shape[-1]
    log_probs = rearrange(_last_log_probs(logits), "b vocab -> b 1 vocab")
    # live beams' summed log-probs
    scores = torch.zeros_like(log_probs[:, :, 0])
    sequences = ids  # ((batch beams) seq): one row per live beam
    finished: list[list[tuple[float, torch.Tensor]]] = [[] for _ in range(batch)]
    # rows whose best hypothesis can no longer change
    done = [False] * batch
    batch_offsets = rearrange(torch.arange(batch, device=device), "batch -> batch 1")
    # the largest penalty a live beam can still reach, at length 1 or
    # max_new_tokens
    best_reachable = max(length_penalty(n, alpha) for n in (1, max_new_tokens))

    live = scores == 0  # (b beams): the beams whose log-probs count
    # new tokens after this step
    for length in range(1, max_new_tokens + 1):
        # unusable logits (NaN in the log-probs) of a live beam: the loop
        # reads anyway
        if bool((_bad_rows(log_probs) & live).any()):
            raise ValueError(f"{_BAD_LOGITS}: model.step gave them at step {length}")
        n_beams = scores.shape[1]
        candidates = rearrange(
            rearrange(scores, "b beams -> b beams 1") + log_probs,
            "b beams vocab -> b (beams vocab)",
        )
        n_candidates = min(beam_size * (1 + len(stops)), candidates.shape[1])
        # best first
        top_scores, top_index = candidates.topk(n_candidates, dim=-1)
        parent_rows = batch_offsets * n_beams + top_index // vocab
        tokens = top_index % vocab
        ends = torch.isin(tokens, stops)

        # Candidates that end, among the beam_size best of the row, are
        # finished.
        lp = length_penalty(length, alpha)
        newly_finished = ends[:, :beam_size] & top_scores[:, :beam_size].isfinite()
        for b, j in newly_finished.nonzero().tolist():
            if done[b]:
                continue
            ended = torch.cat([sequences[parent_rows[b, j]], tokens[b, j : j + 1]])
            finished[b].append((top_scores[b, j].item() / lp, ended))
            finished[b] = sorted(finished[b], key=lambda h: -h[0])[:beam_size]

        # The beam_size best candidates that do not end go on (-inf pads a
        # short list).
        live = top_scores.masked_fill(ends, float("-inf"))
        if live.shape[1] < beam_size:
            pad = (0, beam_size - live.shape[1])
            live = torch.nn.functional.pad(live, pad, value=float("-inf"))
            parent_rows = torch.nn.functional.pad(parent_rows, pad)
            tokens = torch.nn.functional.pad(tokens, pad)
        keep = live.argsort(dim=-1, descending=True, stable=True)[:, :beam_size]
        scores = live.gather(1, keep)
        rows = rearrange(parent_rows.gather(1, keep), "b beams -> (b beams)")
        tokens = tokens.gather(1, keep)
        new_column = rearrange(tokens, "b beams -> (b beams) 1")
        sequences = torch.cat([sequences[rows], new_column], dim=1)

        # A row is done when its best live beam cannot beat its worst kept
        # hypothesis.
        best_live = (scores[:, 0] / best_reachable).tolist()
        for b in range(batch):
            if best_live[b] == -math.inf or (
                len(finished[b]) >= beam_size and best_live[b] <= finished[b][-1][0]
            ):
                done[b] = True
        if all(done) or length == max_new_tokens:
            break
        done_rows = torch.tensor(done, device=device)
        scores = scores.masked_fill(rearrange(done_rows, "b -> b 1"), float("-inf"))
        cache = cache.select(rows)
        logits, cache = _advance(step, new_column, cache, sequences, window)
        live = rearrange(~done_rows, "b -> b 1").expand(-1, beam_size)
        log_probs = _last_log_probs(logits)  # ((batch beams) vocab)
        log_probs = rearrange(log_probs, "(b beams) vocab -> b beams vocab", b=batch)

    best, final_scores = ([], (scores / length_penalty(length, alpha)).tolist())
    for b in range(batch):
        hypotheses = list(finished[b])
        if not done[b]:  # the live beams reached max_new_tokens
            for k, score in enumerate(final_scores[b]):
                if score > -math.inf:
                    hypotheses.append((score, sequences[b * beam_size + k]))
        if not hypotheses:  # nothing finite anywhere: keep the first beam
            hypotheses = [(-math.inf, sequences[b * beam_size])]
        best.append(max(hypotheses, key=lambda h: h[0]))
    width = max(len(seq) for _, seq in best)
    out = torch.full((batch, width), fill, dtype=torch.long, device=device)
    for b, (_, seq) in enumerate(best):
        out[b, : len(seq)] = seq
    out = _output(out, squeeze)
    if return_scores:
        best_scores = [score for score, _ in best]
        return out, torch.tensor(best_scores, dtype=scores.dtype, device=device)
    return out


# From chapters/07-4-decoding.md, section "Translating: beam search over an encoder-decoder".
@torch.no_grad()
def translate(
    model: Any,
    tokenizer: Any,
    sentences: list[str],
    *,
    pad_id: int,
    eos_id: int,
    beam_size: int = 4,
    max_new_tokens: int | None = None,
    chunk: int = 64,
) -> list[str]:
    """Each of ``sentences`` through an encoder-decoder ``model`` (a T5):
    its ids ``tokenizer.encode(sentence) + [eos_id]``, right-padded with
    ``pad_id``, encoded once by ``model.bind``; then :func:`beam_search`
    (``beam_size=1``: a one-wide beam, which the length penalty may carry
    past the eos greedy decoding would stop at) from ``pad_id`` until
    ``eos_id``, for
    at most ``max_new_tokens`` (default: twice the longest source plus 10,
    at most the model's ``max_len``). Returns the decoded texts, without
    the special ids; ``chunk`` sentences are decoded at a time."""
    if isinstance(sentences, str):
        raise TypeError("translate takes a list of sentences; for one: [text]")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # no dropout while decoding
    texts = []
    for first in range(0, len(sentences), chunk):
        rows = [
            torch.tensor([*tokenizer.encode(text), eos_id])
            for text in sentences[first : first + chunk]
        ]
        # (batch src), right-padded
        src = pad_sequence(rows, batch_first=True, padding_value=pad_id)
        src = src.to(device)
        bound = model.bind(src, src != pad_id)
        start = torch.full((len(rows), 1), pad_id, device=device)
        n_new = max_new_tokens
        if n_new is None:
            n_new = min(2 * src.shape[1] + 10, model.cfg.max_len)
        ids = beam_search(
            bound, start, n_new, beam_size=beam_size, stop_ids=[eos_id], pad_id=pad_id
        )
        for row in ids[:, 1:].tolist():  # the start id left out
            ended = row[: row.index(eos_id)] if eos_id in row else row
            texts.append(tokenizer.decode([i for i in ended if i != pad_id]))
    model.train(was_training)
    return texts


# From chapters/07-4-decoding.md, section "Speculative decoding".
def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``max(0, p - q)`` normalised: where to sample after a rejected draft
    token.

    Shapes: ``p`` (target) and ``q`` (draft) ``(... vocab)`` -> ``(...
    vocab)``. Where ``p <= q`` everywhere (no rejection is then possible),
    returns ``p``.
    """
    residual = (p - q).clamp(min=0.0)
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp(min=1e-30), p)


class TorchSampler:
    """The random choices of :func:`speculative_generate`, drawn with a
    torch.Generator.

    Any object with these two methods can replace it (the chapter passes one
    that enumerates all choices to compute the exact output distribution).
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator
        self.device = generator.device if generator is not None else torch.device("cpu")

    def categorical(self, probs: torch.Tensor) -> int:
        """One draw from ``probs`` ``(vocab,)``."""
        draw = torch.multinomial(probs.to(self.device), 1, generator=self.generator)
        return int(draw)

    def accept(self, probability: float) -> bool:
        """True with the given probability."""
        if probability >= 1.0:
            return True
        uniform = torch.rand((), generator=self.generator, device=self.device)
        return float(uniform) < probability


# From chapters/07-4-decoding.md, section "Speculative decoding".
def _check_speculative(
    target: Any,
    draft: Any,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    n_draft: int,
    return_stats: bool,
) -> tuple[torch.Tensor, bool]:
    """The prompt as ``(1 seq)``, fitting both models, and whether it came
    as ``(seq,)``; ``n_draft`` and ``return_stats`` too."""
    ids, squeeze, _ = _check_prompt(prompt_ids, target, max_new_tokens)
    _check_prompt(prompt_ids, draft, max_new_tokens)
    hint = "speculative_generate decodes one sequence (batch 1)"
    check.tensor("prompt_ids", ids, "batch seq", batch=1, hint=hint)
    check.positive_int("n_draft", n_draft)
    check.boolean("return_stats", return_stats)
    return ids, squeeze


def _check_sampler(sampler: Any) -> None:
    if not all(callable(getattr(sampler, m, None)) for m in ("categorical", "accept")):
        raise TypeError("sampler needs categorical(probs) and accept(probability)")


# From chapters/07-4-decoding.md, section "Speculative decoding".
@torch.no_grad()  # decoding needs no gradients
def speculative_generate(
    target: Any,
    draft: Any,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    n_draft: int = 4,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Iterable[int] = (),
    generator: torch.Generator | None = None,
    sampler: Any = None,
    return_stats: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, int]]:
    """Sample from ``target`` with proposals from ``draft``: same output,
    fewer calls.

    Each round, ``draft`` proposes ``n_draft`` tokens, ``target`` scores
    them in one ``step``, and each proposal ``x`` is accepted with
    probability ``min(1, p(x)/q(x))``; the first rejection is replaced by a
    draw from :func:`residual_distribution`, and if all are accepted the
    target adds one more token. ``temperature``, ``top_k`` and ``top_p``
    shape both models' distributions (``temperature=0``: greedy, the
    target's greedy tokens). The output has the distribution of sampling
    from ``target`` alone.

    One sequence at a time: ``prompt_ids`` ``(1 seq)`` or ``(seq,)`` -> the
    prompt and up to ``max_new_tokens`` new ids, ending at the first of
    ``stop_ids``. The random choices are made by ``sampler`` (default
    :class:`TorchSampler` of ``generator``). ``return_stats`` also returns
    counts: target and draft calls; drafted (``proposed``), ``examined``
    and ``accepted`` tokens (drafts after a rejection are never examined,
    so ``accepted / examined`` estimates the acceptance rate).

    It does not crop: a prompt and ``max_new_tokens`` that outgrow either
    model's position table are refused up front (the target scores several
    proposals in one pass, and past its table each would need a window of
    its own).
    """
    ids, squeeze = _check_speculative(
        target, draft, prompt_ids, max_new_tokens, n_draft, return_stats
    )
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    _check_knobs(**knobs, generator=generator)
    stops, _, to_check = _stop_and_pad(stop_ids, None, ids, target)
    stops = set(stops.tolist())
    sampler = TorchSampler(generator) if sampler is None else sampler
    _check_sampler(sampler)
    stats = {
        "target_calls": 0,
        "draft_calls": 0,
        "proposed": 0,
        "examined": 0,
        "accepted": 0,
    }

    def probs(logits: torch.Tensor) -> torch.Tensor:
        # the loop reads every distribution anyway
        if bool(_bad_rows(logits).any()):
            raise ValueError(f"{_BAD_LOGITS}: target or draft gave them")
        with check.trusting():  # the knobs were checked at the door
            return next_token_probs(logits, **knobs)

    # the target's, once known; the draft must agree
    vocab = [_vocab_size(target)]

    def feed(model: Any, new: list[int], cache: Any) -> tuple[torch.Tensor, Any]:
        step_ids = torch.tensor([new], dtype=torch.long, device=ids.device)
        # the prompt: checked once, and the ids against the logits
        if cache is None:
            logits, cache = _first_step(model, step_ids, to_check)
        else:
            logits, cache = _trusted_step(model)(step_ids, cache)
        logits = logits[0]
        if vocab[0] is None:
            vocab[0] = logits.shape[-1]
        elif logits.shape[-1] != vocab[0]:
            sizes = f"{vocab[0]} and {logits.shape[-1]} logits"
            raise ValueError(f"target and draft disagree on the vocabulary: {sizes}")
        return logits, cache

    tokens = ids[0].tolist()
    target_cache = draft_cache = None
    if max_new_tokens == 0:
        out = _output(ids.clone(), squeeze)
        return (out, stats) if return_stats else out
    # every token but the last goes in now: the last is pending
    if len(tokens) > 1:
        target_cache = feed(target, tokens[:-1], None)[1]
        draft_cache = feed(draft, tokens[:-1], None)[1]
    n_target = n_draft_seen = len(tokens) - 1  # positions each cache holds
    while len(tokens) - ids.shape[1] < max_new_tokens:
        gamma = min(n_draft, max_new_tokens - (len(tokens) - ids.shape[1]) - 1)
        proposed, draft_probs = [], []
        new_for_draft = tokens[n_draft_seen:]
        for _ in range(gamma):
            logits, draft_cache = feed(draft, new_for_draft, draft_cache)
            n_draft_seen += len(new_for_draft)
            draft_probs.append(probs(logits[-1]))
            proposed.append(sampler.categorical(draft_probs[-1]))
            new_for_draft = proposed[-1:]
        stats["draft_calls"] += gamma

        logits, target_cache = feed(target, tokens[n_target:] + proposed, target_cache)
        target_probs = probs(logits[-(gamma + 1) :])  # (gamma+1 vocab)
        stats["target_calls"] += 1
        stats["proposed"] += gamma

        accepted: list[int] = []
        for i, token in enumerate(proposed):
            p, q = target_probs[i], draft_probs[i]
            if sampler.accept(min(1.0, (p[token] / q[token]).item())):
                accepted.append(token)
            else:
                accepted.append(sampler.categorical(residual_distribution(p, q)))
                break
        else:
            accepted.append(sampler.categorical(target_probs[gamma]))
        n_kept = len(accepted) - 1  # proposals accepted as they were
        # tested: up to and including the first rejected one
        stats["examined"] += min(len(accepted), gamma)
        stats["accepted"] += n_kept

        # Roll both caches back to the tokens that stay: what came before
        # the round and the accepted proposals.
        valid = len(tokens) + n_kept
        if n_target + 1 + gamma > valid:
            target_cache = target_cache.crop(valid)
        n_target = valid
        if n_draft_seen > valid:
            draft_cache, n_draft_seen = draft_cache.crop(valid), valid
        for token in accepted:
            tokens.append(token)
            if token in stops:
                break
        if tokens[-1] in stops:
            break

    out = _output(torch.tensor([tokens], dtype=torch.long, device=ids.device), squeeze)
    return (out, stats) if return_stats else out
