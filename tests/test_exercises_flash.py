"""Chapter 9's checkers accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel below is defined

import pytest
from einops import einsum, reduce

from lib.exercises._common import ExerciseError
from lib.exercises.flash import (
    check_attention_backward_with_bias,
    check_delta_kernel,
    check_merge_partials,
    check_window_block_kind,
)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - Linux x86_64 wheels only
    triton = None


# --------------------------------------------------------------------------- exercise 1


def _merge(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isinf(lse), 0.0, lse)
    weight_a, weight_b = torch.exp(lse_a - safe), torch.exp(lse_b - safe)
    return weight_a[..., None] * out_a + weight_b[..., None] * out_b, lse


def _merge_overflowing(out_a, lse_a, out_b, lse_b):
    mass_a, mass_b = torch.exp(lse_a), torch.exp(lse_b)  # overflow for large lse
    total = mass_a + mass_b
    out = (mass_a[..., None] * out_a + mass_b[..., None] * out_b) / total[..., None]
    return out, torch.log(total)


def _merge_nan_when_empty(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return torch.exp(lse_a - lse)[..., None] * out_a + torch.exp(lse_b - lse)[
        ...,
        None,
    ] * out_b, lse


def test_merge_partials_accepts_the_reference():
    assert check_merge_partials(_merge)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (
            lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)),
            "plain average",
        ),
        (
            lambda oa, la, ob, lb: (
                (la[:, None] * oa + lb[:, None] * ob) / (la + lb)[:, None],
                torch.logaddexp(la, lb),
            ),
            "linear weights",
        ),
        (
            lambda oa, la, ob, lb: (_merge(oa, la, ob, lb)[0], torch.maximum(la, lb)),
            "larger",
        ),
        (_merge_overflowing, "overflows"),
        (_merge_nan_when_empty, "contains NaN.*-inf - \\(-inf\\)"),
        (lambda oa, la, ob, lb: (_merge(oa, la, ob, lb)[0][:, :1], la), "has shape"),
    ],
)
def test_merge_partials_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_merge_partials(wrong)


def test_merge_partials_catches_in_place_edits():
    def edits(out_a, lse_a, out_b, lse_b):
        lse_a -= 0.0  # in place, even if harmless, is an edit of the caller's tensor
        out_a.mul_(1.0 + 1e-3)
        return _merge(out_a, lse_a, out_b, lse_b)

    with pytest.raises(ExerciseError, match="modified its input"):
        check_merge_partials(edits)


def test_not_attempted_is_reported_not_raised():
    def stub(*args):
        raise NotImplementedError

    assert check_merge_partials(stub) is None


# --------------------------------------------------------------------------- exercise 2


def _window_kind(
    q_start,
    q_stop,
    k_start,
    k_stop,
    offset,
    window,
    *,
    shift=0,
    causal=False,
):
    window = 10**9 if causal else window + shift
    if k_start > q_stop - 1 + offset or k_stop - 1 <= q_start + offset - window:
        return "skip"
    if k_stop - 1 <= q_start + offset and k_start > q_stop - 1 + offset - window:
        return "full"
    return "partial"


def _replace_partial(kind, by):
    return by if kind == "partial" else kind


def test_window_block_kind_accepts_the_reference():
    assert check_window_block_kind(_window_kind)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda *tile: _window_kind(*tile, causal=True), "plain causal mask"),
        (lambda *tile: _window_kind(*tile, shift=1), "off by one.*W\\+1"),
        (lambda *tile: _window_kind(*tile, shift=-1), "off by one.*W-1"),
        (lambda *tile: "partial", "you say 'partial'.*wastes"),
        (
            lambda *tile: _replace_partial(_window_kind(*tile), "full"),
            "you say 'full'",
        ),
        (
            lambda *tile: _replace_partial(_window_kind(*tile), "skip"),
            "you say 'skip'",
        ),
        (lambda *tile: "masked", "returned 'masked', not 'skip', 'full' or 'partial'"),
    ],
)
def test_window_block_kind_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_window_block_kind(wrong)


# --------------------------------------------------------------------------- exercise 3


_PAIRS = "b h q d, b h k d -> b h q k"
_BY_KEY = "b h q k, b h q d -> b h k d"


def _bias_backward(
    q,
    k,
    v,
    bias,
    out,
    lse,
    grad_out,
    scale,
    block_k,
    *,
    d_term=True,
    biased=True,
    bias_columns="same",
    last_block=True,
    accumulate_dq=True,
):
    """The tiled reference (defaults), or the typical mistakes its flags name."""
    k_len = k.shape[2]
    stop = k_len if last_block else k_len // block_k * block_k
    delta = reduce(grad_out * out, "b h q d -> b h q 1", "sum") if d_term else 0.0
    dq = torch.zeros_like(q)
    dk, dv, dbias = torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(bias)
    for k0 in range(0, stop, block_k):
        keys = slice(k0, min(k0 + block_k, k_len))
        width = keys.stop - keys.start
        tile = bias[..., keys] if bias_columns == "same" else bias[..., :width]
        scores = scale * einsum(q, k[:, :, keys], _PAIRS)
        weights = torch.exp(scores + (tile if biased else 0.0) - lse[..., None])
        dv[:, :, keys] = einsum(weights, grad_out, _BY_KEY)
        d_scores = weights * (einsum(grad_out, v[:, :, keys], _PAIRS) - delta)
        share = scale * einsum(d_scores, k[:, :, keys], "b h q k, b h k d -> b h q d")
        dq = dq + share if accumulate_dq else share
        dk[:, :, keys] = scale * einsum(d_scores, q, _BY_KEY)
        dbias[..., keys] = reduce(d_scores, "b h q k -> h q k", "sum")
    return dq, dk, dv, dbias


def _untiled(q, k, v, bias, out, lse, grad_out, scale, block_k):
    """Right values, but the scores of all the keys at once."""
    return _bias_backward(q, k, v, bias, out, lse, grad_out, scale, k.shape[2])


def _with(fn, index, transform):
    def wrong(*args):
        grads = list(fn(*args))
        grads[index] = transform(grads[index], args)
        return tuple(grads)

    return wrong


def test_attention_backward_with_bias_accepts_the_reference():
    assert check_attention_backward_with_bias(_bias_backward)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda *a: _bias_backward(*a, d_term=False), "missing the softmax's D term"),
        (lambda *a: _bias_backward(*a, biased=False), "without the bias"),
        (
            lambda *a: _bias_backward(*a, bias_columns="first"),
            "from the first columns",
        ),
        (lambda *a: _bias_backward(*a, last_block=False), "last, shorter block"),
        (lambda *a: _bias_backward(*a, accumulate_dq=False), "last key block's share"),
        (_untiled, "as large as the scores of all 10 keys"),
        (_with(_bias_backward, 3, lambda g, a: a[-2] * g), "dbias is scaled"),
        (
            _with(_bias_backward, 0, lambda g, a: g / a[-2]),
            "dq is 1/scale times too large",
        ),
        (
            _with(
                _bias_backward,
                3,
                lambda g, a: g.expand(a[0].shape[0], *g.shape) / 2,
            ),
            "sums over the batch",
        ),
        (lambda *a: _bias_backward(*a)[:3], "return a tuple"),
        (_with(_bias_backward, 2, lambda g, a: g * 1.01), "dv .block_k=4. differs"),
    ],
)
def test_attention_backward_with_bias_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_attention_backward_with_bias(wrong)


def test_attention_backward_with_bias_checks_every_block_size():
    # right for blocks of 4 keys, wrong for blocks of 3: caught at block_k=3
    def right_for_four(*args):
        grads = _bias_backward(*args)
        return grads if args[-1] == 4 else (grads[0], grads[1], grads[2] * 2, grads[3])

    with pytest.raises(ExerciseError, match=r"block_k=3"):
        check_attention_backward_with_bias(right_for_four)


# --------------------------------------------------------------------------- exercise 4

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(
    triton is None or not (torch.cuda.is_available() or INTERPRETED),
    reason="needs Triton on a GPU or in its interpreter",
)

if triton is not None:

    @triton.jit
    def _delta_kernel(OUT, GRAD, DELTA, n_rows, D: tl.constexpr, BLOCK: tl.constexpr):
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        offsets = rows[:, None] * D + tl.arange(0, D)[None, :]
        ok = rows[:, None] < n_rows
        out = tl.load(OUT + offsets, mask=ok, other=0.0).to(tl.float32)
        grad = tl.load(GRAD + offsets, mask=ok, other=0.0).to(tl.float32)
        tl.store(DELTA + rows, tl.sum(out * grad, axis=1), mask=rows < n_rows)


def _launch(out, grad_out, *, ragged=True, dtype=torch.float32):
    rows = out.shape[0]
    delta = torch.empty(rows, dtype=torch.float32, device=out.device)
    # ragged=False: the mistake, rows // 16 programs drop the last, partial block
    n_programs = triton.cdiv(rows, 16) if ragged else rows // 16
    _delta_kernel[(n_programs,)](out, grad_out, delta, rows, D=out.shape[1], BLOCK=16)
    if not ragged:
        delta[n_programs * 16 :] = 0.0
    return delta.to(dtype)


@needs_triton
def test_delta_kernel_accepts_the_reference():
    assert check_delta_kernel(_launch)


@needs_triton
@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda o, g: _launch(o, g, ragged=False), "partial block of rows is missing"),
        (lambda o, g: _launch(o, g, dtype=o.dtype), "returned torch.float16.*float32"),
        (lambda o, g: (o.float() * g.float()).sum(0), "summed over the rows"),
        (lambda o, g: _launch(o, g) * 2, "differs from the reference"),
    ],
)
def test_delta_kernel_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_delta_kernel(wrong)


def test_delta_kernel_says_when_triton_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert check_delta_kernel(lambda o, g: None) is None
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1  # one line, and nothing else
    assert "not checked" in printed
