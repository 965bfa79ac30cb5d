# This file is generated from chapters/06-norms.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""Normalisation layers and the residual wrapper (chapter 6 of the course).

* :class:`LayerNorm` and :class:`RMSNorm`, written with einops reductions over the feature
  axis and checked against ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm``;
* :func:`make_norm`, which builds either by name;
* :class:`ResidualSublayer`, which wraps a sublayer (attention, feed-forward) in a residual
  connection with dropout on the branch and the normalisation before it (``"pre"``) or after
  the sum (``"post"``);
* :func:`make_final_norm`, the normalisation a pre-LN stack needs after its last block.

Every tensor is ``(... d_model)``: any leading axes (batch, sequence) and the features last.
"""

from __future__ import annotations

import math

import torch
from einops import reduce
from torch import nn

__all__ = [
    "NORM_KINDS",
    "NORM_POSITIONS",
    "LayerNorm",
    "RMSNorm",
    "ResidualSublayer",
    "make_final_norm",
    "make_norm",
]


NORM_POSITIONS = ("pre", "post")
NORM_KINDS = ("layernorm", "rmsnorm")


def _check_size(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(
            f"eps must be a finite number > 0 (it keeps the division away from zero), got {eps!r}"
        )
    return float(eps)


def _check_features(module: nn.Module, x: object, d_model: int) -> torch.Tensor:
    """Fail clearly unless ``x`` is a floating tensor whose last axis has ``d_model`` entries."""
    name = type(module).__name__
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} takes a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} needs a floating-point tensor, got dtype {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != d_model:
        raise ValueError(
            f"{name}(d_model={d_model}) expects the features on the last axis, with {d_model} "
            f"entries, but got x of shape {tuple(x.shape)}"
        )
    return x


class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al., 2016) over the last axis, as in ``torch.nn.LayerNorm``.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, where ``mean`` and ``var`` are the
    mean and the *biased* variance (divided by ``d_model``) of each token's features, and
    ``eps`` sits *inside* the square root. Shapes: ``x`` is ``(... d_model)``, and so is
    the result. fp16 and bf16 inputs are normalised in fp32 and cast back.

    Args:
        d_model: the size of the normalised (last) axis.
        eps: added to the variance before the square root; must be > 0.
        elementwise_affine: learn a per-feature gain ``weight`` (initialised to 1).
        bias: with ``elementwise_affine``, also learn a per-feature ``bias`` (initialised to 0).
    """

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.d_model = _check_size("d_model", d_model)
        self.eps = _check_eps(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = nn.Parameter(torch.ones(d_model)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(d_model)) if elementwise_affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(... d_model)`` -> ``(... d_model)``, each token with mean 0 and variance ~1."""
        _check_features(self, x, self.d_model)
        x32 = x.float()
        mean = reduce(x32, "... d_model -> ... 1", "mean")
        centred = x32 - mean
        var = reduce(centred.pow(2), "... d_model -> ... 1", "mean")  # biased: divides by d
        y = centred * torch.rsqrt(var + self.eps)  # eps inside the square root
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.d_model}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019), as in ``torch.nn.RMSNorm``.

    ``y = x / sqrt(mean(x**2) + eps) * weight``: LayerNorm without the centring (no mean is
    subtracted) and without a bias. Shapes: ``x`` is ``(... d_model)``, and so is the result.
    fp16 and bf16 inputs are normalised in fp32 and cast back.

    Args:
        d_model: the size of the normalised (last) axis.
        eps: added to the mean square before the square root; must be > 0.
        elementwise_affine: learn a per-feature gain ``weight`` (initialised to 1).
    """

    def __init__(self, d_model: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.d_model = _check_size("d_model", d_model)
        self.eps = _check_eps(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.weight = nn.Parameter(torch.ones(d_model)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(... d_model)`` -> ``(... d_model)``, each token with root mean square ~1."""
        _check_features(self, x, self.d_model)
        x32 = x.float()
        mean_square = reduce(x32.pow(2), "... d_model -> ... 1", "mean")
        y = x32 * torch.rsqrt(mean_square + self.eps)
        if self.weight is not None:
            y = y * self.weight
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


def make_norm(kind: str, d_model: int, eps: float | None = None) -> nn.Module:
    """A normalisation layer by name: ``"layernorm"`` or ``"rmsnorm"`` (each with its default eps).

    ``make_norm("rmsnorm", 512)`` is ``RMSNorm(512)``; pass ``eps`` to override the default.
    """
    if kind not in NORM_KINDS:
        raise ValueError(f"unknown norm {kind!r}; use one of {', '.join(map(repr, NORM_KINDS))}")
    cls = LayerNorm if kind == "layernorm" else RMSNorm
    return cls(d_model) if eps is None else cls(d_model, eps=eps)


class ResidualSublayer(nn.Module):
    """A sublayer ``f`` wrapped in a residual connection, a normalisation and dropout.

    * ``position="pre"`` (GPT-2 and nearly every model since): ``x + Dropout(f(Norm(x)))``.
    * ``position="post"`` (the original Transformer): ``Norm(x + Dropout(f(x)))``.

    Dropout acts on the branch ``f`` only, never on the skip path. A stack of pre-LN blocks
    needs one more normalisation after its last block: see :func:`make_final_norm`.

    Shapes: ``x`` is ``(... d_model)``; ``f`` must map it to the same shape. Extra arguments
    of ``forward`` go to ``f`` (for instance an attention mask, or the encoder's output).

    Args:
        sublayer: the module ``f`` (attention, feed-forward, ...).
        d_model: the size of the feature axis.
        position: ``"pre"`` or ``"post"``.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        dropout: the probability of zeroing an entry of ``f``'s output in training.
        eps: the normalisation's epsilon (``None``: its default).
    """

    def __init__(
        self,
        sublayer: nn.Module,
        d_model: int,
        position: str = "pre",
        norm: str = "layernorm",
        dropout: float = 0.0,
        eps: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(sublayer, nn.Module):
            raise TypeError(
                f"sublayer must be an nn.Module (so its parameters are registered), "
                f"got {type(sublayer).__name__}"
            )
        if position not in NORM_POSITIONS:
            raise ValueError(
                f"unknown norm position {position!r}; use one of "
                f"{', '.join(map(repr, NORM_POSITIONS))}"
            )
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout must be a float, got {type(dropout).__name__}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.d_model = _check_size("d_model", d_model)
        self.position = position
        self.sublayer = sublayer
        self.norm = make_norm(norm, d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """``x``: ``(... d_model)`` -> ``(... d_model)``."""
        _check_features(self, x, self.d_model)
        if self.position == "pre":
            return x + self.dropout(self._branch(self.norm(x), x, *args, **kwargs))
        return self.norm(x + self.dropout(self._branch(x, x, *args, **kwargs)))

    def _branch(self, h: torch.Tensor, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = self.sublayer(h, *args, **kwargs)
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"the sublayer {type(self.sublayer).__name__} must return a tensor of the "
                f"input's shape {tuple(x.shape)} for the residual sum, but returned {got}"
            )
        return out

    def extra_repr(self) -> str:
        return f"position={self.position!r}"


def make_final_norm(
    position: str, d_model: int, norm: str = "layernorm", eps: float | None = None
) -> nn.Module:
    """The normalisation that follows the last block of a stack of :class:`ResidualSublayer`.

    Pre-LN blocks never normalise the residual stream itself, only copies of it on the way
    into each sublayer, so the stack's output needs one normalisation: a fresh ``norm``. A
    post-LN stack already ends in one, so this returns ``nn.Identity()`` for ``"post"``.
    """
    if position not in NORM_POSITIONS:
        raise ValueError(
            f"unknown norm position {position!r}; use one of {', '.join(map(repr, NORM_POSITIONS))}"
        )
    if position == "post":
        _check_size("d_model", d_model)
        return nn.Identity()
    return make_norm(norm, d_model, eps)
