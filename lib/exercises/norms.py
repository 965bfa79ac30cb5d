"""Checkers for the exercises of chapter 6 (normalisation and residual connections).

Each checker compares the reader's answer with a reference (autograd for the gradients, a
formula for the residual stream) and, when they differ, tries the typical wrong answers (the
normalising statistics treated as constants in the backward pass, the gain forgotten, the
gradients of the gain and bias not summed over tokens, LayerNorm's formula used for RMSNorm,
standard deviations added where variances add) to say which mistake was made.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
    is_close,
)

__all__ = ["check_layer_norm_backward", "check_rms_norm_backward", "check_stream_rms"]


def _inputs(seed: int, d_model: int = 8):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, d_model, generator=generator, dtype=torch.float64) * 2 + 0.5
    weight = torch.randn(d_model, generator=generator, dtype=torch.float64)
    bias = torch.randn(d_model, generator=generator, dtype=torch.float64)
    grad_out = torch.randn(2, 3, d_model, generator=generator, dtype=torch.float64)
    return x, weight, bias, grad_out


# -- Exercise 1 -------------------------------------------------------------------------------
def _layer_norm_grads(x, weight, bias, grad_out, eps):
    """Autograd's gradients of ``sum(grad_out * layer_norm(x))`` for x, weight and bias."""
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    out = torch.nn.functional.layer_norm(
        leaves[0], (x.shape[-1],), *leaves[1:], eps=eps
    )
    return torch.autograd.grad(out, leaves, grad_out)


@checker("Exercise 1: the LayerNorm backward pass by hand")
def check_layer_norm_backward(fn: Callable[..., tuple]) -> None:
    """``fn(x, weight, grad_out, eps) -> (grad_x, grad_weight, grad_bias)``."""
    for seed, eps in ((0, 1e-5), (1, 0.1)):
        x, weight, bias, grad_out = _inputs(seed)
        got = call_without_mutation(fn, x, weight, grad_out, eps)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            raise ExerciseError(
                f"return a triple (grad_x, grad_weight, grad_bias), got {type(got).__name__}"
            )
        grad_x, grad_weight, grad_bias = got
        want_x, want_weight, want_bias = _layer_norm_grads(
            x, weight, bias, grad_out, eps
        )
        for name, grad in (("grad_weight", grad_weight), ("grad_bias", grad_bias)):
            if isinstance(grad, torch.Tensor) and grad.shape == x.shape:
                raise ExerciseError(
                    f"{name} has shape {tuple(grad.shape)}: the gain and bias are shared by "
                    "every token, so sum their gradients over batch and seq -> (d_model,)"
                )
        expect_close(grad_bias, want_bias, "grad_bias")
        expect_close(grad_weight, want_weight, "grad_weight")
        if is_close(grad_x, want_x):
            continue
        mean = x.mean(-1, keepdim=True)
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
        x_hat = (x - mean) / sigma
        g = grad_out * weight
        if is_close(grad_x, g / sigma):
            raise ExerciseError(
                "grad_x = g / sigma treats the mean and sigma as constants; both depend on "
                "x: subtract mean(g) and x_hat * mean(g * x_hat) before dividing by sigma"
            )
        if is_close(grad_x, (g - g.mean(-1, keepdim=True)) / sigma):
            raise ExerciseError(
                "grad_x is missing the term from sigma's dependence on x: - x_hat * mean(g * x_hat)"
            )
        dx_no_gain = grad_out - grad_out.mean(-1, keepdim=True)
        dx_no_gain = dx_no_gain - x_hat * (grad_out * x_hat).mean(-1, keepdim=True)
        if is_close(grad_x, dx_no_gain / sigma):
            raise ExerciseError(
                "grad_x ignores the gain: the gradient reaching x_hat is grad_out * weight"
            )
        expect_close(grad_x, want_x, "grad_x")


# -- Exercise 2 -------------------------------------------------------------------------------
def _rms_norm_grad(x, weight, grad_out, eps):
    leaf = x.clone().requires_grad_()
    out = leaf * torch.rsqrt(leaf.pow(2).mean(-1, keepdim=True) + eps) * weight
    (grad,) = torch.autograd.grad(out, leaf, grad_out)
    return grad


@checker("Exercise 2: RMSNorm's gradient")
def check_rms_norm_backward(fn: Callable[..., torch.Tensor]) -> None:
    """``fn(x, weight, grad_out, eps) -> grad_x``, all ``(batch seq d_model)``."""
    for seed, eps in ((2, 1e-6), (3, 0.1)):
        x, weight, _, grad_out = _inputs(seed)
        got = call_without_mutation(fn, x, weight, grad_out, eps)
        want = _rms_norm_grad(x, weight, grad_out, eps)
        expect_tensor(got, tuple(x.shape), "grad_x")
        if is_close(got, want):
            continue
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        g = grad_out * weight
        if is_close(got, g / rms):
            raise ExerciseError(
                "grad_x = g / rms treats the RMS as a constant; it depends on x: "
                "subtract x * mean(g * x) / rms**3"
            )
        x_hat = x / rms
        layer_norm_like = (
            g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)
        ) / rms
        if is_close(got, layer_norm_like):
            raise ExerciseError(
                "that is LayerNorm's gradient: RMSNorm subtracts no mean, so there is no "
                "- mean(g) term"
            )
        expect_close(got, want, "grad_x")


# -- Exercise 3 -------------------------------------------------------------------------------
@checker("Exercise 3: the residual stream's growth")
def check_stream_rms(fn: Callable[[int, float, float], float]) -> None:
    """``fn(n_layers, input_rms, weight_std) -> float``: the predicted stream RMS."""
    for n_layers, input_rms, weight_std in (
        (0, 1.0, 0.5),
        (16, 1.0, 0.5),
        (8, 2.0, 1.5),
    ):
        call = f"stream_rms({n_layers}, {input_rms}, {weight_std})"
        got = fn(n_layers, input_rms, weight_std)
        want = math.sqrt(input_rms**2 + n_layers * weight_std**2)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise ExerciseError(f"{call} returned {got!r}; return a number")
        if math.isclose(got, want, rel_tol=1e-6):
            continue
        if math.isclose(got, input_rms + n_layers * weight_std, rel_tol=1e-6):
            raise ExerciseError(
                f"{call} = {got:.4g}: RMS values do not add; the branches are independent "
                "of the stream, so their *variances* (squared RMS) add"
            )
        if math.isclose(got, math.sqrt(1 + n_layers * weight_std**2), rel_tol=1e-6):
            raise ExerciseError(
                f"{call} = {got:.4g}: the input's own variance is missing"
            )
        if math.isclose(got, math.sqrt(n_layers) * weight_std, rel_tol=1e-6):
            raise ExerciseError(
                f"{call} = {got:.4g}: the input's own variance is missing"
            )
        if math.isclose(got, input_rms**2 + n_layers * weight_std**2, rel_tol=1e-6):
            raise ExerciseError(
                f"{call} = {got:.4g}: that is the variance; take its root"
            )
        raise ExerciseError(f"{call} = {got:.4g}, expected {want:.4g}")
