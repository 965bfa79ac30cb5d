# This file is generated from chapters/03-positions.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/03-positions.md, section "Sinusoidal positions".
"""Positions for attention (chapter 3 of the course).

Attention by itself cannot tell one order of its inputs from another. This
module holds the ways the literature gives it back, each behind a small,
validated interface:

* added to the input: :func:`sinusoidal_positions`,
  :class:`SinusoidalPositionalEncoding`,
  :class:`LearnedPositionalEmbedding`, called as ``module(x, offset)`` on
  ``(batch seq d_model)``;
* rotating queries and keys: :class:`RotaryEmbedding` (RoPE), called as
  ``rope(q, offset)`` on ``(batch heads seq d_head)``;
* a bias on the attention scores: :class:`ALiBi` and
  :class:`T5RelativePositionBias`, called as
  ``module(q_len, k_len, offset)`` and returning ``(heads q_len k_len)``.

Positions follow the course's KV-cache convention: queries sit at absolute
positions ``offset .. offset + q_len - 1`` and keys at ``0 .. k_len - 1``.
"""

import math

import torch
from einops import einsum, rearrange
from torch import nn

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "sinusoidal_positions",
    "sinusoidal_offset_matrix",
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "rope_frequencies",
    "rotary_interleaved",
    "rope_rotate_half",
    "apply_rotary",
    "RotaryEmbedding",
    "alibi_slopes",
    "ALiBi",
    "t5_relative_position_bucket",
    "T5RelativePositionBias",
]


# From chapters/03-positions.md, section "Sinusoidal positions".
# Every scheme's ``base`` (10000 in the papers): a finite number > 1.
_BASE = dict(low=1, low_open=True, hint="the papers use 10000")
# The hint of a d_model that is not even.
_PAIRS = "sin/cos pairs"


def _finer_than_tables(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is more precise than the float32 of the stored
    tables (even after ``module.double()``), so that rows for it must be
    computed afresh.
    """
    return torch.finfo(dtype).bits > 32


def _check_table(n_positions, d_model, base=10000.0, *, dtype=torch.float32):
    """The front door of ``sinusoidal_positions``."""
    check.int_at_least("n_positions", n_positions, 0)
    check.even("d_model", d_model, positive=True, hint=_PAIRS)
    check.finite_float("base", base, **_BASE)
    check.float_dtype("dtype", dtype)


# From chapters/03-positions.md, section "Sinusoidal positions".
@check.front_door(_check_table)
def sinusoidal_positions(
    n_positions: int,
    d_model: int,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The sinusoidal table of Vaswani et al.

    ``PE[pos, 2i] = sin(pos / base^(2i/d_model))`` and
    ``PE[pos, 2i+1] = cos(pos / base^(2i/d_model))``.

    Shapes: the result is ``(n_positions d_model)`` in ``dtype`` (computed
    in float64 so that large positions keep their accuracy, then rounded).
    ``d_model`` must be even: dimensions come in (sin, cos) pairs.
    """
    position = torch.arange(n_positions, dtype=torch.float64)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    # (pair): one angular frequency per pair
    frequency = base ** (-two_i / d_model)
    angle = einsum(position, frequency, "pos, pair -> pos pair")
    # (pos pair sin_cos)
    table = torch.stack((angle.sin(), angle.cos()), dim=-1)
    table = rearrange(table, "pos pair sin_cos -> pos (pair sin_cos)")
    return table.to(dtype)


# From chapters/03-positions.md, section "A fixed offset is a fixed rotation".
def _check_offset_matrix(k, d_model, base) -> tuple[int, int, float]:
    """The checked ``k``, ``d_model`` and ``base``."""
    k = check.integer("k", k)  # any sign: a negative offset moves back
    d_model = check.even("d_model", d_model, positive=True, hint=_PAIRS)
    return k, d_model, check.finite_float("base", base, **_BASE)


# From chapters/03-positions.md, section "A fixed offset is a fixed rotation".
def sinusoidal_offset_matrix(
    k: int, d_model: int, base: float = 10000.0
) -> torch.Tensor:
    """The matrix ``M_k`` with ``PE[pos + k] = M_k @ PE[pos]`` for every
    ``pos``.

    It is block-diagonal, one 2x2 rotation
    ``[[cos(k w), sin(k w)], [-sin(k w), cos(k w)]]`` per (sin, cos) pair
    with frequency ``w``, and it depends on the offset ``k`` only. ``k`` may
    be negative. Shapes: the result is ``(d_model d_model)``, float32.
    """
    k, d_model, base = _check_offset_matrix(k, d_model, base)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    frequency = base ** (-two_i / d_model)
    cos, sin = (k * frequency).cos(), (k * frequency).sin()
    top, bottom = torch.stack((cos, sin), -1), torch.stack((-sin, cos), -1)
    blocks = torch.stack((top, bottom), -2)  # (pair 2 2)
    return torch.block_diag(*blocks).float()


# From chapters/03-positions.md, section "The module".
def _check_encoding(max_len, dropout) -> tuple[int, float]:
    """The checked ``max_len`` and ``dropout`` (``sinusoidal_positions``
    checks ``d_model`` and ``base``)."""
    max_len = check.positive_int("max_len", max_len)
    return max_len, check.probability("dropout", dropout)


# forward: x of the table's width, on its device; offset >= 0
_check_added = check.layer_forward("... seq d_model", "pe", casts=True)


# From chapters/03-positions.md, section "The module".
class SinusoidalPositionalEncoding(nn.Module):
    """Adds the sinusoidal table to token embeddings (no parameters), then
    dropout.

    The table is precomputed (float32) up to ``max_len`` positions; rows
    beyond, or for an input more precise than float32, are computed on the
    fly, since the formula has no limit.
    """

    def __init__(
        self,
        d_model: int,
        max_len: int = 4096,
        dropout: float = 0.0,
        base: float = 10000.0,
    ) -> None:
        super().__init__()
        self.max_len, dropout = _check_encoding(max_len, dropout)
        # sinusoidal_positions checks d_model and base
        table = sinusoidal_positions(max_len, d_model, base)
        self.register_buffer("pe", table, persistent=False)
        self.d_model, self.base = table.shape[-1], float(base)
        self.dropout = nn.Dropout(dropout)

    @check.front_door(_check_added)
    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Add ``PE[offset + t]`` to row ``t`` of ``x``.

        Shapes: ``x`` is ``(batch seq d_model)`` (any leading axes work),
        floating point, on the module's device; the result has the shape and
        dtype of ``x``.
        """
        end = offset + x.shape[-2]
        if end <= self.max_len and not _finer_than_tables(x.dtype):
            pe = self.pe[offset:end]
        else:
            # past the table, or finer than it: the formula gives any row
            table = sinusoidal_positions(end, self.d_model, self.base, dtype=x.dtype)
            pe = table[offset:]
        return self.dropout(x + pe.to(x.device, x.dtype))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}, base={self.base:g}"


# From chapters/03-positions.md, section "Learned absolute positions".
def _check_learned_init(max_len, d_model, init_std) -> tuple:
    """The checked ``max_len``, ``d_model`` and ``init_std``."""
    max_len, d_model = check.positive_ints(max_len=max_len, d_model=d_model)
    return max_len, d_model, check.finite_float("init_std", init_std, low=0)


# the input, and rows that exist: the table ends at max_len - 1
_check_learned = check.layer_forward(
    "... seq d_model", "embedding.weight", casts=True, rows="max_len"
)


# From chapters/03-positions.md, section "Learned absolute positions".
class LearnedPositionalEmbedding(nn.Module):
    """A learned vector per absolute position (BERT, GPT-2), added to token
    embeddings.

    ``forward(x, offset)``: ``x`` is ``(batch seq d_model)``; row ``t``
    receives ``weight[offset + t]``. There is no row for positions
    ``>= max_len``: asking for one is a ``ValueError``, not a slice that
    quietly comes back short.
    """

    def __init__(self, max_len: int, d_model: int, init_std=0.02) -> None:
        super().__init__()
        checked = _check_learned_init(max_len, d_model, init_std)
        self.max_len, self.d_model, init_std = checked
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=init_std)

    @check.front_door(_check_learned)
    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Add ``weight[offset + t]`` to row ``t`` of ``x``.

        Shapes: ``x`` is ``(batch seq d_model)`` (any leading axes work),
        floating point, on the module's device; the result has the shape and
        dtype of ``x``.
        """
        rows = self.embedding.weight[offset : offset + x.shape[-2]]
        return x + rows.to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


# From chapters/03-positions.md, section "Rotary position embeddings (RoPE)".
def _check_rope_frequencies(d_head, base) -> tuple[int, float]:
    """The checked ``d_head`` and ``base``."""
    hint = "RoPE rotates pairs of dimensions"
    d_head = check.even("d_head", d_head, positive=True, hint=hint)
    return d_head, check.finite_float("base", base, **_BASE)


# From chapters/03-positions.md, section "Rotary position embeddings (RoPE)".
def rope_frequencies(d_head: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE's frequencies ``theta_i = base^(-2i/d_head)``,
    ``i = 0 .. d_head/2 - 1``.

    Shapes: the result is ``(pair)`` with ``pair = d_head / 2``, float64.
    """
    d_head, base = _check_rope_frequencies(d_head, base)
    two_i = torch.arange(0, d_head, 2, dtype=torch.float64)
    return base ** (-two_i / d_head)


# From chapters/03-positions.md, section "Rotary position embeddings (RoPE)".
def _check_interleaved(x, offset) -> int:
    """The checked ``offset``; ``x`` a floating ``(... seq d_head)``."""
    owner = "rotary_interleaved()"
    check.tensor("x", x, "... seq d_head", floating=True, owner=owner)
    return check.int_at_least("offset", offset, 0, owner=owner)


# From chapters/03-positions.md, section "Rotary position embeddings (RoPE)".
def rotary_interleaved(
    x: torch.Tensor, offset: int = 0, base: float = 10000.0
) -> torch.Tensor:
    """Reference RoPE with the paper's interleaved pairing, with complex
    numbers.

    Dimensions ``(2i, 2i+1)`` form the complex number ``x[2i] + j x[2i+1]``,
    which is multiplied by ``exp(j * pos * theta_i)`` (as RoFormer and
    Meta's LLaMA code do). Clear rather than fast: it is the yardstick for
    :class:`RotaryEmbedding`. Shapes: ``x`` is ``(... seq d_head)``, the
    result the same.
    """
    offset = _check_interleaved(x, offset)
    frequency = rope_frequencies(x.shape[-1], base)
    end = offset + x.shape[-2]
    positions = torch.arange(offset, end, dtype=torch.float64)
    angle = einsum(positions, frequency, "pos, pair -> pos pair")
    to_pairs = "... pos (pair two) -> ... pos pair two"
    pairs = rearrange(x.double(), to_pairs, two=2)
    turn = torch.polar(torch.ones_like(angle), angle)  # exp(j angle)
    z = torch.view_as_complex(pairs.contiguous()) * turn
    pairs = torch.view_as_real(z)
    out = rearrange(pairs, "... pos pair two -> ... pos (pair two)")
    return out.to(x.dtype)


# From chapters/03-positions.md, section "An efficient RoPE for a whole batch".
def _check_half(x) -> None:
    owner = "rope_rotate_half()"
    check.tensor("x", x, "... d", owner=owner)
    check.even("the last axis of x", x.shape[-1], positive=True, owner=owner)


def _check_rotary(x, cos, sin) -> None:
    owner = "apply_rotary()"
    check.tensor("x", x, "... seq d_head", floating=True, owner=owner)
    check.even("d_head", x.shape[-1], positive=True, owner=owner)
    check.same_dtype_and_device(x=x, cos=cos, sin=sin, owner=owner)
    if cos.shape != sin.shape or cos.shape[-2:] != x.shape[-2:]:
        got = f"cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
        got += f", x {tuple(x.shape)}"
        raise ValueError(f"{owner}: cos, sin must both end in x's (seq d_head): {got}")


# From chapters/03-positions.md, section "An efficient RoPE for a whole batch".
def _rope_cos_sin(
    positions: torch.Tensor, d_head: int, base: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``(pos d_head)``, half-split layout, float64."""
    frequency = rope_frequencies(d_head, base)
    angle = einsum(positions.double(), frequency, "pos, pair -> pos pair")
    # both halves of a pair share its angle
    angle = torch.cat((angle, angle), dim=-1)
    return angle.cos(), angle.sin()


@check.front_door(_check_half)
def rope_rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the halves of the last axis:
    ``(... d) -> (... d)``.

    With the half-split pairing (dimension ``i`` pairs with ``i + d/2``),
    this is the quarter turn that ``x * cos + rope_rotate_half(x) * sin``
    needs.
    """
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@check.front_door(_check_rotary)
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each half-split pair of ``x``:
    ``x * cos + rope_rotate_half(x) * sin``.

    Shapes: ``x`` is ``(... seq d_head)``; ``cos`` and ``sin`` are
    ``(seq d_head)`` (or broadcastable to ``x``), of the dtype of ``x`` and
    on its device; the result has the shape and dtype of ``x``.
    """
    return x * cos + rope_rotate_half(x) * sin


# From chapters/03-positions.md, section "An efficient RoPE for a whole batch".
def _check_rows(rope, offset, seq, dtype=None) -> None:
    owner = "RotaryEmbedding.cos_sin()"
    check.nonnegative_ints(offset=offset, seq=seq, owner=owner)
    if dtype is not None:
        check.float_dtype("dtype", dtype, owner=owner)


# forward: x of the tables' width, on their device; offset >= 0
_check_rotated = check.layer_forward("... seq d_head", "cos_cached", casts=True)


# From chapters/03-positions.md, section "An efficient RoPE for a whole batch".
class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE), applied to queries and keys inside
    attention.

    Pairing convention: **half-split** (dimension ``i`` pairs with
    ``i + d_head/2``), as in GPT-NeoX and the Hugging Face LLaMA code; it
    equals the paper's interleaved pairing up to a fixed permutation of the
    dimensions. ``cos``/``sin`` tables ``(max_len d_head)`` are precomputed
    buffers (angles computed in float64, stored in float32); rows past
    ``max_len``, or for an input more precise than the tables (float64), are
    computed on the fly, so a float64 input is rotated to float64 accuracy.
    """

    def __init__(self, d_head: int, max_len: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        self.max_len = check.positive_int("max_len", max_len)
        # rope_frequencies (called by _rope_cos_sin) checks d_head and base
        cos, sin = _rope_cos_sin(torch.arange(max_len), d_head, base)
        self.d_head, self.base = cos.shape[-1], float(base)
        # Tables of shape (pos d_head), not saved in the state dict.
        self.register_buffer("cos_cached", cos.float(), persistent=False)
        self.register_buffer("sin_cached", sin.float(), persistent=False)

    @check.front_door(_check_rows)
    def cos_sin(
        self, offset: int, seq: int, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(seq d_head)`` cos and sin rows of the positions
        ``offset .. offset + seq - 1``, in ``dtype`` (default: the tables'
        dtype)."""
        end, table = offset + seq, self.cos_cached
        dtype = table.dtype if dtype is None else dtype
        if end <= self.max_len and not _finer_than_tables(dtype):
            cos, sin = (self.cos_cached[offset:end], self.sin_cached[offset:end])
            return cos.to(dtype), sin.to(dtype)
        # past the tables, or finer than them: compute these rows (in
        # float64, then rounded)
        positions = torch.arange(offset, end)
        cos, sin = _rope_cos_sin(positions, self.d_head, self.base)
        return cos.to(table.device, dtype), sin.to(table.device, dtype)

    @check.front_door(_check_rotated)
    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate row ``t`` of ``x`` (a query or a key) to position
        ``offset + t``.

        Shapes: ``x`` is ``(... seq d_head)``, typically
        ``(batch heads seq d_head)``, floating point, on the module's
        device; the result has the shape and dtype of ``x``.
        """
        cos, sin = self.cos_sin(offset, x.shape[-2], x.dtype)
        return apply_rotary(x, cos, sin)

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, max_len={self.max_len}, base={self.base:g}"


# From chapters/03-positions.md, section "ALiBi: a linear bias on the scores".
def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes: for a power of two ``n``, ``2^(-8h/n)`` for
    ``h = 1 .. n``.

    Otherwise (the rule of the authors' code): the slopes of the largest
    power of two ``m`` below ``n``, then every other slope of ``2m`` heads,
    ``2^(-4h/m)`` for odd ``h``, until there are ``n_heads``. Shapes: the
    result is ``(heads)``, float32.
    """
    n_heads = check.positive_int("n_heads", n_heads)

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    closest = 2 ** math.floor(math.log2(n_heads))
    # every other slope of twice as many heads, as many as are missing
    extra = geometric(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(geometric(closest) + extra, dtype=torch.float32)


# From chapters/03-positions.md, section "ALiBi: a linear bias on the scores".
def _query_key_distance(
    q_len: int, k_len: int, offset: int, device: torch.device
) -> torch.Tensor:
    """``i - j`` for query ``i = offset + row`` and key ``j``:
    ``(q_pos k_pos)``."""
    query = torch.arange(offset, offset + q_len, device=device)
    key = torch.arange(k_len, device=device)
    query = rearrange(query, "q_pos -> q_pos 1")
    return query - rearrange(key, "k_pos -> 1 k_pos")


# From chapters/03-positions.md, section "ALiBi: a linear bias on the scores".
def _check_lengths(module, q_len, k_len, offset=0) -> None:
    """A bias module's front door: lengths >= 1, ``offset`` >= 0."""
    check.positive_ints(q_len=q_len, k_len=k_len)
    check.int_at_least("offset", offset, 0)


# From chapters/03-positions.md, section "ALiBi: a linear bias on the scores".
class ALiBi(nn.Module):
    """Attention with Linear Biases: ``bias[h, i, j] = -slope_h * |i - j|``,
    no weights.

    ``forward(q_len, k_len, offset)`` returns the additive score bias
    ``(heads q_len k_len)`` for queries at ``offset .. offset + q_len - 1``
    and keys at ``0 .. k_len - 1``. With ``causal=True`` the bias also masks
    the future: entries with ``j > i`` are ``-inf``, so the result can be
    added to the scores with or without a causal mask. With ``causal=False``
    it is the symmetric ``-slope * |i - j|``.
    """

    def __init__(self, n_heads: int, causal: bool = True) -> None:
        super().__init__()
        self.causal = check.boolean("causal", causal)
        slopes = alibi_slopes(n_heads)  # (heads); checks n_heads
        self.n_heads = len(slopes)
        self.register_buffer("slopes", slopes, persistent=False)

    @check.front_door(_check_lengths)
    def forward(self, q_len: int, k_len: int, offset: int = 0) -> torch.Tensor:
        """The bias of the queries at ``offset .. offset + q_len - 1`` and
        the keys.

        The keys sit at ``0 .. k_len - 1``. Shapes: the result is
        ``(heads q_pos k_pos)``, float32, on the module's device.
        """
        slopes = self.slopes
        distance = _query_key_distance(q_len, k_len, offset, slopes.device)
        how_far = distance.abs().float()
        per_head = "heads, q_pos k_pos -> heads q_pos k_pos"
        bias = -einsum(slopes, how_far, per_head)
        if self.causal:
            # key j after query i
            bias = bias.masked_fill(distance < 0, float("-inf"))
        return bias

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, causal={self.causal}"


# From chapters/03-positions.md, section "T5's bucketed relative bias".
def _check_buckets(bidirectional, num_buckets, max_distance) -> tuple:
    """T5's bucket settings, checked: ``max_distance`` must exceed the
    exact range."""
    bidirectional = check.boolean("bidirectional", bidirectional)
    least = 4 if bidirectional else 2  # two buckets a direction, at least
    num_buckets = check.int_at_least("num_buckets", num_buckets, least)
    if bidirectional:
        hint = "bidirectional buckets: two halves"
        check.even("num_buckets", num_buckets, hint=hint)
    max_distance = check.positive_int("max_distance", max_distance)
    max_exact = num_buckets // (4 if bidirectional else 2)
    if max_distance <= max_exact:
        exact = f"max_exact={max_exact} (half the buckets of a direction)"
        raise ValueError(f"max_distance={max_distance} must exceed {exact}")
    return bidirectional, num_buckets, max_distance


# From chapters/03-positions.md, section "T5's bucketed relative bias".
def t5_relative_position_bucket(
    relative_position: torch.Tensor | int,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket of each relative position ``key_pos - query_pos`` (< 0:
    the past).

    Within a direction (all ``num_buckets`` when causal, half of them when
    bidirectional), the buckets are split in two: distances below
    ``max_exact`` (half a direction's buckets) get a bucket each; larger
    ones share buckets whose width grows logarithmically, up to
    ``max_distance``; every distance from ``max_distance`` on lands in the
    last bucket.
    ``bidirectional=True`` gives half of the buckets to each direction
    (future keys in the upper half); ``bidirectional=False`` (causal) sends
    every future key to bucket 0, as it will be masked anyway. Shapes:
    ``relative_position`` is any integer tensor; the result has its shape
    (int64).
    """
    if not isinstance(relative_position, torch.Tensor):
        relative_position = torch.as_tensor(relative_position)
    settings = bidirectional, num_buckets, max_distance
    if not check.trusted():  # (trusted: the module, which checked them)
        check.tensor("relative_position", relative_position, integer=True)
        settings = _check_buckets(*settings)
    bidirectional, num_buckets, max_distance = settings
    # how far back the key is: > 0 for past keys
    distance = -relative_position.long()
    bucket = torch.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        # future keys: the upper half
        bucket = bucket + (distance < 0).long() * num_buckets
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)  # future keys: bucket 0
    # below max_distance: _check_buckets saw to it
    max_exact = num_buckets // 2
    # Past max_exact the bucket grows with log(distance): max_exact at
    # max_exact, num_buckets at max_distance.
    ratio = distance.clamp(min=max_exact).float() / max_exact
    log_ratio = torch.log(ratio) / math.log(max_distance / max_exact)
    far = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < max_exact, distance, far)


# From chapters/03-positions.md, section "T5's bucketed relative bias".
class T5RelativePositionBias(nn.Module):
    """T5's learned relative position bias: one scalar per (bucket, head).

    ``forward(q_len, k_len, offset)`` returns the additive score bias
    ``(heads q_len k_len)`` for queries at ``offset .. offset + q_len - 1``
    and keys at ``0 .. k_len - 1``. The table ``relative_attention_bias`` is
    an ``nn.Embedding(num_buckets, n_heads)`` (T5's name).
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
        self.n_heads = check.positive_int("n_heads", n_heads)
        settings = _check_buckets(bidirectional, num_buckets, max_distance)
        self.bidirectional, self.num_buckets, self.max_distance = settings
        init_std = check.finite_float("init_std", init_std, low=0)
        table = nn.Embedding(self.num_buckets, self.n_heads)
        nn.init.normal_(table.weight, std=init_std)
        self.relative_attention_bias = table

    @check.front_door(_check_lengths)
    def forward(self, q_len: int, k_len: int, offset: int = 0) -> torch.Tensor:
        """The bias of the queries at ``offset .. offset + q_len - 1`` and
        the keys.

        The keys sit at ``0 .. k_len - 1``. Shapes: the result is
        ``(heads q_pos k_pos)``, in the table's dtype and on its device.
        """
        device = self.relative_attention_bias.weight.device
        # key_pos - query_pos
        relative = -_query_key_distance(q_len, k_len, offset, device)
        settings = self.bidirectional, self.num_buckets, self.max_distance
        bucket = t5_relative_position_bucket(relative, *settings)
        bias = self.relative_attention_bias(bucket)  # (q_pos k_pos heads)
        return rearrange(bias, "q_pos k_pos heads -> heads q_pos k_pos")

    def extra_repr(self) -> str:
        return (
            f"n_heads={self.n_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}"
        )
