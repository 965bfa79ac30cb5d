"""The checkers of chapter 7 accept the reference answers and diagnose mistakes."""

from __future__ import annotations

import pytest
import torch

from lib.exercises._common import ExerciseError
from lib.exercises.families import (
    check_min_p_filter,
    check_restore_spans,
    check_speculation_rate,
)


def _not_attempted(*args):
    raise NotImplementedError


CHECKERS = [check_restore_spans, check_min_p_filter, check_speculation_rate]


@pytest.mark.parametrize("check", CHECKERS)
def test_not_attempted_is_reported_not_raised(check):
    assert check(_not_attempted) is None


# -- Exercise 1: undo span corruption -------------------------------------------------


def _spans(targets, sentinels):
    """{sentinel: the tokens after it in the target}, and the sentinels in order."""
    spans, order, current = {}, [], None
    for token in targets.tolist():
        if token in sentinels:
            current = spans.setdefault(token, [])
            order.append(token)
        elif current is not None:
            current.append(token)
    return spans, order


def restore(inputs, targets, sentinel_ids):
    spans, _ = _spans(targets, set(sentinel_ids))
    out = []
    for token in inputs.tolist():
        out += spans[token] if token in spans else [token]
    return torch.tensor(out)


def restore_keeping_sentinels(inputs, targets, sentinel_ids):
    spans, _ = _spans(targets, set(sentinel_ids))
    out = []
    for token in inputs.tolist():
        out += [token, *spans[token]] if token in spans else [token]
    return torch.tensor(out)


def restore_appending(inputs, targets, sentinel_ids):
    spans, order = _spans(targets, set(sentinel_ids))
    kept = [t for t in inputs.tolist() if t not in spans]
    return torch.tensor(kept + [t for s in order for t in spans[s]])


def restore_popping_from_the_end(inputs, targets, sentinel_ids):
    """Takes the spans last-in first-out (list.pop() instead of list.pop(0))."""
    spans, order = _spans(targets, set(sentinel_ids))
    queue = [spans[s] for s in order[:-1]]  # the final sentinel opens no span
    out = []
    for token in inputs.tolist():
        out += queue.pop() if token in spans else [token]
    return torch.tensor(out)


def restore_as_list(inputs, targets, sentinel_ids):
    return restore(inputs, targets, sentinel_ids).tolist()


def restore_in_place(inputs, targets, sentinel_ids):
    out = restore(inputs, targets, sentinel_ids)
    inputs[0] = -1
    return out


def test_restore_spans_accepts_the_reference():
    assert check_restore_spans(restore)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (restore_keeping_sentinels, "still holds sentinel ids"),
        (restore_appending, "appended after the kept tokens"),
        (restore_popping_from_the_end, "wrong order.*replaces sentinel i"),
        (restore_as_list, "returned a list"),
        (restore_in_place, "modified its input"),
        (lambda i, t, s: restore(i, t, s)[:-1], "has shape"),
        (lambda i, t, s: restore(i, t, s).float(), "dtype torch.float32"),
        (lambda i, t, s: restore(i, t, s).flip(0), "is wrong|wrong order"),
    ],
)
def test_restore_spans_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_restore_spans(wrong)


# -- Exercise 2: min-p filtering ------------------------------------------------------


def min_p(logits, min_p):
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.amax(-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def test_min_p_filter_accepts_the_reference():
    assert check_min_p_filter(min_p)


def _in_place(logits, p):
    probs = logits.softmax(-1)
    logits[probs < p * probs.amax(-1, keepdim=True)] = float("-inf")
    return logits


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda x, p: min_p(x, p).softmax(-1), "returned probabilities"),
        (lambda x, p: min_p(x, p).nan_to_num(neginf=0.0), "are 0, not -inf"),
        (
            lambda x, p: x.masked_fill(x < p * x.amax(-1, keepdim=True), float("-inf")),
            "applied to the logits",
        ),
        (
            lambda x, p: x.masked_fill(x.softmax(-1) < p, float("-inf")),
            "the threshold is min_p itself",
        ),
        (
            lambda x, p: x.masked_fill(
                x.softmax(-1) >= p * x.softmax(-1).amax(-1, keepdim=True), float("-inf")
            ),
            "inverted",
        ),
        (lambda x, p: x * min_p(x, p).isfinite(), "0, not -inf|contains NaN"),
        (
            lambda x, p: x * torch.where(min_p(x, p).isfinite(), 1.0, float("inf")),
            "contains NaN|is wrong",
        ),
        (_in_place, "modified its input"),
        (lambda x, p: min_p(x, p)[:, :-1], "has shape"),
        (lambda x, p: min_p(x, p / 2), "keeps .* tokens, the reference keeps"),
    ],
)
def test_min_p_filter_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_min_p_filter(wrong)


# -- Exercise 3: tokens per target call -----------------------------------------------


def rate(p, q, n_draft):
    alpha = torch.minimum(p, q).sum().item()
    return alpha, sum(alpha**i for i in range(n_draft + 1))


def rate_closed_form(p, q, n_draft):
    """The closed form of the series, with its alpha = 1 case."""
    alpha = torch.minimum(p, q).sum().item()
    if alpha == 1.0:
        return alpha, n_draft + 1.0
    return alpha, (1 - alpha ** (n_draft + 1)) / (1 - alpha)


def rate_from_alpha(alpha, n_draft):
    return alpha, sum(alpha**i for i in range(n_draft + 1))


def test_speculation_rate_accepts_the_reference_and_the_closed_form():
    assert check_speculation_rate(rate)
    assert check_speculation_rate(rate_closed_form)
    as_tensors = lambda p, q, n: tuple(torch.tensor(v) for v in rate(p, q, n))
    assert check_speculation_rate(as_tensors)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (
            lambda p, q, n: (1 - (p - q).abs().sum().item(), 1.0),
            "misses a factor 1/2",
        ),
        (
            lambda p, q, n: (
                (p / q).clamp(max=1)[q > 0].mean().item(),
                1.0,
            ),
            "plain mean of min\\(1, p/q\\)",
        ),
        (
            lambda p, q, n: (q * (p / q).clamp(max=1)).sum().item(),
            "should return a pair",
        ),
        (
            lambda p, q, n: rate_from_alpha(rate(p, q, n)[0], n - 1),
            "one term short",
        ),
        (
            lambda p, q, n: (rate(p, q, n)[0], rate(p, q, n)[1] - 1),
            "accepted proposals only",
        ),
        (
            lambda p, q, n: (
                rate(p, q, n)[0],
                (1 - rate(p, q, n)[0] ** (n + 1)) / (1 - rate(p, q, n)[0]),
            ),
            "division by zero",
        ),
        (
            lambda p, q, n: (
                rate(p, q, n)[0],
                float(
                    (1 - torch.tensor(rate(p, q, n)[0]) ** (n + 1))
                    / (1 - torch.tensor(rate(p, q, n)[0]))
                ),
            ),
            "0/0",
        ),
        (
            lambda p, q, n: rate_from_alpha((q * (p / q).clamp(max=1)).sum().item(), n),
            "alpha is NaN",
        ),
        (lambda p, q, n: (rate(p, q, n)[0], "many"), "should be a number"),
    ],
)
def test_speculation_rate_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_speculation_rate(wrong)


# -- Exercise 4: MLA's decoupled RoPE key ------------------------------------------------


def _decoupled(q_content, q_rope, latent, k_rope, w_uk):
    from lib.exercises.families import _decoupled_scores

    return _decoupled_scores(q_content, q_rope, latent, k_rope, w_uk)


def test_decoupled_rope_scores_accepts_the_reference_and_reports_a_stub(capsys):
    from lib.exercises.families import check_decoupled_rope_scores

    assert check_decoupled_rope_scores(_decoupled)

    def stub(*args):
        raise NotImplementedError

    assert check_decoupled_rope_scores(stub) is None
    assert "Exercise 1 (page 7.1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bug", "match"),
    [
        ("unrotated_key", "shared RoPE key must be rotated"),
        ("from_zero", "the queries are the last q_pos positions"),
        ("rotated_latent", "the latent is not rotated"),
        ("no_position", "the position term is missing"),
        ("no_content", "the content term is missing"),
    ],
)
def test_decoupled_rope_scores_names_each_typical_mistake(bug, match):
    from lib.exercises._common import ExerciseError
    from lib.exercises.families import _decoupled_scores, check_decoupled_rope_scores

    def wrong(*inputs):
        return _decoupled_scores(*inputs, bug=bug)

    with pytest.raises(ExerciseError, match=match):
        check_decoupled_rope_scores(wrong)


def test_rope_at_is_chapter_3s_rotation():
    """rope_at agrees with lib.positions.RotaryEmbedding at the same positions."""
    from lib.exercises.families import rope_at
    from lib.positions import RotaryEmbedding

    x = torch.randn(2, 3, 7, 8)
    rotary = RotaryEmbedding(8)
    assert torch.allclose(
        rope_at(x, torch.arange(4, 11)), rotary(x, offset=4), atol=1e-5
    )


# -- Exercise 1 of page 7.2: DistilBERT's table ---------------------------------------


def _distilbert_table(mistake=None):
    """The reference table, or one with a typical mistake."""
    from lib.exercises.families import _distilbert_rows
    from lib.hf_weights import transpose

    def rows(cfg):
        table = []
        for ours, theirs, transform in _distilbert_rows(cfg):
            if mistake == "kqv" and transform.__name__ == "concat":
                theirs = [theirs[1], theirs[0], theirs[2]]
            if mistake == "norms" and isinstance(ours, str) and ".norm." in ours:
                swap = {"sa_layer_norm": "output_layer_norm"}
                swap |= {v: k for k, v in swap.items()}
                name = theirs.split(".")[-2]
                theirs = theirs.replace(name, swap.get(name, name))
            if mistake == "transpose_out" and str(theirs).endswith("out_lin.weight"):
                transform = transpose
            if mistake == "transpose_ffn" and theirs == (
                "distilbert.transformer.layer.{i}.ffn.lin1.weight"
            ):
                transform = transpose
            if mistake == "no_head_bias" and ours == "head.bias":
                continue
            if mistake == "placeholder" and isinstance(theirs, str):
                theirs, ours = theirs.replace("{i}", "{n}"), ours.replace("{i}", "{n}")
            if mistake == "head_swap" and ours in ("mlm_dense.weight",):
                theirs = "distilbert.transformer.layer.0.attention.out_lin.weight"
            table.append((ours, theirs, transform))
        if mistake == "head_swap":
            table.append(
                (
                    "encoder.blocks.0.self_attn.sublayer.out_proj.weight",
                    "vocab_transform.weight",
                    lambda x: x,
                )
            )
        return table

    return rows


def test_distilbert_rows_accepts_the_reference_and_reports_a_stub(capsys):
    pytest.importorskip("transformers")
    from lib.exercises.families import check_distilbert_rows

    assert check_distilbert_rows(_distilbert_table())
    assert check_distilbert_rows(_not_attempted) is None
    assert "Exercise 1 (page 7.2) not attempted" in capsys.readouterr().out


def test_distilbert_config_gives_transformers_logits():
    """Our BERT with distilbert_config and the reference table is DistilBERT."""
    pytest.importorskip("transformers")
    from lib.exercises.families import (
        _convert_distilbert,
        _distilbert_reference,
        _distilbert_rows,
        distilbert_config,
    )
    from lib.hf_weights import load_checked
    from lib.models import BERT

    reference = _distilbert_reference(2, 5)
    cfg = distilbert_config(reference.config)
    assert cfg.norm_eps == 1e-12 and cfg.norm_position == "post"
    state = _convert_distilbert(reference.state_dict(), _distilbert_rows(cfg), cfg)
    ours = load_checked(BERT(cfg), state).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.allclose(ours(ids), reference(ids).logits, atol=1e-5)


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("kqv", "stacks their k, q, v projections"),
        ("norms", "DistilBERT is post-LN"),
        ("transpose_out", "out_proj.weight is transposed"),
        ("transpose_ffn", "A matrix came out transposed"),
        ("no_head_bias", "missing \\(1\\):\\s+head.bias"),
        ("placeholder", "write \\{i\\} for a block's index"),
        ("head_swap", "holds their"),
    ],
)
def test_distilbert_rows_diagnoses_mistakes(mistake, match):
    pytest.importorskip("transformers")
    from lib.exercises.families import check_distilbert_rows

    with pytest.raises(ExerciseError, match=match):
        check_distilbert_rows(_distilbert_table(mistake))


def test_distilbert_rows_wants_a_list_of_rows():
    pytest.importorskip("transformers")
    from lib.exercises.families import check_distilbert_rows

    with pytest.raises(ExerciseError, match="return a list of rows"):
        check_distilbert_rows(lambda cfg: {"embed.norm.weight": "LayerNorm.weight"})


# -- Exercise 2 of page 7.2: back to GPT-2 --------------------------------------------


def to_gpt2(state_dict, cfg, mistake=None):
    """Our GPT's state dict as GPT-2's, right or with one typical mistake."""
    from lib.hf_weights import expand_rows, gpt2_rows, transpose

    theirs = {}
    for ours, their_keys, transform in expand_rows(
        gpt2_rows(cfg), {"i": range(cfg.n_layers)}
    ):
        tensor = state_dict[ours[0]]
        flip = transform is transpose
        if mistake == "no_transpose":
            flip = False
        if mistake == "square_kept" and their_keys[0].endswith("attn.c_proj.weight"):
            flip = False
        if mistake == "all_matrices":
            flip = tensor.dim() == 2
        for key in their_keys:
            theirs[key] = tensor.t() if flip else tensor
    if mistake == "no_lm_head" and cfg.tie_embeddings:
        del theirs["lm_head.weight"]
    if mistake == "head_from_embedding":
        theirs["lm_head.weight"] = theirs["transformer.wte.weight"]
    if mistake == "pops":
        state_dict.pop("head.weight")
    return theirs


def test_gpt2_export_accepts_the_reference_and_reports_a_stub(capsys):
    pytest.importorskip("transformers")
    from lib.exercises.families import check_gpt2_export

    assert check_gpt2_export(to_gpt2)
    assert check_gpt2_export(_not_attempted) is None
    assert "Exercise 2 (page 7.2) not attempted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("no_transpose", "is a Conv1D weight, stored \\(in, out\\)"),
        ("square_kept", "c_proj.weight is a Conv1D .* no shape error shows it"),
        ("all_matrices", "embeddings are \\(rows, d_model\\)"),
        ("no_lm_head", "lm_head.weight is missing"),
        ("head_from_embedding", "this model is untied"),
        ("pops", "changed the state dict it was given"),
    ],
)
def test_gpt2_export_diagnoses_mistakes(mistake, match):
    pytest.importorskip("transformers")
    from lib.exercises.families import check_gpt2_export

    with pytest.raises(ExerciseError, match=match):
        check_gpt2_export(lambda sd, cfg: to_gpt2(sd, cfg, mistake))


def test_gpt2_export_wants_a_dict_of_tensors():
    pytest.importorskip("transformers")
    from lib.exercises.families import check_gpt2_export

    with pytest.raises(ExerciseError, match="return a dict"):
        check_gpt2_export(lambda sd, cfg: list(to_gpt2(sd, cfg).values()))
    with pytest.raises(ExerciseError, match="unexpected keys"):
        check_gpt2_export(lambda sd, cfg: to_gpt2(sd, cfg) | {"extra": torch.ones(1)})


# -- Exercise 1 of page 7.5: the log-likelihood of a text -----------------------------


def log_likelihood(model, ids, mistake=None):
    """Right, or with one typical mistake."""
    with torch.no_grad():
        logits = model(ids)
    log_probs = logits.log_softmax(-1)
    scored, targets = log_probs[:, :-1], ids[:, 1:]
    if mistake == "own_position":
        scored = log_probs[:, 1:]
    if mistake == "raw_logits":
        scored = logits[:, :-1]
    if mistake == "probabilities":
        scored = logits[:, :-1].softmax(-1)
    if mistake == "seq_axis":
        scored = logits[:, :-1].log_softmax(1)
    picked = scored.gather(-1, targets[..., None]).squeeze(-1)
    if mistake == "per_token":
        return picked
    return picked.mean(-1) if mistake == "mean" else picked.sum(-1)


def test_log_likelihood_accepts_the_reference_and_reports_a_stub(capsys):
    from lib.exercises.families import check_log_likelihood, log_likelihood_reference

    assert check_log_likelihood(log_likelihood)
    assert check_log_likelihood(log_likelihood_reference)
    assert check_log_likelihood(_not_attempted) is None
    assert "Exercise 1 (page 7.5) not attempted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("mean", "the mean over the tokens"),
        ("own_position", "the logits at position t predict token t\\+1"),
        ("raw_logits", "these are raw logits"),
        ("probabilities", "these are probabilities"),
        ("seq_axis", "log_softmax over the wrong axis"),
        ("per_token", "one number per token"),
    ],
)
def test_log_likelihood_diagnoses_mistakes(mistake, match):
    from lib.exercises.families import check_log_likelihood

    with pytest.raises(ExerciseError, match=match):
        check_log_likelihood(lambda model, ids: log_likelihood(model, ids, mistake))


def test_log_likelihood_catches_in_place_changes():
    from lib.exercises.families import check_log_likelihood

    def in_place(model, ids):
        result = log_likelihood(model, ids)
        ids[:, 0] = 0
        return result

    with pytest.raises(ExerciseError, match="modified its input"):
        check_log_likelihood(in_place)


# -- Exercise 2 of page 7.5: pseudo-log-likelihood ------------------------------------


def pseudo(model, ids, mask_id, mistake=None):
    """Right, or with one typical mistake."""
    n = len(ids)
    copies = ids.repeat(n, 1)
    if mistake == "all_masked":
        copies[:] = mask_id
    elif mistake != "visible":
        copies.fill_diagonal_(mask_id)
    with torch.no_grad():
        logits = model(copies)[torch.arange(n), torch.arange(n)]  # (seq vocab)
    scores = logits if mistake == "raw_logits" else logits.log_softmax(-1)
    picked = scores[torch.arange(n), ids]
    return (picked.mean() if mistake == "mean" else picked.sum()).item()


def test_pseudo_log_likelihood_accepts_the_reference_and_reports_a_stub(capsys):
    from lib.exercises.families import (
        check_pseudo_log_likelihood,
        pseudo_log_likelihood_reference,
    )

    assert check_pseudo_log_likelihood(pseudo)
    assert check_pseudo_log_likelihood(pseudo_log_likelihood_reference)
    as_tensor = lambda m, i, k: torch.tensor(pseudo(m, i, k))
    assert check_pseudo_log_likelihood(as_tensor)
    assert check_pseudo_log_likelihood(_not_attempted) is None
    assert "Exercise 2 (page 7.5) not attempted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("mistake", "match"),
    [
        ("visible", "the model saw the tokens it was asked for"),
        ("all_masked", "every position was masked at once"),
        ("mean", "the mean over the positions"),
        ("raw_logits", "these are raw logits"),
    ],
)
def test_pseudo_log_likelihood_diagnoses_mistakes(mistake, match):
    from lib.exercises.families import check_pseudo_log_likelihood

    with pytest.raises(ExerciseError, match=match):
        check_pseudo_log_likelihood(lambda m, i, k: pseudo(m, i, k, mistake))


def test_pseudo_log_likelihood_catches_a_fixed_mask_id_and_in_place_masking():
    from lib.exercises.families import check_pseudo_log_likelihood

    with pytest.raises(ExerciseError, match="expected"):
        check_pseudo_log_likelihood(lambda m, i, k: pseudo(m, i, 38))

    def in_place(model, ids, mask_id):
        ids[0] = mask_id
        return pseudo(model, ids, mask_id)

    with pytest.raises(ExerciseError, match="modified its input"):
        check_pseudo_log_likelihood(in_place)
