# This file is generated from chapters/03-positions.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""Positions for attention (chapter 3 of the course).

Attention by itself cannot tell one order of its inputs from another. This module holds the
ways the literature gives it back, each behind a small, validated interface:

* added to the input: :func:`sinusoidal_positions`, :class:`SinusoidalPositionalEncoding`,
  :class:`LearnedPositionalEmbedding`, called as ``module(x, offset)`` on ``(batch seq d_model)``;
* rotating queries and keys: :class:`RotaryEmbedding` (RoPE), called as ``rope(q, offset)`` on
  ``(batch heads seq d_head)``;
* a bias on the attention scores: :class:`ALiBi` and :class:`T5RelativePositionBias`, called as
  ``module(q_len, k_len, offset)`` and returning ``(heads q_len k_len)``.

Positions follow the course's KV-cache convention: queries sit at absolute positions
``offset .. offset + q_len - 1`` and keys at ``0 .. k_len - 1``.
"""

import math
import operator

import torch
from einops import einsum, rearrange
from torch import nn

__all__ = [
    "sinusoidal_positions",
    "sinusoidal_offset_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "rope_frequencies",
    "rope_rotate_half",
    "apply_rotary",
    "rotary_interleaved",
    "RotaryEmbedding",
    "alibi_slopes",
    "ALiBi",
    "t5_relative_position_bucket",
    "T5RelativePositionBias",
]


def _as_int(name: str, value: object) -> int:
    """``value`` as an int (Python or NumPy integer, 0-d integer tensor), or a clear error."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def _int_at_least(name: str, value: object, minimum: int) -> int:
    """``value`` as an int, or a clear error if it is not an integer ``>= minimum``."""
    value = _as_int(name, value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_base(base: float) -> float:
    if not isinstance(base, (int, float)) or isinstance(base, bool) or not base > 1:
        raise ValueError(f"base must be a number > 1 (the papers use 10000), got {base!r}")
    return float(base)


def _check_last_dim(x: object, size: int, what: str, axes: str) -> torch.Tensor:
    """Fail unless ``x`` is a floating tensor ``(... seq size)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(x).__name__}")
    if x.ndim < 2 or x.shape[-1] != size:
        raise ValueError(
            f"{what} expects x of shape ({axes}) with last axis {size}, got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"{what} expects a floating-point x, got {x.dtype}")
    return x


def sinusoidal_positions(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The sinusoidal table of Vaswani et al.: ``PE[pos, 2i] = sin(pos / base^(2i/d_model))``
    and ``PE[pos, 2i+1] = cos(pos / base^(2i/d_model))``.

    Shapes: the result is ``(n_positions d_model)``, float32 (computed in float64 so that
    large positions keep their accuracy). ``d_model`` must be even: dimensions come in
    (sin, cos) pairs.
    """
    n_positions = _int_at_least("n_positions", n_positions, 1)
    d_model = _int_at_least("d_model", d_model, 2)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model}")
    base = _check_base(base)
    position = torch.arange(n_positions, dtype=torch.float64)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    frequency = base ** (-two_i / d_model)  # (pair): one angular frequency per pair
    angle = einsum(position, frequency, "pos, pair -> pos pair")
    table = torch.stack((angle.sin(), angle.cos()), dim=-1)  # (pos pair sin_cos)
    return rearrange(table, "pos pair sin_cos -> pos (pair sin_cos)").float()


def sinusoidal_offset_matrix(k: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The matrix ``M_k`` with ``PE[pos + k] = M_k @ PE[pos]`` for every position ``pos``.

    It is block-diagonal, one 2x2 rotation ``[[cos(k w), sin(k w)], [-sin(k w), cos(k w)]]``
    per (sin, cos) pair with frequency ``w``, and it depends on the offset ``k`` only.
    ``k`` may be negative. Shapes: the result is ``(d_model d_model)``, float32.
    """
    k = _as_int("k", k)  # any sign: a negative offset moves back
    d_model = _int_at_least("d_model", d_model, 2)
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin/cos pairs), got {d_model}")
    base = _check_base(base)
    frequency = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    cos, sin = (k * frequency).cos(), (k * frequency).sin()
    blocks = torch.stack((torch.stack((cos, sin), -1), torch.stack((-sin, cos), -1)), -2)
    return torch.block_diag(*blocks).float()  # blocks: (pair 2 2)


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal table to token embeddings (no parameters), then dropout.

    ``forward(x, offset)``: ``x`` is ``(batch seq d_model)`` (any leading axes work); row
    ``t`` receives ``PE[offset + t]``. The table is precomputed up to ``max_len`` positions;
    beyond that the rows are computed on the fly, since the formula has no limit.
    """

    def __init__(
        self, d_model: int, max_len: int = 4096, dropout: float = 0.0, base: float = 10000.0
    ) -> None:
        super().__init__()
        self.d_model = _int_at_least("d_model", d_model, 2)
        self.max_len = _int_at_least("max_len", max_len, 1)
        self.base = _check_base(base)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.register_buffer("pe", sinusoidal_positions(max_len, d_model, base), persistent=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        _check_last_dim(x, self.d_model, "SinusoidalPositionalEncoding", "batch seq d_model")
        offset = _int_at_least("offset", offset, 0)
        end = offset + x.shape[-2]
        if end <= self.max_len:
            pe = self.pe[offset:end]
        else:  # past the cache: the formula still holds
            pe = sinusoidal_positions(end, self.d_model, self.base)[offset:].to(x.device)
        return self.dropout(x + pe.to(x.dtype))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, base={self.base:g}"


class LearnedPositionalEmbedding(nn.Module):
    """A learned vector per absolute position (BERT, GPT-2), added to token embeddings.

    ``forward(x, offset)``: ``x`` is ``(batch seq d_model)``; row ``t`` receives
    ``weight[offset + t]``. There is no row for positions ``>= max_len``: asking for one is
    a ``ValueError``, not a silent wrap-around or an index error deep inside ``nn.Embedding``.
    """

    def __init__(self, max_len: int, d_model: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_len = _int_at_least("max_len", max_len, 1)
        self.d_model = _int_at_least("d_model", d_model, 1)
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=init_std)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        _check_last_dim(x, self.d_model, "LearnedPositionalEmbedding", "batch seq d_model")
        offset = _int_at_least("offset", offset, 0)
        end = offset + x.shape[-2]
        if end > self.max_len:
            raise ValueError(
                f"LearnedPositionalEmbedding: positions {offset}..{end - 1} (offset={offset}, "
                f"seq={x.shape[-2]}) go past max_len={self.max_len}; a learned table has no "
                f"row for position {self.max_len} or later. Use a shorter input or a larger max_len."
            )
        positions = torch.arange(offset, end, device=self.embedding.weight.device)
        return x + self.embedding(positions).to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


def rope_frequencies(d_head: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE's angular frequencies ``theta_i = base^(-2i/d_head)``, ``i = 0 .. d_head/2 - 1``.

    Shapes: the result is ``(pair)`` with ``pair = d_head / 2``, float64.
    """
    d_head = _int_at_least("d_head", d_head, 2)
    if d_head % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions, so d_head must be even, got {d_head}")
    base = _check_base(base)
    return base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)


def rotary_interleaved(x: torch.Tensor, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
    """Reference RoPE with the paper's interleaved pairing, written with complex numbers.

    Dimensions ``(2i, 2i+1)`` form the complex number ``x[2i] + j x[2i+1]``, which is
    multiplied by ``exp(j * pos * theta_i)`` (as RoFormer and Meta's LLaMA code do). Clear
    rather than fast: it is the yardstick for :class:`RotaryEmbedding`.
    Shapes: ``x`` is ``(... seq d_head)``, the result the same.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rotary_interleaved takes a torch.Tensor, got {type(x).__name__}")
    if x.ndim < 2:
        raise ValueError(
            f"rotary_interleaved expects x of shape (... seq d_head), got {tuple(x.shape)}"
        )
    offset = _int_at_least("offset", offset, 0)
    frequency = rope_frequencies(x.shape[-1], base)
    positions = torch.arange(offset, offset + x.shape[-2], dtype=torch.float64)
    angle = einsum(positions, frequency, "pos, pair -> pos pair")
    pairs = rearrange(x.double(), "... pos (pair two) -> ... pos pair two", two=2)
    z = torch.view_as_complex(pairs.contiguous()) * torch.polar(torch.ones_like(angle), angle)
    out = rearrange(torch.view_as_real(z), "... pos pair two -> ... pos (pair two)")
    return out.to(x.dtype)


def _rope_cos_sin(
    positions: torch.Tensor, d_head: int, base: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``(pos d_head)`` in the half-split layout, float32."""
    angle = einsum(positions.double(), rope_frequencies(d_head, base), "pos, pair -> pos pair")
    angle = torch.cat((angle, angle), dim=-1)  # both halves of a pair share its angle
    return angle.cos().float(), angle.sin().float()


def rope_rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the two halves of the last axis: shape ``(... d) -> (... d)``.

    With the half-split pairing (dimension ``i`` pairs with ``i + d/2``), this is the
    quarter turn that ``x * cos + rope_rotate_half(x) * sin`` needs.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each half-split pair of ``x`` by its angle: ``x * cos + rope_rotate_half(x) * sin``.

    Shapes: ``x`` is ``(... seq d_head)``; ``cos`` and ``sin`` are ``(seq d_head)`` (or
    broadcastable to ``x``); the result has the shape of ``x``.
    """
    if not all(isinstance(t, torch.Tensor) for t in (x, cos, sin)):
        raise TypeError("apply_rotary takes three tensors: x, cos and sin")
    if x.ndim < 2 or x.shape[-1] % 2:
        raise ValueError(f"apply_rotary: d_head must be even, got x of shape {tuple(x.shape)}")
    if cos.shape != sin.shape or cos.shape[-2:] != x.shape[-2:]:
        raise ValueError(
            f"apply_rotary: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must both end in "
            f"(seq d_head) = {tuple(x.shape[-2:])}, the last two axes of x {tuple(x.shape)}"
        )
    return x * cos + rope_rotate_half(x) * sin


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE), applied to queries and keys inside attention.

    Pairing convention: **half-split** (dimension ``i`` pairs with ``i + d_head/2``), as in
    GPT-NeoX and the Hugging Face LLaMA code; it equals the paper's interleaved pairing up to
    a fixed permutation of the dimensions. ``cos``/``sin`` tables ``(max_len d_head)`` are
    precomputed buffers (angles computed in float64, stored in float32, so a float64 input
    is rotated to float32 accuracy); positions past ``max_len`` are computed on the fly.

    ``forward(x, offset)``: ``x`` is ``(... seq d_head)``, typically ``(batch heads seq
    d_head)``; position ``offset + t`` rotates row ``t``. The result has the shape of ``x``.
    """

    def __init__(self, d_head: int, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        self.d_head = _int_at_least("d_head", d_head, 2)
        if d_head % 2:
            raise ValueError(
                f"RoPE rotates pairs of dimensions, so d_head must be even, got {d_head}"
            )
        self.max_len = _int_at_least("max_len", max_len, 1)
        self.base = _check_base(base)
        cos, sin = _rope_cos_sin(torch.arange(max_len), d_head, self.base)
        self.register_buffer("cos_cached", cos, persistent=False)  # (pos d_head)
        self.register_buffer("sin_cached", sin, persistent=False)

    def cos_sin(self, offset: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(seq d_head)`` cos and sin rows for positions ``offset .. offset + seq - 1``."""
        offset = _int_at_least("offset", offset, 0)
        end = offset + _int_at_least("seq", seq, 0)
        if end <= self.max_len:
            return self.cos_cached[offset:end], self.sin_cached[offset:end]
        cos, sin = _rope_cos_sin(torch.arange(offset, end), self.d_head, self.base)
        return cos.to(self.cos_cached.device), sin.to(self.sin_cached.device)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        _check_last_dim(x, self.d_head, "RotaryEmbedding", "... seq d_head")
        offset = _int_at_least("offset", offset, 0)
        cos, sin = self.cos_sin(offset, x.shape[-2])
        return apply_rotary(x, cos.to(x.dtype), sin.to(x.dtype))

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, max_len={self.max_len}, base={self.base:g}"


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes: for a power of two ``n``, ``2^(-8h/n)`` for ``h = 1 .. n``.

    Otherwise (the rule of the authors' code): the slopes of the largest power of two ``m`` below ``n``,
    then every other slope of ``2m`` heads, ``2^(-4h/m)`` for odd ``h``, until there are
    ``n_heads``. Shapes: the result is ``(heads)``, float32.
    """
    n_heads = _int_at_least("n_heads", n_heads, 1)

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def _query_key_distance(q_len: int, k_len: int, offset: int, device: torch.device) -> torch.Tensor:
    """``i - j`` for query position ``i = offset + row`` and key position ``j``: ``(q_pos k_pos)``."""
    q_len = _int_at_least("q_len", q_len, 1)
    k_len = _int_at_least("k_len", k_len, 1)
    offset = _int_at_least("offset", offset, 0)
    query = torch.arange(offset, offset + q_len, device=device)
    key = torch.arange(k_len, device=device)
    return rearrange(query, "q_pos -> q_pos 1") - rearrange(key, "k_pos -> 1 k_pos")


class ALiBi(nn.Module):
    """Attention with Linear Biases: ``bias[h, i, j] = -slope_h * |i - j|`` (no parameters).

    ``forward(q_len, k_len, offset)`` returns the additive score bias ``(heads q_len k_len)``
    for queries at ``offset .. offset + q_len - 1`` and keys at ``0 .. k_len - 1``.
    With ``causal=True`` the bias also masks the future: entries with ``j > i`` are
    ``-inf``, so the result can be added to the scores with or without a causal mask.
    With ``causal=False`` it is the symmetric ``-slope * |i - j|``.
    """

    def __init__(self, n_heads: int, causal: bool = True) -> None:
        super().__init__()
        self.n_heads = _int_at_least("n_heads", n_heads, 1)
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        self.causal = causal
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)  # (heads)

    def forward(self, q_len: int, k_len: int, offset: int = 0) -> torch.Tensor:
        distance = _query_key_distance(q_len, k_len, offset, self.slopes.device)
        bias = -einsum(
            self.slopes, distance.abs().float(), "heads, q_pos k_pos -> heads q_pos k_pos"
        )
        if self.causal:
            bias = bias.masked_fill(distance < 0, float("-inf"))  # key j after query i
        return bias

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, causal={self.causal}"


def t5_relative_position_bucket(
    relative_position: torch.Tensor | int,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket for each relative position ``key_pos - query_pos`` (negative = the past).

    Within a direction, ``num_buckets`` buckets are split in two: distances below
    ``max_exact = num_buckets // 2`` get a bucket each; larger ones share buckets whose
    width grows logarithmically, up to ``max_distance``; every distance from
    ``max_distance`` on lands in the last bucket. ``bidirectional=True`` gives half of the
    buckets to each direction (future keys in the upper half); ``bidirectional=False``
    (causal) sends every future key to bucket 0, as it will be masked anyway.
    Shapes: ``relative_position`` is any integer tensor; the result has its shape (int64).
    """
    if not isinstance(relative_position, torch.Tensor):
        relative_position = torch.as_tensor(relative_position)
    if (
        relative_position.is_floating_point()
        or relative_position.is_complex()
        or relative_position.dtype == torch.bool
    ):
        raise TypeError(
            f"relative_position must hold integers, got dtype {relative_position.dtype}"
        )
    num_buckets = _int_at_least("num_buckets", num_buckets, 4 if bidirectional else 2)
    if bidirectional and num_buckets % 2:
        raise ValueError(
            f"bidirectional buckets are split in two halves, so num_buckets must be even, got {num_buckets}"
        )
    max_distance = _int_at_least("max_distance", max_distance, 1)
    distance = -relative_position.long()  # how far back the key is: > 0 for past keys
    bucket = torch.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (distance < 0).long() * num_buckets  # future keys: upper half
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)  # future keys: bucket 0
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance={max_distance} must exceed the exact range max_exact={max_exact} "
            f"(half of the {num_buckets} buckets per direction)"
        )
    # Past max_exact the bucket grows with log(distance): max_exact at max_exact, num_buckets at max_distance.
    log_ratio = torch.log(distance.clamp(min=max_exact).float() / max_exact) / math.log(
        max_distance / max_exact
    )
    far = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < max_exact, distance, far)


class T5RelativePositionBias(nn.Module):
    """T5's learned relative position bias: one scalar per (bucket, head).

    ``forward(q_len, k_len, offset)`` returns the additive score bias ``(heads q_len k_len)``
    for queries at ``offset .. offset + q_len - 1`` and keys at ``0 .. k_len - 1``. The table
    ``relative_attention_bias`` is an ``nn.Embedding(num_buckets, n_heads)`` (T5's name).
    """

    def __init__(
        self,
        n_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.n_heads = _int_at_least("n_heads", n_heads, 1)
        if not isinstance(bidirectional, bool):
            raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
        # Bucket one dummy position, only to validate num_buckets and max_distance now.
        t5_relative_position_bucket(
            torch.zeros(1, dtype=torch.long), bidirectional, num_buckets, max_distance
        )
        self.num_buckets, self.max_distance, self.bidirectional = (
            num_buckets,
            max_distance,
            bidirectional,
        )
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=init_std)

    def forward(self, q_len: int, k_len: int, offset: int = 0) -> torch.Tensor:
        device = self.relative_attention_bias.weight.device
        relative = -_query_key_distance(q_len, k_len, offset, device)  # key_pos - query_pos
        bucket = t5_relative_position_bucket(
            relative, self.bidirectional, self.num_buckets, self.max_distance
        )
        bias = self.relative_attention_bias(bucket)  # (q_pos k_pos heads)
        return rearrange(bias, "q_pos k_pos heads -> heads q_pos k_pos")

    def extra_repr(self) -> str:
        return (
            f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
