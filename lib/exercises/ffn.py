"""Checkers for the exercises of chapter 5 (the feed-forward network).

Each checker compares the reader's function with a reference on fixed inputs and, when they
differ, tries the usual wrong answers first so that the message says what went wrong.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import einsum

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
)

__all__ = [
    "check_gelu_tanh_approx",
    "check_swiglu_forward",
    "check_gated_hidden_size",
    "check_ffn_param_count",
]


def _tanh_gelu(x: torch.Tensor, *, scale: float, cubic: float, half: float = 0.5) -> torch.Tensor:
    return half * x * (1 + torch.tanh(scale * (x + cubic * x**3)))


def _matches(got: torch.Tensor, want: torch.Tensor, atol: float = 1e-5) -> bool:
    return got.shape == want.shape and torch.allclose(got.double(), want.double(), atol=atol)


@checker("Exercise 1: GELU, tanh form")
def check_gelu_tanh_approx(gelu_fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """``gelu_fn(x)`` must be ``x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))``, any shape."""
    generator = torch.Generator().manual_seed(1)
    x = torch.cat([torch.linspace(-6, 6, 241), 3 * torch.randn(59, generator=generator)])
    x = x.reshape(3, 100)
    got = expect_tensor(call_without_mutation(gelu_fn, x), tuple(x.shape))
    sqrt_2_over_pi = math.sqrt(2 / math.pi)
    want = _tanh_gelu(x, scale=sqrt_2_over_pi, cubic=0.044715)
    if _matches(got, want):
        return
    mistakes = [
        (
            _tanh_gelu(x, scale=sqrt_2_over_pi, cubic=0.0),
            "the 0.044715·x³ term inside the tanh is missing: the argument is "
            "√(2/π)·(x + 0.044715·x³)",
        ),
        (
            _tanh_gelu(x, scale=2 / math.pi, cubic=0.044715),
            "the factor in front is √(2/π) ≈ 0.798, not 2/π ≈ 0.637 (the square root is missing)",
        ),
        (
            _tanh_gelu(x, scale=math.sqrt(math.pi / 2), cubic=0.044715),
            "the factor in front is √(2/π) ≈ 0.798; you used √(π/2) ≈ 1.253 (upside down)",
        ),
        (
            _tanh_gelu(x, scale=1.0, cubic=0.044715),
            "the argument of the tanh must be multiplied by √(2/π) ≈ 0.798",
        ),
        (
            _tanh_gelu(x, scale=sqrt_2_over_pi, cubic=0.044715, half=1.0),
            "the factor 1/2 in front is missing: x/2 · (1 + tanh(...))",
        ),
        (
            0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
            "this is the exact (erf) GELU; the exercise asks for the tanh approximation",
        ),
    ]
    for wrong, diagnosis in mistakes:
        if _matches(got, wrong):
            raise ExerciseError(diagnosis)
    expect_close(got, want, "gelu_tanh(x)", hint="check the formula term by term")


def _swiglu_reference(x, w_gate, w_value, w_out, gate_fn=F.silu, value_fn=None, after=None):
    gate = einsum(x, w_gate, "batch seq d_model, d_model d_ff -> batch seq d_ff")
    value = einsum(x, w_value, "batch seq d_model, d_model d_ff -> batch seq d_ff")
    if value_fn is not None:
        value = value_fn(value)
    hidden = gate_fn(gate) * value
    if after is not None:
        hidden = after(hidden)
    return einsum(hidden, w_out, "batch seq d_ff, d_ff d_model -> batch seq d_model")


@checker("Exercise 2: SwiGLU from three matrices")
def check_swiglu_forward(swiglu_fn: Callable[..., torch.Tensor]) -> None:
    """``swiglu_fn(x, w_gate, w_value, w_out)`` = ``(SiLU(x W_gate) ⊗ x W_value) W_out``."""
    generator = torch.Generator().manual_seed(5)
    for batch, seq, d_model, d_ff in [(2, 5, 8, 12), (1, 3, 4, 6)]:
        x = torch.randn(batch, seq, d_model, generator=generator)
        w_gate = torch.randn(d_model, d_ff, generator=generator) / math.sqrt(d_model)
        w_value = torch.randn(d_model, d_ff, generator=generator) / math.sqrt(d_model)
        w_out = torch.randn(d_ff, d_model, generator=generator) / math.sqrt(d_ff)
        args = (x, w_gate, w_value, w_out)
        got = call_without_mutation(swiglu_fn, *args)
        if isinstance(got, torch.Tensor) and tuple(got.shape) == (batch, seq, d_ff):
            raise ExerciseError(
                f"the result has shape {tuple(got.shape)} = (batch, seq, d_ff): "
                "the product still needs the output projection w_out back to d_model"
            )
        expect_tensor(got, (batch, seq, d_model))
        want = _swiglu_reference(*args)
        if _matches(got, want):
            continue
        identity = lambda t: t
        mistakes = [
            (
                _swiglu_reference(x, w_value, w_gate, w_out),
                "SiLU went on the value branch: apply it to x @ w_gate and leave x @ w_value linear",
            ),
            (
                _swiglu_reference(*args, gate_fn=identity, after=F.silu),
                "SiLU was applied after the product; apply it to the gate branch only, then multiply",
            ),
            (
                _swiglu_reference(*args, value_fn=F.silu),
                "SiLU was applied to both branches; the value branch x @ w_value stays linear",
            ),
            (
                _swiglu_reference(*args, gate_fn=identity),
                "the SiLU is missing: the gate is SiLU(x @ w_gate)",
            ),
            (
                _swiglu_reference(*args, gate_fn=torch.sigmoid),
                "that is GLU (a sigmoid gate); SwiGLU's gate is SiLU(z) = z · sigmoid(z)",
            ),
            (
                _swiglu_reference(*args, gate_fn=F.relu),
                "that is ReGLU (a ReLU gate); SwiGLU's gate is SiLU(z) = z · sigmoid(z)",
            ),
            (
                _swiglu_reference(*args, gate_fn=F.gelu),
                "that is GEGLU (a GELU gate); SwiGLU's gate is SiLU(z) = z · sigmoid(z)",
            ),
        ]
        for wrong, diagnosis in mistakes:
            if _matches(got, wrong):
                raise ExerciseError(diagnosis)
        expect_close(got, want, "swiglu(x, w_gate, w_value, w_out)")


def _gated_hidden_reference(d_model: int, multiple_of: int) -> int:
    hidden = 8 * d_model // 3
    return multiple_of * -(-hidden // multiple_of)  # ceiling division in integers


@checker("Exercise 3: the 8/3 rule, rounded up")
def check_gated_hidden_size(hidden_size_fn: Callable[[int, int], int]) -> None:
    """``hidden_size_fn(d_model, multiple_of)`` = ``floor(8/3·d_model)`` rounded up to a multiple."""
    cases = [
        (4096, 256),  # LLaMA-7B: 11008
        (5120, 256),  # LLaMA-13B: 13824
        (8192, 256),  # LLaMA-65B: 22016
        (512, 64),
        (768, 256),  # 8/3 · 768 = 2048 is already a multiple
        (96, 64),  # 256, already a multiple
        (4096, 1),  # no rounding: 10922
        (100, 7),  # floor(266.67) = 266 = 38 · 7 is a multiple: stays 266
    ]
    for d_model, multiple_of in cases:
        got = hidden_size_fn(d_model, multiple_of)
        want = _gated_hidden_reference(d_model, multiple_of)
        call = f"hidden_size({d_model}, {multiple_of})"
        if isinstance(got, float) and got == want:
            raise ExerciseError(f"{call} returned the float {got!r}; return an int")
        if not isinstance(got, int) or isinstance(got, bool):
            raise ExerciseError(f"{call} should return an int, got {type(got).__name__} {got!r}")
        if got == want:
            continue
        hidden = 8 * d_model // 3
        if got % multiple_of != 0:
            if got in (hidden, math.ceil(8 * d_model / 3)):
                raise ExerciseError(
                    f"{call} returned {got}, the 8/3 size before rounding; round it up to a "
                    f"multiple of {multiple_of} (expected {want})"
                )
            raise ExerciseError(f"{call} returned {got}, which is not a multiple of {multiple_of}")
        if got == multiple_of * (hidden // multiple_of):
            raise ExerciseError(
                f"{call} returned {got}: that rounds down; round up to a multiple instead "
                f"(expected {want}), so the gated FFN is never smaller than the rule says"
            )
        if got == multiple_of * math.ceil(8 * d_model / 3 / multiple_of):
            raise ExerciseError(
                f"{call} returned {got}: take the integer part of 8/3 · d_model first "
                f"({hidden}), then round up (expected {want})"
            )
        if got == multiple_of * (hidden // multiple_of + 1):
            raise ExerciseError(
                f"{call} returned {got}, one multiple too many: {hidden} is already a "
                f"multiple of {multiple_of}, so it stays (expected {want})"
            )
        if got == multiple_of * math.ceil(4 * d_model / multiple_of):
            raise ExerciseError(
                f"{call} returned {got}, the plain FFN's 4 · d_model; a gated FFN uses "
                f"8/3 · d_model (expected {want})"
            )
        raise ExerciseError(f"{call} returned {got}, expected {want}")


def _ffn_params_reference(d_model: int, d_ff: int, gated: bool, bias: bool) -> int:
    n_in = 2 * d_ff if gated else d_ff
    return d_model * n_in + d_ff * d_model + ((n_in + d_model) if bias else 0)


@checker("Exercise 4: counting an FFN's parameters")
def check_ffn_param_count(count_fn: Callable[[int, int, bool, bool], int]) -> None:
    """``count_fn(d_model, d_ff, gated, bias)`` = the FFN's number of parameters."""
    for d_model, d_ff in [(768, 3072), (4096, 11008), (10, 7)]:
        for gated in (False, True):
            for bias in (False, True):
                got = count_fn(d_model, d_ff, gated, bias)
                want = _ffn_params_reference(d_model, d_ff, gated, bias)
                call = f"count_params({d_model}, {d_ff}, gated={gated}, bias={bias})"
                if not isinstance(got, int) or isinstance(got, bool):
                    if isinstance(got, float) and got == want:
                        raise ExerciseError(f"{call} returned the float {got!r}; return an int")
                    raise ExerciseError(
                        f"{call} should return an int, got {type(got).__name__} {got!r}"
                    )
                if got == want:
                    continue
                diagnoses = [
                    (bias, want - d_model, "the output layer's bias (d_model numbers) is missing"),
                    (
                        gated and bias,
                        want - d_ff,
                        "a gated FFN has two input biases (gate and value), d_ff numbers each",
                    ),
                    (
                        gated,
                        want - d_model * d_ff,
                        "a gated FFN has three weight matrices, not two",
                    ),
                    (
                        gated and bias,
                        want - d_model * d_ff - d_ff,
                        "a gated FFN has three matrices and 2·d_ff input biases; "
                        "you counted a plain FFN",
                    ),
                    (
                        not bias,
                        want + d_ff + d_model,
                        "with bias=False there are no biases to count",
                    ),
                    (
                        not bias and gated,
                        want + 2 * d_ff + d_model,
                        "with bias=False there are no biases to count",
                    ),
                ]
                hint = next(
                    (msg for applies, value, msg in diagnoses if applies and got == value),
                    "count each matrix (rows × columns) and each bias vector",
                )
                raise ExerciseError(f"{call} returned {got:,}, expected {want:,}: {hint}")
