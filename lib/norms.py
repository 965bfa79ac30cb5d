# This file is generated from chapters/06-norms.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/06-norms.md, section "The module".
"""Normalisation layers and the residual wrapper (chapter 6 of the course).

* :class:`LayerNorm` and :class:`RMSNorm`, written with einops reductions
  over the feature axis and checked against ``torch.nn.LayerNorm`` and
  ``torch.nn.RMSNorm``;
* :func:`make_norm`, which builds either by name;
* :class:`ResidualSublayer`, which wraps a sublayer (attention,
  feed-forward) in a residual connection with dropout on the branch and the
  normalisation before it (``"pre"``) or after the sum (``"post"``);
* :func:`make_final_norm`, the normalisation a pre-LN stack needs after its
  last block.

Every tensor is ``(... d_model)``: any leading axes (batch, sequence) and
the features last.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import reduce
from torch import nn

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "NORM_POSITIONS",
    "NORM_KINDS",
    "LayerNorm",
    "RMSNorm",
    "make_norm",
    "ResidualSublayer",
    "make_final_norm",
]


# From chapters/06-norms.md, section "The module".
NORM_POSITIONS = ("pre", "post")
NORM_KINDS = ("layernorm", "rmsnorm")


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for fp32 and half-precision inputs, fp64 for fp64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _as(x: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``x`` in ``dtype`` (None stays None); no call when it already is: a
    decoding step calls this a few dozen times per token."""
    return x if x is None or x.dtype == dtype else x.to(dtype)


def _in_range(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(... d_model)`` with every row whose largest entry passes
    ``sqrt(max / (4 d_model))`` of its dtype divided down to that size, so
    that no square, sum of squares or centred square overflows. On the CPU
    (not compiling), ``x`` itself when no entry passes the limit.
    """
    limit = math.sqrt(torch.finfo(x.dtype).max / (4 * x.shape[-1]))
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        if x.numel() == 0:
            return x
        # one read, no copy: the common case returns x untouched (NaN too:
        # no comparison with it is true)
        low, high = torch.aminmax(x.detach())
        low, high = low.item(), high.item()
        if not (-low > limit or high > limit):
            return x
    largest = x.detach().abs().amax(dim=-1, keepdim=True)
    return x / (largest / limit).clamp(min=1.0)  # other rows: / 1


# From chapters/06-norms.md, section "The module".
# eps must be > 0
_EPS_HINT = "it keeps the division away from zero"
_EPS = dict(low=0, low_open=True, hint=_EPS_HINT)

# ``x`` is a float ``(... d_model)`` tensor on the device of
# ``module.weight``, if it has one (the norm casts it to x's dtype)
_check_features = check.layer_forward("... d_model", "weight", casts=True)


def _check_norm(owner, d_model, eps, **flags) -> tuple[int, float]:
    """A norm's ``d_model`` (an int ``>= 1``) and ``eps`` (a float
    ``> 0``), checked, and its boolean ``flags``."""
    d_model = check.positive_int("d_model", d_model, owner=owner)
    eps = check.finite_float("eps", eps, owner=owner, **_EPS)
    check.booleans(owner=owner, **flags)
    return d_model, eps


# From chapters/06-norms.md, section "The module".
class LayerNorm(nn.Module):
    """Layer normalisation (Ba et al., 2016) over the last axis, as in
    ``torch.nn.LayerNorm``.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias``, where ``mean`` and
    ``var`` are the mean and the *biased* variance (divided by ``d_model``)
    of each token's features, and ``eps`` sits *inside* the square root.
    Shapes: ``x`` is ``(... d_model)``, and so is the result. fp16 and bf16
    inputs are normalised in fp32 and cast back; a row too large to square
    is scaled down first, which leaves its result as it is.

    Args: d_model: the size of the normalised (last) axis. eps: added to the
        variance before the square root; must be > 0. elementwise_affine:
        learn a per-feature gain ``weight`` (initialised to 1). bias: with
        ``elementwise_affine``, also learn a per-feature ``bias``
        (initialised to 0). fused: compute with ``F.layer_norm`` (one
        kernel; the default) instead of the einops teaching form; both give
        the same result (tested).
    """

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        fused: bool = True,
    ) -> None:
        super().__init__()
        flags = dict(elementwise_affine=elementwise_affine, bias=bias)
        sizes = _check_norm("LayerNorm", d_model, eps, **flags, fused=fused)
        self.d_model, self.eps = sizes
        self.elementwise_affine, self.fused = elementwise_affine, fused
        self.weight = self.bias = None
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(d_model))
        if elementwise_affine and bias:
            self.bias = nn.Parameter(torch.zeros(d_model))

    @check.front_door(_check_features)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise each token: mean 0 and variance ~1 over its features.

        Shapes: ``x`` is ``(... d_model)``, any float dtype; the result is
        ``(... d_model)``, in ``x``'s dtype.
        """
        dtype = _compute_dtype(x)
        xc = _in_range(_as(x, dtype))
        weight, bias = _as(self.weight, dtype), _as(self.bias, dtype)
        if self.fused:
            y = F.layer_norm(xc, (self.d_model,), weight, bias, self.eps)
            return _as(y, x.dtype)
        mean = reduce(xc, "... d_model -> ... 1", "mean")
        centred = xc - mean
        # the biased variance: divides by d
        var = reduce(centred.pow(2), "... d_model -> ... 1", "mean")
        # eps inside the square root
        y = centred * torch.rsqrt(var + self.eps)
        if weight is not None:
            y = y * weight
        if bias is not None:
            y = y + bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        affine = f"elementwise_affine={self.elementwise_affine}"
        return (
            f"{self.d_model}, eps={self.eps}, {affine}, "
            f"bias={self.bias is not None}, fused={self.fused}"
        )


# From chapters/06-norms.md, section "RMSNorm".
class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Zhang and Sennrich, 2019), as in
    ``torch.nn.RMSNorm``.

    ``y = x / sqrt(mean(x**2) + eps) * weight``: LayerNorm without the
    centring (no mean is subtracted) and without a bias. Shapes: ``x`` is
    ``(... d_model)``, and so is the result. fp16 and bf16 inputs are
    normalised in fp32 and cast back; a row too large to square is scaled
    down first, which leaves its result as it is.

    Args: d_model: the size of the normalised (last) axis. eps: added to the
        mean square before the square root; must be > 0. elementwise_affine:
        learn a per-feature gain ``weight`` (initialised to 1). fused:
        compute with ``F.rms_norm`` (the default) instead of the einops
        teaching form.
    """

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        *,
        fused: bool = True,
    ) -> None:
        super().__init__()
        flags = dict(elementwise_affine=elementwise_affine, fused=fused)
        sizes = _check_norm("RMSNorm", d_model, eps, **flags)
        self.d_model, self.eps = sizes
        self.elementwise_affine, self.fused = elementwise_affine, fused
        self.weight = None
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(d_model))

    @check.front_door(_check_features)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise each token: root mean square ~1 over its features.

        Shapes: ``x`` is ``(... d_model)``, any float dtype; the result is
        ``(... d_model)``, in ``x``'s dtype.
        """
        dtype = _compute_dtype(x)
        xc = _in_range(_as(x, dtype))
        weight = _as(self.weight, dtype)
        if self.fused:
            y = F.rms_norm(xc, (self.d_model,), weight, self.eps)
            return _as(y, x.dtype)
        mean_square = reduce(xc.pow(2), "... d_model -> ... 1", "mean")
        y = xc * torch.rsqrt(mean_square + self.eps)
        if weight is not None:
            y = y * weight
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        affine = f"elementwise_affine={self.elementwise_affine}"
        return f"{self.d_model}, eps={self.eps}, {affine}, fused={self.fused}"


# From chapters/06-norms.md, section "RMSNorm".
def make_norm(kind: str, d_model: int, eps: float | None = None) -> nn.Module:
    """A normalisation layer by name: ``"layernorm"`` or ``"rmsnorm"`` (each
    with its default eps).

    ``make_norm("rmsnorm", 512)`` is ``RMSNorm(512)``; pass ``eps`` to
    override the default.
    """
    check.one_of("kind", kind, NORM_KINDS, owner="make_norm()")
    cls = LayerNorm if kind == "layernorm" else RMSNorm
    return cls(d_model) if eps is None else cls(d_model, eps=eps)


# From chapters/06-norms.md, section "Where the normalisation goes: post-LN and pre-LN".
def _check_residual(sublayer, position, norm, dropout) -> tuple[str, float]:
    """:class:`ResidualSublayer`'s arguments (the norm checks ``d_model``
    and ``eps``); returns ``position`` and ``dropout``, checked."""
    owner = "ResidualSublayer"
    if not isinstance(sublayer, nn.Module):
        why = "(so its parameters are registered)"
        got = f"got {type(sublayer).__name__}"
        raise TypeError(f"{owner}: sublayer must be an nn.Module {why}, {got}")
    position = check.one_of("position", position, NORM_POSITIONS, owner=owner)
    check.one_of("norm", norm, NORM_KINDS, owner=owner)
    dropout = check.probability("dropout", dropout, owner=owner)
    return position, dropout


def _check_branch(sublayer, out, x) -> None:
    """The sublayer's output ``out`` is a tensor of ``x``'s shape, ready
    for the residual sum."""
    if not (isinstance(out, torch.Tensor) and out.shape == x.shape):
        is_tensor = torch.is_tensor(out)
        got = tuple(out.shape) if is_tensor else type(out).__name__
        name, shape = type(sublayer).__name__, tuple(x.shape)
        raise ValueError(
            f"the sublayer {name} must return a tensor of the input's "
            f"shape {shape} (or a tuple starting with one) for the "
            f"residual sum, but returned {got}"
        )


# From chapters/06-norms.md, section "Where the normalisation goes: post-LN and pre-LN".
class ResidualSublayer(nn.Module):
    """A sublayer ``f`` wrapped in a residual connection, a normalisation
    and dropout.

    * ``position="pre"`` (GPT-2 and nearly every model since): ``x +
      Dropout(f(Norm(x)))``.
    * ``position="post"`` (the original Transformer):
      ``Norm(x + Dropout(f(x)))``.

    Dropout acts on the branch ``f`` only, never on the skip path. A stack
    of pre-LN blocks needs one more normalisation after its last block: see
    :func:`make_final_norm`.

    Shapes: ``x`` is ``(... d_model)``; ``f`` must map it to the same shape.
    Extra arguments of ``forward`` go to ``f`` (for instance an attention
    mask, or the encoder's output). If ``f`` returns a tuple
    ``(out, *extras)`` (attention with a KV cache or its weights), the
    wrapper returns ``(x + Dropout(out), *extras)`` (post-LN: the norm of
    that sum),
    so the extras cross the residual connection.

    Args: sublayer: the module ``f`` (attention, feed-forward, ...).
        d_model: the size of the feature axis. position: ``"pre"`` or
        ``"post"``. norm: ``"layernorm"`` or ``"rmsnorm"``. dropout: the
        probability of zeroing an entry of ``f``'s output in training. eps:
        the normalisation's epsilon (``None``: its default).
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
        args = (sublayer, position, norm, dropout)
        self.position, dropout = _check_residual(*args)
        self.sublayer = sublayer
        # the norm checks d_model and eps
        self.norm = make_norm(norm, d_model, eps)
        self.d_model = self.norm.d_model
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, *args, **kwargs):
        """The residual step around the sublayer; extra arguments go to the
        sublayer.

        Shapes: ``x`` is ``(... d_model)``; the result is ``(... d_model)``,
        or ``(that, *extras)`` when the sublayer returns ``(out, *extras)``.
        """
        # not a front door: the sublayer checks its own arguments
        if not check.trusted():
            _check_features(self, x)
        pre = self.position == "pre"
        out, extras = self._branch(self.norm(x) if pre else x, x, *args, **kwargs)
        if self.training:  # (in eval, dropout is the identity: skip the call)
            out = self.dropout(out)
        y = x + out if pre else self.norm(x + out)
        return y if extras is None else (y, *extras)

    def _branch(self, h: torch.Tensor, x: torch.Tensor, *args, **kwargs):
        """The sublayer's output and its extras (``None`` when it returned a
        plain tensor).
        """
        out = self.sublayer(h, *args, **kwargs)
        extras = None
        if isinstance(out, tuple) and len(out) > 0:
            out, extras = out[0], out[1:]
        # a checked model's sublayers are trusted to keep the shape
        if not check.trusted():
            _check_branch(self.sublayer, out, x)
        return out, extras

    def extra_repr(self) -> str:
        return f"position={self.position!r}"


# From chapters/06-norms.md, section "The final normalisation of a pre-LN stack".
def make_final_norm(
    position: str, d_model: int, norm="layernorm", eps: float | None = None
) -> nn.Module:
    """The normalisation that follows the last block of a stack of
    :class:`ResidualSublayer`.

    Pre-LN blocks never normalise the residual stream itself, only copies of
    it on the way into each sublayer, so the stack's output needs one
    normalisation: a fresh ``norm``. A post-LN stack already ends in one, so
    this returns ``nn.Identity()`` for ``"post"``.
    """
    owner = "make_final_norm()"
    check.one_of("position", position, NORM_POSITIONS, owner=owner)
    check.one_of("norm", norm, NORM_KINDS, owner=owner)
    # make_norm checks d_model and eps, for "post" too
    final = make_norm(norm, d_model, eps)
    return final if position == "pre" else nn.Identity()
