"""Checkers for the exercises of chapter 6 (normalisation and residual connections).

Each checker compares the reader's function with a reference on random inputs and, when they
differ, tries the typical wrong answers (epsilon outside the square root, the unbiased variance,
the wrong axis, subtracting the mean in RMSNorm, post-LN order, a norm on the skip path) to say
which mistake was made.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
)

__all__ = ["check_layer_norm", "check_pre_ln_residual", "check_rms_norm"]


def _matches(got: torch.Tensor, want: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and bool(torch.allclose(got.double(), want.double(), atol=1e-5, rtol=1e-4))
    )


def _compare(
    got: object,
    want: torch.Tensor,
    mistakes: dict[str, torch.Tensor],
    what: str,
) -> None:
    """Pass if ``got`` matches ``want``; otherwise name the first known mistake it matches."""
    got = expect_tensor(got, tuple(want.shape), what)
    if _matches(got, want):
        return
    for diagnosis, wrong in mistakes.items():
        if _matches(got, wrong):
            raise ExerciseError(f"{what} is wrong: {diagnosis}")
    expect_close(got, want, what)


def _layer_norm_variants(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    def affine(normalised: torch.Tensor) -> torch.Tensor:
        return normalised * weight + bias

    mean = x.mean(-1, keepdim=True)
    centred = x - mean
    var = centred.pow(2).mean(-1, keepdim=True)
    reference = affine(centred / torch.sqrt(var + eps))
    seq_centred = x - x.mean(-2, keepdim=True)
    seq_var = seq_centred.pow(2).mean(-2, keepdim=True)
    all_centred = x - x.mean()
    mistakes = {
        "epsilon must be added to the variance *inside* the square root, "
        "sqrt(var + eps), not to the standard deviation": affine(centred / (torch.sqrt(var) + eps)),
        "use the biased variance (divide by d, as torch.var(..., unbiased=False) does), "
        "not the unbiased one (divide by d - 1)": affine(
            centred / torch.sqrt(x.var(-1, unbiased=True, keepdim=True) + eps)
        ),
        "the mean and variance must be taken over the last axis (each token's own "
        "d_model features), but you normalised over the sequence axis": affine(
            seq_centred / torch.sqrt(seq_var + eps)
        ),
        "the mean and variance must be taken per token over the last axis, not over "
        "the whole tensor": affine(all_centred / torch.sqrt(all_centred.pow(2).mean() + eps)),
        "the normalisation is right, but the gain and bias are missing: "
        "multiply by weight, then add bias": centred / torch.sqrt(var + eps),
        "the normalisation is right, but apply the gain before the bias "
        "(normalised * weight + bias)": (centred / torch.sqrt(var + eps) + bias) * weight,
    }
    return reference, mistakes


@checker("Exercise 1: LayerNorm")
def check_layer_norm(candidate: Callable[..., torch.Tensor]) -> None:
    """``candidate(x, weight, bias, eps)``: ``x`` ``(batch seq d_model)``, ``weight`` and
    ``bias`` ``(d_model,)``, returns ``(batch seq d_model)``."""
    gen = torch.Generator().manual_seed(6)
    batch, seq, d_model = 3, 5, 8
    cases = [
        # ordinary tokens with a large mean and spread, the usual tiny eps
        (3 * torch.randn(batch, seq, d_model, generator=gen) + 2, 1e-5),
        # quiet tokens with a large eps, where epsilon's place changes the result
        (0.05 * torch.randn(batch, seq, d_model, generator=gen) - 1, 1e-2),
    ]
    weight = torch.randn(d_model, generator=gen)
    bias = torch.randn(d_model, generator=gen)
    for x, eps in cases:
        got = call_without_mutation(candidate, x, weight, bias, eps)
        want, mistakes = _layer_norm_variants(x, weight, bias, eps)
        _compare(got, want, mistakes, f"layer_norm(x, weight, bias, eps={eps})")


@checker("Exercise 2: RMSNorm")
def check_rms_norm(candidate: Callable[..., torch.Tensor]) -> None:
    """``candidate(x, weight, eps)``: ``x`` ``(batch seq d_model)``, ``weight`` ``(d_model,)``."""
    gen = torch.Generator().manual_seed(7)
    batch, seq, d_model = 3, 5, 8
    weight = torch.randn(d_model, generator=gen)
    for x, eps in [
        (torch.randn(batch, seq, d_model, generator=gen) + 1.5, 1e-6),  # a mean far from 0
        (0.05 * torch.randn(batch, seq, d_model, generator=gen), 1e-2),  # eps matters here
    ]:
        got = call_without_mutation(candidate, x, weight, eps)
        mean_square = x.pow(2).mean(-1, keepdim=True)
        want = x / torch.sqrt(mean_square + eps) * weight
        centred = x - x.mean(-1, keepdim=True)
        mistakes = {
            "RMSNorm does not subtract the mean: divide x itself by its root mean square "
            "(that centring is what LayerNorm adds)": centred
            / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps)
            * weight,
            "epsilon must be added to the mean square *inside* the square root": x
            / (torch.sqrt(mean_square) + eps)
            * weight,
            "divide by the root of the mean of the squares, not of their sum": x
            / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)
            * weight,
            "the mean of squares must be over the last axis (each token's features), "
            "not over the sequence": x / torch.sqrt(x.pow(2).mean(-2, keepdim=True) + eps) * weight,
            "the normalisation is right, but the gain is missing: multiply by weight": x
            / torch.sqrt(mean_square + eps),
        }
        _compare(got, want, mistakes, f"rms_norm(x, weight, eps={eps})")


@checker("Exercise 3: a pre-LN residual step")
def check_pre_ln_residual(candidate: Callable[..., torch.Tensor]) -> None:
    """``candidate(x, norm, sublayer)``: ``x`` ``(batch seq d_model)``; ``norm`` and
    ``sublayer`` map ``(batch seq d_model)`` to the same shape."""
    torch.manual_seed(8)
    batch, seq, d_model = 2, 6, 16
    norm = nn.LayerNorm(d_model)
    with torch.no_grad():  # a non-trivial gain and bias, so that every mistake shows
        norm.weight.normal_(1.0, 0.5)
        norm.bias.normal_(0.0, 0.5)
    sublayer = nn.Sequential(nn.Linear(d_model, d_model), nn.Tanh())
    x = 2 * torch.randn(batch, seq, d_model) + 1
    with torch.no_grad():
        got = call_without_mutation(candidate, x, norm, sublayer)
        want = x + sublayer(norm(x))
        mistakes = {
            "that is post-LN, Norm(x + f(x)); pre-LN normalises the sublayer's input: "
            "x + f(Norm(x))": norm(x + sublayer(x)),
            "the skip path must carry x itself, not Norm(x): x + f(Norm(x)), "
            "not Norm(x) + f(Norm(x))": norm(x) + sublayer(norm(x)),
            "the residual connection is missing: add x to the sublayer's output": sublayer(norm(x)),
            "the normalisation is missing: the sublayer must see Norm(x)": x + sublayer(x),
            "normalise the input of the sublayer, not its output: x + f(Norm(x)), "
            "not x + Norm(f(x))": x + norm(sublayer(x)),
        }
    _compare(got, want, mistakes, "pre_ln_residual(x, norm, sublayer)")
