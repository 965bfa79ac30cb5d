"""Checkers for the exercises of chapter 7 (pages 7.1 to 7.5), numbered per page.

Each checker runs the reader's function on seeded inputs, compares it with a reference,
and names the typical mistake when it recognises one: spans appended instead of put
back, sentinels left in the text, spans given to the wrong sentinel; a min-p threshold
on the logits, or not scaled by the top probability, probabilities returned instead of
logits, removed tokens at 0 instead of -inf; the total-variation distance without its
1/2, an off-by-one in the geometric series, 0/0 when the two models agree; in MLA's
decoupled RoPE scores, a key left unrotated, queries rotated from position 0 instead of
their own positions, a rotated latent, or a missing content or position term; in
DistilBERT's table, a transposed nn.Linear, q/k/v stacked out of order, the two norms
swapped, a misnamed key; in GPT-2's export, a Conv1D left untransposed, an embedding
transposed, the tied lm_head left out or an untied one copied from the embedding; in a
log-likelihood, a mean instead of a sum, tokens scored with their own position's
logits, raw logits or probabilities, the softmax over the positions; in a
pseudo-log-likelihood, tokens left visible or all masked at once.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping

import torch
from einops import einsum
from torch.nn.utils.rnn import pad_sequence

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_number,
    expect_tensor,
    is_close,
)
from lib.hf_weights import (
    GPT2_SKIPPED,
    StateDictMismatchError,
    concat,
    convert_state_dict,
    expand_rows,
    from_reference,
    load_checked,
    same,
    tied,
)
from lib.models import BERT, GPT, TransformerConfig
from lib.objectives import IGNORE_INDEX, span_corruption_batch
from lib.positions import rope_frequencies, rope_rotate_half

__all__ = [
    "check_restore_spans",
    "check_min_p_filter",
    "check_speculation_rate",
    "rope_at",
    "check_decoupled_rope_scores",
    "distilbert_config",
    "check_distilbert_rows",
    "check_gpt2_export",
    "log_likelihood_reference",
    "check_log_likelihood",
    "pseudo_log_likelihood_reference",
    "check_pseudo_log_likelihood",
]


# -- Exercise 1 of page 7.3 ------------------------------------------------------------


Example = tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]


def _span_examples() -> list[Example]:
    """(original, inputs, targets, sentinel_ids) for rows of several lengths."""
    gen = torch.Generator().manual_seed(7)
    pad_id, sentinel_ids = 99, list(range(100, 140))
    lengths = [2, 3, 9, 20, 57, 120]
    rows = [torch.randint(0, 50, (n,), generator=gen) for n in lengths]
    batch = pad_sequence(rows, batch_first=True, padding_value=pad_id)
    corrupted = span_corruption_batch(
        batch,
        sentinel_ids=sentinel_ids,
        pad_id=pad_id,
        vocab_size=140,  # the ids 0..49, pad 99 and the sentinels 100..139
        generator=gen,
    )
    examples = []
    for row, inputs, targets in zip(rows, corrupted.inputs, corrupted.targets):
        inputs = inputs[inputs != pad_id]
        targets = targets[targets != IGNORE_INDEX]
        examples.append((row, inputs, targets, sentinel_ids))
    return examples


def _spans_of(targets: torch.Tensor, sentinels: set[int]) -> list[list[int]]:
    spans: list[list[int]] = []
    for token in targets.tolist():
        if token in sentinels:
            spans.append([])
        else:
            spans[-1].append(token)
    return spans[:-1]  # the final sentinel opens no span


@checker("Exercise 1 (page 7.3): undo span corruption")
def check_restore_spans(restore: Callable[..., torch.Tensor]) -> None:
    """``restore(inputs, targets, sentinel_ids)``: 1-D ``(in_len,)`` and ``(out_len,)``
    ids of one example, no padding, no eos -> the original ids ``(seq,)``."""
    for original, inputs, targets, sentinel_ids in _span_examples():
        what = f"restore_spans on a sequence of {len(original)} tokens"
        got = call_without_mutation(restore, inputs, targets, sentinel_ids)
        if isinstance(got, list):
            raise ExerciseError(f"{what} returned a list; return a 1-D torch.Tensor")
        if isinstance(got, torch.Tensor) and got.dim() == 1:
            if got.is_floating_point():
                message = f"returned dtype {got.dtype}; ids are integers"
                raise ExerciseError(f"{what} {message}")
            sentinels = set(sentinel_ids)
            left = sorted(sentinels & set(got.tolist()))
            if left:
                raise ExerciseError(
                    f"{what}: the result still holds sentinel ids {left}; each "
                    "sentinel in the input stands for its span, and the sentinels of "
                    "the target only mark where a span starts: none belongs in the "
                    "restored text"
                )
        expect_tensor(got, (len(original),), what)
        if torch.equal(got.long(), original):
            continue
        spans = _spans_of(targets, sentinels)
        kept = [t for t in inputs.tolist() if t not in sentinels]
        appended = kept + [t for span in spans for t in span]
        if got.tolist() == appended:
            raise ExerciseError(
                f"{what}: the spans were appended after the kept tokens; put each span "
                "back where its sentinel stands in the input"
            )
        if Counter(got.tolist()) == Counter(original.tolist()):
            raise ExerciseError(
                f"{what}: the right tokens in the wrong order. Span i is the run of "
                "tokens after sentinel i in the target (sentinel_0 span_0 sentinel_1 "
                "span_1 ...), and it replaces sentinel i in the input"
            )
        expected = original.tolist()
        raise ExerciseError(f"{what} is wrong: expected {expected}, got {got.tolist()}")


# -- Exercise 1 of page 7.4 ------------------------------------------------------------


def _min_p_reference(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def _same_logits(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape or not torch.equal(got.isneginf(), want.isneginf()):
        return False
    finite = want.isfinite()
    return bool(torch.allclose(got[finite].double(), want[finite].double(), atol=1e-5))


@checker("Exercise 1 (page 7.4): min-p filtering")
def check_min_p_filter(min_p_filter: Callable[..., torch.Tensor]) -> None:
    """``min_p_filter(logits, min_p)``: ``(batch vocab)`` -> ``(batch vocab)`` with the
    tokens whose probability is below ``min_p`` times the row's largest at -inf."""
    gen = torch.Generator().manual_seed(3)
    spread = torch.tensor([[0.5], [1.0], [2.0], [4.0]])  # flat to peaked rows
    logits = torch.randn(4, 50, generator=gen) * spread
    logits = logits + 3.0  # all positive: tells a threshold on the logits apart
    for min_p in (0.05, 0.2, 1.0):
        what = f"min_p_filter(logits, {min_p})"
        got = call_without_mutation(min_p_filter, logits, min_p)
        want = _min_p_reference(logits, min_p)
        expect_tensor(got, tuple(logits.shape), what)
        if _same_logits(got, want):
            continue
        probs = logits.softmax(dim=-1)
        if got.is_floating_point() and torch.isnan(got).any():
            raise ExerciseError(
                f"{what} contains NaN; mask the logits with masked_fill(..., -inf) "
                "instead of multiplying them by a 0/1 mask"
            )
        if torch.allclose(got, want.softmax(dim=-1), atol=1e-6):
            raise ExerciseError(
                f"{what} returned probabilities; return the logits, with the removed "
                "tokens at -inf (the sampler applies the softmax)"
            )
        if torch.allclose(got, want.masked_fill(want.isneginf(), 0.0), atol=1e-6):
            raise ExerciseError(
                f"{what}: the removed tokens are 0, not -inf; a logit of 0 is still a "
                "possible token, only -inf gives it probability zero"
            )
        on_logits = logits.amax(dim=-1, keepdim=True) * min_p
        if _same_logits(got, logits.masked_fill(logits < on_logits, float("-inf"))):
            raise ExerciseError(
                f"{what}: the threshold is applied to the logits; min-p compares "
                "probabilities: softmax first, then p < min_p * p_max"
            )
        if _same_logits(got, logits.masked_fill(probs < min_p, float("-inf"))):
            raise ExerciseError(
                f"{what}: the threshold is min_p itself; it must scale with the "
                "confidence: remove tokens with p < min_p * (the row's largest p)"
            )
        keeps = probs >= min_p * probs.amax(dim=-1, keepdim=True)
        if _same_logits(got, logits.masked_fill(keeps, float("-inf"))):
            raise ExerciseError(
                f"{what}: the condition is inverted: keep the tokens with "
                "p >= min_p * p_max and remove the others"
            )
        kept, want_kept = int(got.isfinite().sum()), int(want.isfinite().sum())
        raise ExerciseError(
            f"{what} is wrong: it keeps {kept} tokens, the reference keeps {want_kept}"
        )


# -- Exercise 2 of page 7.4 ------------------------------------------------------------


@checker("Exercise 2 (page 7.4): tokens per target call")
def check_speculation_rate(
    speculation_rate: Callable[[torch.Tensor, torch.Tensor, int], tuple[float, float]],
) -> None:
    """``speculation_rate(p, q, n_draft)``: ``(vocab,)`` twice and an int -> ``(alpha,
    expected tokens per target call)``."""
    gen = torch.Generator().manual_seed(5)
    p = (2 * torch.randn(10, generator=gen, dtype=torch.float64)).softmax(-1)
    q = (2 * torch.randn(10, generator=gen, dtype=torch.float64)).softmax(-1)
    # disjoint supports, and a token that neither model can produce
    disjoint_p = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0], dtype=torch.float64)
    disjoint_q = torch.tensor([0.0, 0.0, 0.3, 0.7, 0.0], dtype=torch.float64)
    cases = [(p, q, 4, "random p and q"), (p, q, 1, "random p and q")]
    cases += [(disjoint_p, disjoint_q, 3, "p and q with disjoint supports")]
    # sums to 1 exactly, so that alpha is exactly 1
    same = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64)
    cases += [(same, same.clone(), 4, "identical p and q")]
    for p_, q_, n_draft, label in cases:
        what = f"speculation_rate on {label}, n_draft={n_draft}"
        try:
            got = call_without_mutation(speculation_rate, p_, q_, n_draft)
        except ZeroDivisionError:
            raise ExerciseError(
                f"{what}: division by zero. With alpha = 1 (the models agree), "
                "(1 - alpha^(n+1)) / (1 - alpha) is 0/0: every proposal is accepted "
                "and a call yields n_draft + 1 tokens; handle that case (or sum the "
                "series)"
            ) from None
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseError(f"{what} should return a pair (alpha, expected_tokens)")
        alpha = expect_number(got[0], "alpha")
        tokens = expect_number(got[1], "the expected number of tokens")
        want_alpha = torch.minimum(p_, q_).sum().item()
        want_tokens = sum(want_alpha**i for i in range(n_draft + 1))

        if math.isnan(alpha):
            raise ExerciseError(
                f"{what}: alpha is NaN; p/q divides 0 by 0 where both are zero. "
                "Note q(x) min(1, p(x)/q(x)) = min(q(x), p(x)): no division needed"
            )
        if not math.isclose(alpha, want_alpha, rel_tol=1e-6, abs_tol=1e-9):
            total_variation = 0.5 * (p_ - q_).abs().sum().item()
            if math.isclose(alpha, 1 - 2 * total_variation, abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: alpha = 1 - sum|p - q| misses a factor 1/2: the "
                    "total-variation distance is (1/2) sum|p - q|, and alpha = "
                    "1 - TV = sum min(p, q)"
                )
            ratio = (p_ / q_).clamp(max=1.0)
            if math.isclose(alpha, ratio[q_ > 0].mean().item(), abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: alpha is the plain mean of min(1, p/q); the proposal is "
                    "drawn from q, so weight each token by q(x): "
                    "sum q(x) min(1, p(x)/q(x))"
                )
            got_want = f"alpha = {alpha:.6g}, expected {want_alpha:.6g}"
            raise ExerciseError(f"{what}: {got_want}")

        if math.isnan(tokens) or math.isinf(tokens):
            raise ExerciseError(
                f"{what}: the expected number of tokens is {tokens}; with alpha = 1 "
                "(the models agree) (1 - alpha^(n+1)) / (1 - alpha) is 0/0: every "
                "proposal is accepted and a call yields n_draft + 1 tokens"
            )
        if not math.isclose(tokens, want_tokens, rel_tol=1e-6, abs_tol=1e-9):
            if math.isclose(tokens, want_tokens - want_alpha**n_draft, abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: one term short: a call yields between 1 and n_draft + 1 "
                    "tokens, so the series runs over alpha^0 .. alpha^n_draft"
                )
            if math.isclose(tokens, want_tokens - 1, abs_tol=1e-9):
                raise ExerciseError(
                    f"{what}: this counts the accepted proposals only; every round "
                    "also adds one token of the target's own (the correction or the "
                    "bonus)"
                )
            raise ExerciseError(
                f"{what}: expected tokens = {tokens:.6g}, expected {want_tokens:.6g}"
            )


# -- Exercise 1 of page 7.1: MLA's decoupled RoPE key ------------------------------------------------


def rope_at(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE (chapter 3's half-split pairs, base 10,000) of ``x`` ``(... seq d)``, row
    ``j`` rotated by the angle of position ``positions[j]`` (``positions`` ``(seq,)``)."""
    angles = positions.double()[:, None] * rope_frequencies(x.shape[-1])
    angles = torch.cat([angles, angles], dim=-1).to(x.dtype)  # (seq d)
    return x * angles.cos() + rope_rotate_half(x) * angles.sin()


def _decoupled_scores(
    q_content, q_rope, latent, k_rope, w_uk, bug: str = ""
) -> torch.Tensor:
    """The reference scores, or those of one typical ``bug``."""
    q_pos, k_pos = q_content.shape[-2], latent.shape[-2]
    q_positions = (
        torch.arange(q_pos)
        if bug == "from_zero"
        else torch.arange(k_pos - q_pos, k_pos)
    )
    if bug == "rotated_latent":
        latent = rope_at(latent, torch.arange(k_pos))
    q_latent = einsum(q_content, w_uk, "b h q d, h d c -> b h q c")
    content = einsum(q_latent, latent, "b h q c, b k c -> b h q k")
    key = k_rope if bug == "unrotated_key" else rope_at(k_rope, torch.arange(k_pos))
    position = einsum(rope_at(q_rope, q_positions), key, "b h q r, b k r -> b h q k")
    if bug == "no_position":
        return content
    if bug == "no_content":
        return position
    return content + position


@checker("Exercise 1 (page 7.1): MLA's decoupled RoPE key")
def check_decoupled_rope_scores(scores: Callable[..., torch.Tensor]) -> None:
    """``scores(q_content, q_rope, latent, k_rope, w_uk)`` -> ``(batch heads q_pos
    k_pos)``: each head's content score read from the latents (``W_UK`` folded into the
    query) plus the score of its RoPE query against the one shared RoPE key, both
    rotated at their own positions (the queries are the last ``q_pos`` of the ``k_pos``
    positions)."""
    gen = torch.Generator().manual_seed(0)
    for batch, heads, q_pos, k_pos in [(2, 3, 5, 5), (1, 2, 1, 7), (2, 2, 3, 9)]:
        d_head, d_latent, d_rope = 4, 6, 4
        inputs = (
            torch.randn(batch, heads, q_pos, d_head, generator=gen),
            torch.randn(batch, heads, q_pos, d_rope, generator=gen),
            torch.randn(batch, k_pos, d_latent, generator=gen),
            torch.randn(batch, k_pos, d_rope, generator=gen),
            torch.randn(heads, d_head, d_latent, generator=gen),
        )
        what = f"scores with {q_pos} queries over {k_pos} positions"
        got = call_without_mutation(scores, *inputs)
        want = _decoupled_scores(*inputs)
        expect_tensor(got, tuple(want.shape), what)
        if is_close(got, want):
            continue
        mistakes = [
            ("unrotated_key", "the shared RoPE key must be rotated at its own position "
             "too (rope_at(k_rope, positions of the keys))"),
            ("from_zero", "the queries are the last q_pos positions (k_pos - q_pos .. "
             "k_pos - 1), not 0 .. q_pos - 1: a decoding step's one query stands at the "
             "end"),
            ("rotated_latent", "the latent is not rotated: RoPE sits only on the decoupled "
             "part, so that W_UK can still fold into the query"),
            ("no_position", "the position term is missing: add the score of the rotated "
             "RoPE query against the rotated shared key"),
            ("no_content", "the content term is missing: add (W_UKᵀ q) · c, the query "
             "folded through W_UK against the latents"),
        ]  # fmt: skip
        for bug, message in mistakes:
            if is_close(got, _decoupled_scores(*inputs, bug=bug)):
                raise ExerciseError(f"{what}: {message}")
        expect_close(got, want, what)


# -- Exercise 1 of page 7.2: DistilBERT's table ----------------------------------------


#: A buffer of DistilBERT's embeddings in some versions, not a weight.
DISTILBERT_SKIPPED = (r"distilbert\.embeddings\.position_ids",)


def _transformers():
    """``transformers``, quiet about random models (pages 7.2 and 7.5 need it)."""
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``model`` with noise on every weight (no norm weight 1, no bias 0), in eval
    mode, as page 7.2 perturbs its references."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return model.eval()


def distilbert_config(config: object) -> TransformerConfig:
    """Our configuration of a ``transformers`` ``DistilBertConfig``: page 7.1's BERT,
    post-LN, with learned positions, no token types, and LayerNorm's epsilon 1e-12
    (fixed in DistilBERT's code, not in its config)."""
    if getattr(config, "sinusoidal_pos_embds", False):
        raise ValueError("sinusoidal_pos_embds=True is not supported here")
    return TransformerConfig(
        vocab_size=config.vocab_size,
        d_model=config.dim,
        n_heads=config.n_heads,
        n_layers=config.n_layers,
        d_ff=config.hidden_dim,
        activation={"gelu": "gelu", "relu": "relu"}[config.activation],
        norm="layernorm",
        norm_eps=1e-12,
        norm_position="post",
        positions="learned",
        max_len=config.max_position_embeddings,
        embedding_norm=True,
        bias=True,
        dropout=config.dropout,
        tie_embeddings=getattr(config, "tie_word_embeddings", True),
    )


def _distilbert_reference(n_layers: int, seed: int):
    transformers = _transformers()
    config = transformers.DistilBertConfig(
        vocab_size=97,
        dim=48,
        n_layers=n_layers,
        n_heads=4,
        hidden_dim=80,
        max_position_embeddings=40,
    )
    # transformers initialises from the global generator: seeded, then restored
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.DistilBertForMaskedLM(config)
    return _perturbed(model, seed)


def _distilbert_rows(cfg: TransformerConfig) -> list:
    """The reference table, with ``{i}`` for the blocks."""
    block = [("self_attn.sublayer.out_proj.", "attention.out_lin.")]
    block += [
        ("self_attn.norm.", "sa_layer_norm."),
        ("ffn.sublayer.w_in.", "ffn.lin1."),
    ]
    block += [("ffn.sublayer.w_out.", "ffn.lin2."), ("ffn.norm.", "output_layer_norm.")]
    head = [("mlm_dense.", "vocab_transform."), ("mlm_norm.", "vocab_layer_norm.")]
    ours, theirs = "encoder.blocks.{i}.", "distilbert.transformer.layer.{i}."
    embeddings = "distilbert.embeddings."
    rows = [
        (
            ("embed.tokens.weight", "head.weight"),
            (embeddings + "word_embeddings.weight", "vocab_projector.weight"),
            tied,
        ),
        ("head.bias", "vocab_projector.bias", same),
        (
            "embed.positions.embedding.weight",
            embeddings + "position_embeddings.weight",
            same,
        ),
    ]
    for kind in ("weight", "bias"):
        qkv = [f"{theirs}attention.{x}_lin.{kind}" for x in "qkv"]
        rows.append((f"{ours}self_attn.sublayer.qkv_proj.{kind}", qkv, concat))
        rows.append((f"embed.norm.{kind}", f"{embeddings}LayerNorm.{kind}", same))
        rows += [(f"{ours}{o}{kind}", f"{theirs}{t}{kind}", same) for o, t in block]
        rows += [(o + kind, t + kind, same) for o, t in head]
    return rows


def _convert_distilbert(their_state_dict, rows, cfg) -> dict[str, torch.Tensor]:
    return convert_state_dict(
        their_state_dict,
        rows,
        {key: value.shape for key, value in BERT(cfg).state_dict().items()},
        ranges={"i": range(cfg.n_layers)},
        skip=DISTILBERT_SKIPPED,
        what="DistilBERT -> BERT",
    )


def _mismatch_message(error: StateDictMismatchError) -> str:
    lines = str(error).splitlines()
    shown = "\n".join(lines[:12]) + ("\n  ..." if len(lines) > 12 else "")
    flipped = [
        m
        for m in error.misshaped
        if (
            found := re.search(
                r"has \((\d+), (\d+)\), the table made \((\d+), (\d+)\)", m
            )
        )
        and found.group(1, 2) == found.group(4, 3)
    ]
    if flipped:
        return (
            f"{shown}\nA matrix came out transposed: DistilBERT's layers are nn.Linear, "
            "which stores (out, in) as ours does; only GPT-2's Conv1D needs transpose"
        )
    return (
        f"{shown}\nprint(reference.state_dict().keys()) lists their names; each row "
        "says (our key(s), their key(s), transform), with {i} for a block's index"
    )


def _their_names(tensor: torch.Tensor, their_state_dict) -> list[str]:
    return [
        key
        for key, value in their_state_dict.items()
        if value.shape == tensor.shape and torch.equal(value, tensor)
    ]


def _diagnose_row(key, got, want, their_state_dict, source) -> str:
    """Why ``got`` (our tensor ``key``, made by the reader's table) is not ``want``."""
    if got.dim() == 2 and got.shape == want.shape[::-1] and torch.equal(got, want.t()):
        return (
            f"{key} is transposed: DistilBERT's layers are nn.Linear, (out, in) like "
            "ours, so they need `same`; only GPT-2's Conv1D needs `transpose`"
        )
    if key.endswith(("qkv_proj.weight", "qkv_proj.bias")):
        parts = got.chunk(3, dim=0)
        names = [_their_names(part, their_state_dict) for part in parts]
        order = [name[0].split(".")[-2][0] if name else "?" for name in names]
        if sorted(order) == ["k", "q", "v"]:
            return (
                f"{key} stacks their {', '.join(order)} projections in that order; "
                "our attention splits qkv_proj's output as queries, keys, values: "
                "concatenate q_lin, k_lin, v_lin in that order"
            )
    found = _their_names(got, their_state_dict)
    if found:
        where = found[0]
        if "layer_norm" in where and "layer_norm" in source:
            return (
                f"{key} holds their {where}, not {source}: DistilBERT is post-LN; "
                "sa_layer_norm follows the attention's residual sum (our "
                "self_attn.norm), output_layer_norm the FFN's (our ffn.norm)"
            )
        return f"{key} holds their {where}; it should hold {source}"
    return f"{key} differs from their {source}"


@checker("Exercise 1 (page 7.2): DistilBERT's table")
def check_distilbert_rows(distilbert_rows: Callable[[TransformerConfig], list]) -> None:
    """``distilbert_rows(cfg) -> list of rows`` (page 7.2's ``(our key(s), their
    key(s), transform)``, ``{i}`` for a block's index): the table that loads a
    ``DistilBertForMaskedLM`` into ``BERT(cfg)``. Checked on random DistilBERTs of
    two depths, key by key against a reference table, then logit by logit."""
    for n_layers, seed in ((2, 0), (3, 1)):
        reference = _distilbert_reference(n_layers, seed)
        cfg = distilbert_config(reference.config)
        rows = distilbert_rows(cfg)
        if not isinstance(rows, list | tuple) or not all(
            isinstance(row, tuple) and len(row) == 3 and callable(row[2])
            for row in rows
        ):
            raise ExerciseError(
                "return a list of rows, each a tuple (our key(s), their key(s), "
                f"transform), got {rows!r:.80}"
            )
        theirs = reference.state_dict()
        try:
            got = _convert_distilbert(theirs, rows, cfg)
        except StateDictMismatchError as error:
            raise ExerciseError(_mismatch_message(error)) from None
        except ValueError as error:
            raise ExerciseError(
                f"{error}; write {{i}} for a block's index (the checker runs it over "
                "the blocks)"
            ) from None
        reference_rows = list(
            expand_rows(_distilbert_rows(cfg), {"i": range(n_layers)})
        )
        want = _convert_distilbert(theirs, _distilbert_rows(cfg), cfg)
        sources = {o: t for ours, t, _ in reference_rows for o in ours}
        for key, value in want.items():
            if not torch.equal(got[key], value):
                source = " + ".join(sources[key])
                raise ExerciseError(_diagnose_row(key, got[key], value, theirs, source))
        model = load_checked(BERT(cfg), got).eval()
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=gen)
        mask = torch.arange(12) < torch.tensor([[12], [7]])  # one row padded
        with torch.no_grad():
            ours = model(ids, mask)[mask]
            their_logits = reference(ids, attention_mask=mask.long()).logits[mask]
        expect_close(ours, their_logits, "our BERT's logits", atol=1e-5)


# -- Exercise 2 of page 7.2: back to GPT-2 ---------------------------------------------


#: GPT-2's Conv1D matrices, stored (in, out).
_CONV1D = (
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
)


def _gpt2_reference(n_layers: int, tie: bool, seed: int):
    transformers = _transformers()
    config = transformers.GPT2Config(
        vocab_size=97,
        n_positions=40,
        n_embd=48,
        n_layer=n_layers,
        n_head=4,
        tie_word_embeddings=tie,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.GPT2LMHeadModel(config)
    return _perturbed(model, seed)


def _optional(key: str) -> bool:
    return any(re.fullmatch(pattern, key) for pattern in GPT2_SKIPPED)


@checker("Exercise 2 (page 7.2): back to GPT-2")
def check_gpt2_export(to_gpt2: Callable[..., dict]) -> None:
    """``to_gpt2(state_dict, cfg) -> dict``: our ``GPT``'s state dict as a
    ``GPT2LMHeadModel``'s, which ``load_state_dict(strict=True)`` accepts and which
    gives our logits. Checked on a tied and an untied random GPT-2 loaded by page
    7.2's ``from_reference``, key by key, then logit by logit."""
    transformers = _transformers()
    for n_layers, tie, seed in ((2, True, 0), (3, False, 1)):
        reference = _gpt2_reference(n_layers, tie, seed)
        ours = from_reference(reference)
        given = ours.state_dict()
        saved = {key: value.clone() for key, value in given.items()}
        got = to_gpt2(given, ours.cfg)
        if set(given) != set(saved) or any(
            not torch.equal(given[key], value) for key, value in saved.items()
        ):
            raise ExerciseError(
                "your function changed the state dict it was given; build a new dict"
            )
        if not isinstance(got, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in got.items()
        ):
            raise ExerciseError(
                f"return a dict of their key -> tensor, got {type(got).__name__}"
            )
        want = {k: v for k, v in reference.state_dict().items() if not _optional(k)}
        missing = [key for key in want if key not in got]
        unexpected = [key for key in got if key not in want and not _optional(key)]
        what = f"the {'tied' if tie else 'untied'} GPT-2 of {n_layers} blocks"
        if missing == ["lm_head.weight"]:
            raise ExerciseError(
                f"{what}: lm_head.weight is missing. GPT2LMHeadModel's state dict lists "
                "the tied matrix under both names (transformer.wte.weight and "
                "lm_head.weight), and load_state_dict(strict=True) wants both"
            )
        if missing or unexpected:
            raise ExerciseError(
                f"{what}: missing keys {missing[:6]}, unexpected keys "
                f"{unexpected[:6]} (print(reference.state_dict().keys()) lists theirs)"
            )
        for key, value in want.items():
            mine = got[key]
            if mine.shape == value.shape and torch.equal(mine, value):
                continue
            if (
                mine.dim() == 2
                and mine.shape[::-1] == value.shape
                and torch.equal(mine.t(), value)
            ):
                if key.endswith(_CONV1D):
                    square = " (a square one: no shape error shows it)"
                    raise ExerciseError(
                        f"{key} is a Conv1D weight, stored (in, out): transpose our "
                        "(out, in) matrix" + square * (mine.shape == value.shape)
                    )
                raise ExerciseError(
                    f"{key} is transposed: only the four Conv1D matrices of each "
                    f"block ({', '.join(c.split('.')[-2] for c in _CONV1D)}) are "
                    "stored (in, out); embeddings are (rows, d_model) on both sides"
                )
            if key == "lm_head.weight" and torch.equal(
                mine, want["transformer.wte.weight"]
            ):
                raise ExerciseError(
                    f"{what}: lm_head.weight is a copy of the token embedding, but this "
                    "model is untied: it is our head.weight"
                )
            expect_close(mine, value, f"{what}: {key}", atol=0, rtol=0)
        model = transformers.GPT2LMHeadModel(reference.config).eval()
        state = {k: v for k, v in model.state_dict().items() if _optional(k)} | dict(
            got
        )
        model.load_state_dict(state, strict=True)
        ids = torch.randint(
            0, 97, (2, 10), generator=torch.Generator().manual_seed(seed)
        )
        with torch.no_grad():
            expect_close(model(ids).logits, ours(ids), f"{what}: the logits", atol=1e-5)


# -- Exercise 1 of page 7.5: the log-likelihood of a text -----------------------------


def log_likelihood_reference(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``(batch seq)`` ids -> ``(batch,)``: the sum over ``t >= 1`` of ``log
    p(ids[t] | ids[:t])`` under the causal ``model``."""
    with torch.no_grad():
        log_probs = model(ids[:, :-1]).log_softmax(dim=-1)  # (batch seq-1 vocab)
    return log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1).sum(dim=-1)


def _log_likelihood_mistakes(model, ids) -> list[tuple[torch.Tensor, str]]:
    with torch.no_grad():
        logits = model(ids)  # (batch seq vocab)
    targets = ids[:, 1:, None]
    log_probs = logits.log_softmax(dim=-1)
    per_token = log_probs[:, :-1].gather(-1, targets).squeeze(-1)
    own = (
        "the logits at position t predict token t+1: score ids[:, 1:] with the logits "
    )
    own += "at positions 0 .. seq-2"
    return [
        (per_token.mean(dim=-1), "this is the mean over the tokens; return their sum"),
        (log_probs[:, 1:].gather(-1, targets).squeeze(-1).sum(-1), own),
        (log_probs.gather(-1, ids[:, :, None]).squeeze(-1).sum(-1), own),
        (log_probs[:, :-1].gather(-1, ids[:, :-1, None]).squeeze(-1).sum(-1), own),
        (
            logits[:, :-1].gather(-1, targets).squeeze(-1).sum(-1),
            "these are raw logits: take log_softmax over the vocabulary first",
        ),
        (
            logits[:, :-1].softmax(-1).gather(-1, targets).squeeze(-1).sum(-1),
            "these are probabilities: add their logarithms (log_softmax)",
        ),
        (
            logits[:, :-1].log_softmax(1).gather(-1, targets).squeeze(-1).sum(-1),
            "log_softmax over the wrong axis: normalise over the vocabulary (dim=-1), "
            "not over the positions",
        ),
    ]


def _log_likelihood_cases():
    from lib.datasets import load_tiny_shakespeare
    from lib.pretrained import load_shipped

    shipped = load_shipped("char-gpt-shakespeare")
    text = load_tiny_shakespeare()
    start = text.index("Now is the winter of our discontent")
    windows = [text[start : start + 90], text[1000:1090]]
    ids = torch.tensor([shipped.tokenizer.encode(w) for w in windows])
    yield shipped.model, ids, "the shipped character GPT on two lines"
    cfg = TransformerConfig(vocab_size=30, d_model=32, n_heads=4, n_layers=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT(cfg).eval()
    ids = torch.randint(0, 30, (3, 12), generator=torch.Generator().manual_seed(1))
    yield model, ids, "a random GPT on 3 rows of 12"


@checker("Exercise 1 (page 7.5): the log-likelihood of a text")
def check_log_likelihood(log_likelihood: Callable[..., torch.Tensor]) -> None:
    """``log_likelihood(model, ids)``: a causal model and ``(batch seq)`` ids ->
    ``(batch,)``, each row's sum of ``log p(ids[t] | ids[:t])`` over ``t = 1 .. seq-1``
    (the first token has nothing to be predicted from)."""
    for model, ids, label in _log_likelihood_cases():
        what = f"log_likelihood on {label}"
        got = call_without_mutation(log_likelihood, model, ids)
        want = log_likelihood_reference(model, ids)
        if isinstance(got, torch.Tensor) and got.shape == (
            ids.shape[0],
            ids.shape[1] - 1,
        ):
            raise ExerciseError(
                f"{what} has shape {tuple(got.shape)}, one number per token: sum over "
                "the positions, one number per row"
            )
        expect_tensor(got, tuple(want.shape), what)
        got = got.detach()
        if is_close(got, want, atol=1e-3):
            continue
        for mistake, message in _log_likelihood_mistakes(model, ids):
            if is_close(got, mistake, atol=1e-3):
                raise ExerciseError(f"{what}: {message}")
        expect_close(got, want, what, atol=1e-3)


# -- Exercise 2 of page 7.5: a masked LM's pseudo-log-likelihood ----------------------


def pseudo_log_likelihood_reference(
    model: torch.nn.Module, ids: torch.Tensor, mask_id: int
) -> float:
    """``(seq,)`` ids -> the sum over every position ``t`` of ``log p(ids[t])`` when
    ``t`` alone is masked: one copy of the row per position, in one batch."""
    n = len(ids)
    copies = ids.repeat(n, 1)  # (seq seq): row t masks position t
    copies.fill_diagonal_(mask_id)
    with torch.no_grad():
        log_probs = model(copies).log_softmax(dim=-1)  # (seq seq vocab)
    return log_probs[torch.arange(n), torch.arange(n), ids].sum().item()


def _pseudo_mistakes(model, ids, mask_id) -> list[tuple[float, str]]:
    n = len(ids)
    with torch.no_grad():
        seen = model(ids[None])[0]  # (seq vocab)
        hidden = model(torch.full_like(ids, mask_id)[None])[0]
        copies = ids.repeat(n, 1)
        copies.fill_diagonal_(mask_id)
        logits = model(copies)[torch.arange(n), torch.arange(n)]  # (seq vocab)
    reference = pseudo_log_likelihood_reference(model, ids, mask_id)
    return [
        (
            seen.log_softmax(-1)[torch.arange(n), ids].sum().item(),
            "the model saw the tokens it was asked for: mask position t when you "
            "score it (one copy of the row per position, each with one mask)",
        ),
        (
            hidden.log_softmax(-1)[torch.arange(n), ids].sum().item(),
            "every position was masked at once, so each token was guessed from none "
            "of the others: mask one position per copy of the row",
        ),
        (reference / n, "this is the mean over the positions; return their sum"),
        (
            logits[torch.arange(n), ids].sum().item(),
            "these are raw logits: take log_softmax over the vocabulary first",
        ),
    ]


def _pseudo_cases():
    from lib.pretrained import load_shipped

    shipped = load_shipped("bert-gutenberg-mlm")
    mask_id = shipped.entry["inputs"]["mask_id"]
    text = "Do you really think it a bad thing?"
    yield shipped.model, torch.tensor(shipped.tokenizer.encode(text)), mask_id, text
    cfg = TransformerConfig(
        vocab_size=40, d_model=32, n_heads=4, n_layers=2, max_len=16,
        norm_position="post", embedding_norm=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BERT(cfg).eval()
    ids = torch.randint(0, 39, (9,), generator=torch.Generator().manual_seed(2))
    yield model, ids, 39, "9 random ids, mask id 39"


@checker("Exercise 2 (page 7.5): pseudo-log-likelihood")
def check_pseudo_log_likelihood(pseudo_log_likelihood: Callable[..., float]) -> None:
    """``pseudo_log_likelihood(model, ids, mask_id)``: a masked LM, ``(seq,)`` ids and
    the mask's id -> a float, the sum over every position ``t`` of ``log p(ids[t])``
    when position ``t`` alone is replaced by the mask."""
    for model, ids, mask_id, label in _pseudo_cases():
        what = f"pseudo_log_likelihood on {label!r}"
        got = call_without_mutation(pseudo_log_likelihood, model, ids, mask_id)
        got = expect_number(
            got.detach() if isinstance(got, torch.Tensor) else got, what
        )
        want = pseudo_log_likelihood_reference(model, ids, mask_id)
        if math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-3):
            continue
        for mistake, message in _pseudo_mistakes(model, ids, mask_id):
            if math.isclose(got, mistake, rel_tol=1e-4, abs_tol=1e-3):
                raise ExerciseError(f"{what}: {message}")
        raise ExerciseError(f"{what} gives {got:.6g}, expected {want:.6g}")
