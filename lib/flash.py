# This file is generated from chapters/09-1-tiling.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/09-1-tiling.md, section "Why attention is memory-bound".
"""FlashAttention (chapter 9, page 1): IO counts, online softmax, tiling.

Exact attention that never stores the ``(q_pos, k_pos)`` score matrix, in
PyTorch:

* :func:`attention_core_flops`, :func:`attention_hbm_bytes` and
  :func:`roofline_seconds`: what attention computes and moves, and the time
  that bounds.
* :func:`online_softmax`: the running maximum and running sum, on rows.
* :func:`tiled_attention_forward` and :func:`tiled_attention_backward`,
  wrapped as :class:`FlashAttentionTorch`, an ``autograd.Function`` that
  saves only ``q``, ``k``, ``v``, the output and the log-sum-exp, and
  recomputes the scores in backward.

Importing the module registers the attention backend ``"flash_torch"``
(:func:`flash_attention_torch`; see :mod:`lib.attention`): attention with
``causal`` (bottom-right aligned), grouped key/value heads and any
``scale``; a ``mask``, a ``bias`` or dropout make it fall back to
:func:`lib.attention.sdpa_attention`, with a warning shown once
(:func:`sdpa_fallback`). Shapes: ``q`` is ``(batch heads q_pos d_head)``,
``k`` and ``v`` ``(batch kv_heads k_pos d_head)``. The same algorithm as
Triton kernels, and the ``"flash_triton"`` backend, are
:mod:`lib.flash_triton` (page 2)."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
import warnings

import torch
from einops import einsum, rearrange, reduce
from torch.autograd.function import once_differentiable

from lib import _checks as check
from lib.attention import register_attention_backend, sdpa_attention

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "attention_core_flops",
    "attention_hbm_bytes",
    "roofline_seconds",
    "online_softmax",
    "causal_block_kind",
    "check_flash_arguments",
    "tiled_attention_forward",
    "tiled_attention_backward",
    "FlashAttentionTorch",
    "count_matrix_products",
    "sdpa_fallback",
    "flash_attention_torch",
]


# From chapters/09-1-tiling.md, section "Why attention is memory-bound".
def attention_core_flops(
    q_len: int, k_len: int, d_head: int, *, causal: bool = False, backward: bool = False
) -> int:
    """FLOPs of one head's attention core, ``q kᵀ`` and ``p v``.

    That is ``2 · 2 · pairs · d``.

    ``pairs`` is ``q_len · k_len``, or with ``causal`` the number of visible
    (query, key) pairs (bottom-right aligned). ``backward=True`` counts
    forward plus backward: the backward's five products (the scores again,
    ``dv``, ``dp``, ``dq``, ``dk``) are 2.5 times the forward's two, so the
    total is 3.5 times the forward."""
    sizes = check.positive_ints(q_len=q_len, k_len=k_len, d_head=d_head)
    check.booleans(causal=causal, backward=backward)
    q_len, k_len, d_head = sizes
    if causal:
        offset = k_len - q_len  # query i sees keys 0 .. i + offset
        pairs = sum(min(max(i + offset + 1, 0), k_len) for i in range(q_len))
    else:
        pairs = q_len * k_len
    forward = 4 * pairs * d_head
    return forward * 7 // 2 if backward else forward


def attention_hbm_bytes(
    seq_len: int,
    d_head: int,
    *,
    method: str,
    block_q: int | None = 128,
    bytes_per_value: int = 2,
) -> int:
    """Bytes one head's forward pass moves between HBM and the chip.

    ``method="standard"``: read q, k, v, write the ``n × n`` scores, read
    them, write the weights, read them, write the output:
    ``(4·n·d + 4·n²) · bytes``. ``method="flash"``: read q once, k and v
    once per block of ``block_q`` queries, write the output and a float32
    log-sum-exp per query. ``block_q=None`` reads every input once (the best
    case, when the re-reads hit the L2 cache)."""
    sizes = dict(seq_len=seq_len, d_head=d_head, bytes_per_value=bytes_per_value)
    n, d, _ = check.positive_ints(**sizes)
    check.one_of("method", method, ("standard", "flash"))
    if block_q is not None:
        check.positive_int("block_q", block_q)
    if method == "standard":
        return (4 * n * d + 4 * n * n) * bytes_per_value
    # ceil(n / block_q) blocks of queries, each reading all of k and v
    n_query_blocks = 1 if block_q is None else -(-n // block_q)
    # q once, k and v once per block of queries, the output once
    values = n * d + 2 * n * d * n_query_blocks + n * d
    return values * bytes_per_value + 4 * n


def roofline_seconds(
    flops: float, bytes_moved: float, peak_flops: float, bandwidth: float
) -> float:
    """The roofline bound, in seconds: the larger of the two times.

    ``max(flops / peak_flops, bytes_moved / bandwidth)``."""
    hint = "flops and bytes must be >= 0, peak_flops and bandwidth > 0"
    for name, value in dict(flops=flops, bytes_moved=bytes_moved).items():
        check.finite_float(name, value, low=0.0, hint=hint)
    rates = dict(peak_flops=peak_flops, bandwidth=bandwidth)
    for name, value in rates.items():
        check.finite_float(name, value, low=0.0, low_open=True, hint=hint)
    return max(flops / peak_flops, bytes_moved / bandwidth)


# From chapters/09-1-tiling.md, section "Online softmax".
def online_softmax(scores: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    """Softmax over the last axis: online ``(max, sum)``, then normalise.

    The first pass reads ``block_size`` elements at a time and keeps, per
    row, the running maximum ``m`` and the running sum ``l = Σ exp(x - m)``,
    rescaling ``l`` by ``exp(m_old - m_new)`` when the maximum grows. A row
    of only ``-inf`` gives zeros; NaN and ``+inf`` give what
    ``torch.softmax`` gives (NaN). Shapes: ``scores`` is ``(... n)``, the
    result too (``n = 0`` included)."""
    hint = "a float tensor: convert integer scores with scores.float()"
    check.tensor("scores", scores, "... n", floating=True, hint=hint)
    check.positive_int("block_size", block_size)
    row_max = scores.new_full(scores.shape[:-1], -math.inf)
    row_sum = torch.zeros_like(row_max)
    for start in range(0, scores.shape[-1], block_size):
        block = scores[..., start : start + block_size]
        block_max = reduce(block, "... n -> ...", "max")
        new_max = torch.maximum(row_max, block_max)
        # a row of -inf so far: subtract 0, not -inf (which gives NaN)
        safe_max = new_max.masked_fill(new_max == -math.inf, 0.0)
        block_terms = torch.exp(block - safe_max[..., None])
        block_sum = reduce(block_terms, "... n -> ...", "sum")
        row_sum = row_sum * torch.exp(row_max - safe_max) + block_sum
        row_max = new_max
    safe_max = row_max.masked_fill(row_max == -math.inf, 0.0)
    safe_sum = row_sum.masked_fill(row_sum == 0, 1.0)
    return torch.exp(scores - safe_max[..., None]) / safe_sum[..., None]


# From chapters/09-1-tiling.md, section "The tiled forward pass".
def causal_block_kind(
    q_start: int, q_stop: int, k_start: int, k_stop: int, offset: int
) -> str:
    """How a causal mask covers a tile of queries and keys.

    The tile holds query rows ``[q_start, q_stop)`` and key columns
    ``[k_start, k_stop)``; query ``i`` sees key ``j`` iff
    ``j <= i + offset`` (``offset = k_len - q_len``, bottom-right aligned).

    Returns ``"skip"`` (no query sees any key), ``"full"`` (every query sees
    every key) or ``"partial"`` (the diagonal crosses the tile: mask it)."""
    bounds = dict(q_start=q_start, q_stop=q_stop, k_start=k_start, k_stop=k_stop)
    for name, value in (bounds | dict(offset=offset)).items():
        check.integer(name, value)
    if not (q_start < q_stop and k_start < k_stop):
        raise ValueError(f"a tile has q_start < q_stop and k_start < k_stop: {bounds}")
    return _block_kind(q_start, q_stop, k_start, k_stop, offset)


def _block_kind(q_start: int, q_stop: int, k_start: int, k_stop: int, offset: int):
    # the last row cannot see the first column
    if k_start > q_stop - 1 + offset:
        return "skip"
    # the first row sees the last column
    if k_stop - 1 <= q_start + offset:
        return "full"
    return "partial"


# From chapters/09-1-tiling.md, section "The tiled forward pass".
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SHAPES = (
    "q is (batch, heads, q_pos, d), k and v (batch, kv_heads, k_pos, d): "
    "4-D tensors, heads a multiple of kv_heads"
)
_SCALE = "scale must be positive and finite, or None for 1/√d_head"
_OTHER = "use the 'flash_torch' or 'sdpa' backend for this model"


def check_flash_arguments(
    owner: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    causal: bool,
    block_q: int | None,
    block_k: int | None,
    *,
    dtypes: tuple[torch.dtype, ...] = _FLOATS,
    head_dims: tuple[int, ...] | None = None,
    kernel_blocks: bool = False,
    **saved: torch.Tensor,
) -> float:
    """Check the arguments of the entry point ``owner``; return the scale.

    ``q`` ``(batch heads q_pos d)``, ``k`` and ``v``
    ``(batch kv_heads k_pos d)`` on one device, in one of ``dtypes``, with
    ``d`` in ``head_dims`` (None: any); ``saved``: the backward's ``out``,
    ``lse`` and ``grad_out``. Block sizes are ints >= 1, or with
    ``kernel_blocks`` None or powers of two >= 16 (a Triton kernel's tiles,
    :mod:`lib.flash_triton`). The scale returned is ``1/√d`` for None.
    Shapes, dtypes and devices only: the data is never read."""
    # 4-D first: the sizes below read them
    for name, t in dict(q=q, k=k, v=v).items():
        check.tensor(name, t, "batch heads pos d", owner=owner, hint=_SHAPES)
    if not q.device == k.device == v.device:
        raise ValueError(f"{owner}: q, k, v are on {q.device}, {k.device}, {v.device}")
    (batch, heads, q_len, d), kv_heads = q.shape, k.shape[1]
    check.positive_ints(heads=heads, kv_heads=kv_heads, d_head=d, owner=owner)
    check.attention_inputs(q, k, v, owner=owner, hint=_SHAPES)
    check.tensor("v", v, "... d", d=d, owner=owner, hint="q, k and v have one head dim")
    if q.dtype not in dtypes:
        raise TypeError(f"{owner} takes {', '.join(map(str, dtypes))}; got {q.dtype}")
    if head_dims is not None and d not in head_dims:
        raise ValueError(f"{owner}: head dims {head_dims}, got {d}; {_OTHER}")
    # lse is (b h q), out and grad_out (b h q d)
    rows = dict(b=batch, h=heads, q=q_len, owner=owner)
    if saved:
        check.same_device(q=q, **saved, owner=owner)
    for name, t in saved.items():
        axes, sizes = ("b h q", rows) if name == "lse" else ("b h q d", dict(rows, d=d))
        check.tensor(name, t, axes, floating=True, **sizes)
    check.boolean("causal", causal, owner=owner)
    for name, size in dict(block_q=block_q, block_k=block_k).items():
        if not kernel_blocks:
            check.positive_int(name, size, owner=owner)
        elif size is not None and (check.integer(name, size) < 16 or size & (size - 1)):
            raise ValueError(f"{owner}: block sizes are powers of two >= 16: {size}")
    if scale is None:
        return 1.0 / math.sqrt(d)
    positive = dict(low=0.0, low_open=True, owner=owner, hint=_SCALE)
    return check.finite_float("scale", scale, **positive)


def _check_tiled_forward(q, k, v, *, scale=None, causal=False, block_q=64, block_k=64):
    """The front door of :func:`tiled_attention_forward`."""
    options = dict(causal=causal, block_q=block_q, block_k=block_k)
    owner = "tiled_attention_forward"
    check_flash_arguments(owner, q, k, v, scale, **options)


def _check_tiled_backward(
    q, k, v, out, lse, grad_out, *, scale=None, causal=False, block_q=64, block_k=64
):
    """The front door of :func:`tiled_attention_backward`."""
    options = dict(causal=causal, block_q=block_q, block_k=block_k)
    saved = dict(out=out, lse=lse, grad_out=grad_out)
    owner = "tiled_attention_backward"
    check_flash_arguments(owner, q, k, v, scale, **options, **saved)


# From chapters/09-1-tiling.md, section "The tiled forward pass".
# einops patterns. The query heads that share a key/value head form a
# `group` axis.
_Q = "batch kv_heads group q_pos"  # where a query row lives
_K = "batch kv_heads k_pos"  # where a key row lives
_SPLIT = "batch (kv_heads group) q_pos d -> batch kv_heads group q_pos d"
_MERGE = "batch kv_heads group q_pos d -> batch (kv_heads group) q_pos d"
_SPLIT_ROWS = "batch (kv_heads group) q_pos -> batch kv_heads group q_pos"
_MERGE_ROWS = "batch kv_heads group q_pos -> batch (kv_heads group) q_pos"
_SCORES = f"{_Q} d, {_K} d -> {_Q} k_pos"  # q kᵀ (and dO vᵀ)
_MIX = f"{_Q} k_pos, {_K} d -> {_Q} d"  # p v (and dS k)
# pᵀ dO (and dSᵀ q): sums over the group
_BY_KEY = f"{_Q} k_pos, {_Q} d -> {_K} d"


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _above_diagonal(q_start, q_stop, k_start, k_stop, offset, device) -> torch.Tensor:
    """``(q_pos k_pos)``: True where key ``j`` is in the future of ``i``."""
    rows = torch.arange(q_start, q_stop, device=device)
    cols = torch.arange(k_start, k_stop, device=device)
    last_visible = rearrange(rows, "q_pos -> q_pos 1") + offset
    return rearrange(cols, "k_pos -> 1 k_pos") > last_visible


@check.front_door(_check_tiled_forward)
def tiled_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's forward pass in PyTorch, in blocks of q and of k.

    Shapes: ``q`` ``(batch heads q_pos d)``; ``k``, ``v``
    ``(batch kv_heads k_pos d)``. Returns ``out`` ``(batch heads q_pos d)``
    in ``q``'s dtype and the log-sum-exp of every query's scaled scores,
    ``lse`` ``(batch heads q_pos)`` in float32 (float64 for float64 input),
    ``-inf`` for a query that sees no key (its output is zero, also when
    there are no keys at all). ``scale`` None is ``1/√d``. NaN or infinity
    in the inputs give NaN in the output, as in the math path (the data is
    not read to check)."""
    kv_heads, q_len, k_len = k.shape[1], q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    offset = k_len - q_len  # causal: query i sees key j iff j <= i + offset
    work = _work_dtype(q.dtype)
    q_groups = rearrange(q, _SPLIT, kv_heads=kv_heads).to(work)
    k, v = k.to(work), v.to(work)
    out = torch.empty_like(q_groups)
    lse = torch.empty(out.shape[:-1], dtype=work, device=q.device)
    # one block of queries, rows q0 .. q1 - 1 ...
    for q0 in range(0, q_len, block_q):
        q1 = min(q0 + block_q, q_len)
        q_block = q_groups[..., q0:q1, :]
        row_max = torch.full_like(q_block[..., 0], -math.inf)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros_like(q_block)  # the unnormalised output
        # ... against each block of keys k0 .. k1 - 1
        for k0 in range(0, k_len, block_k):
            k1 = min(k0 + block_k, k_len)
            kind = _block_kind(q0, q1, k0, k1, offset) if causal else "full"
            if kind == "skip":
                # this tile and every one right of it are above the diagonal
                break
            k_block, v_block = k[:, :, k0:k1], v[:, :, k0:k1]
            scores = scale * einsum(q_block, k_block, _SCORES)
            if kind == "partial":
                future = _above_diagonal(q0, q1, k0, k1, offset, q.device)
                scores = scores.masked_fill(future, -math.inf)
            tile_max = reduce(scores, "... k_pos -> ...", "max")
            new_max = torch.maximum(row_max, tile_max)
            # a row with no key yet: subtract 0, not -inf
            safe_max = new_max.masked_fill(new_max == -math.inf, 0.0)
            rescale = torch.exp(row_max - safe_max)  # e^{m_old - m_new}
            weights = torch.exp(scores - safe_max[..., None])
            tile_sum = reduce(weights, "... k_pos -> ...", "sum")
            row_sum = row_sum * rescale + tile_sum
            tile_out = einsum(weights, v_block, _MIX)
            acc = acc * rescale[..., None] + tile_out
            row_max = new_max
        seen = row_sum > 0
        safe_sum = torch.where(seen, row_sum, 1.0)
        out[..., q0:q1, :] = acc / safe_sum[..., None]
        row_lse = row_max + torch.log(row_sum)
        lse[..., q0:q1] = torch.where(seen, row_lse, -math.inf)
    return rearrange(out, _MERGE).to(q.dtype), rearrange(lse, _MERGE_ROWS)


# From chapters/09-1-tiling.md, section "The backward pass, with recomputation".
@check.front_door(_check_tiled_backward)
def tiled_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention's backward pass in PyTorch: recompute every tile.

    Shapes as :func:`tiled_attention_forward`; ``out`` and ``grad_out`` are
    ``(batch heads q_pos d)``, ``lse`` ``(batch heads q_pos)``. Returns
    ``(dq, dk, dv)`` in the dtypes of ``q``, ``k``, ``v``. The weights are
    recomputed from ``lse``, and the softmax's backward uses
    ``D = rowsum(grad_out * out)``, so no row of the ``(q_pos, k_pos)``
    matrix is ever needed whole."""
    kv_heads, q_len, k_len = k.shape[1], q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    offset = k_len - q_len
    work = _work_dtype(q.dtype)
    q_g, out_g, grad_g = (
        rearrange(t, _SPLIT, kv_heads=kv_heads).to(work) for t in (q, out, grad_out)
    )
    lse_g = rearrange(lse, _SPLIT_ROWS, kv_heads=kv_heads).to(work)
    # a query that saw no key: lse = +inf makes its weights P = 0
    lse_g = lse_g.masked_fill(lse_g == -math.inf, math.inf)
    # D = rowsum(dO * O), one number per query
    delta = reduce(grad_g * out_g, "... q_pos d -> ... q_pos", "sum")
    k, v = k.to(work), v.to(work)
    dq, dk, dv = (torch.zeros_like(t) for t in (q_g, k, v))
    # one block of keys, k0 .. k1 - 1 ...
    for k0 in range(0, k_len, block_k):
        k1 = min(k0 + block_k, k_len)
        k_block, v_block = k[:, :, k0:k1], v[:, :, k0:k1]
        # ... and the blocks of queries that see it
        for q0 in range(0, q_len, block_q):
            q1 = min(q0 + block_q, q_len)
            kind = _block_kind(q0, q1, k0, k1, offset) if causal else "full"
            if kind == "skip":
                continue
            q_block, grad_block = q_g[..., q0:q1, :], grad_g[..., q0:q1, :]
            scores = scale * einsum(q_block, k_block, _SCORES)
            if kind == "partial":
                future = _above_diagonal(q0, q1, k0, k1, offset, q.device)
                scores = scores.masked_fill(future, -math.inf)
            # P, exactly, from the saved log-sum-exp
            weights = torch.exp(scores - lse_g[..., q0:q1, None])
            dv[:, :, k0:k1] += einsum(weights, grad_block, _BY_KEY)
            d_weights = einsum(grad_block, v_block, _SCORES)
            # dS = P (dP - D)
            d_scores = weights * (d_weights - delta[..., q0:q1, None])
            dq[..., q0:q1, :] += scale * einsum(d_scores, k_block, _MIX)
            dk[:, :, k0:k1] += scale * einsum(d_scores, q_block, _BY_KEY)
    return rearrange(dq, _MERGE).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# From chapters/09-1-tiling.md, section "The backward pass, with recomputation".
class FlashAttentionTorch(torch.autograd.Function):
    """Tiled attention whose backward saves only q, k, v, out and lse.

    ``FlashAttentionTorch.apply(q, k, v, scale, causal, block_q, block_k)``
    returns ``out`` ``(batch heads q_pos d)``; see
    :func:`tiled_attention_forward` for shapes and for the checks (``scale``
    None is ``1/√d``)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, block_q, block_k):
        options = dict(causal=causal, block_q=block_q, block_k=block_k)
        scale = check_flash_arguments("FlashAttentionTorch", q, k, v, scale, **options)
        options["scale"] = scale
        with check.trusting():  # checked above: the tiles trust them
            out, lse = tiled_attention_forward(q, k, v, **options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        with check.trusting():  # what the forward saved, and autograd's
            grads = tiled_attention_backward(q, k, v, out, lse, grad_out, **ctx.options)
        return (*grads, None, None, None, None)


# From chapters/09-1-tiling.md, section "The backward pass, with recomputation".
def count_matrix_products(function, helpers=()) -> int:
    """The matrix products that one pass of ``function``'s loop makes.

    Read from its source: the ``einsum`` and ``tl.dot`` calls of its first
    innermost ``for`` loop (of its whole body if it has no loop), plus the
    products of each of the ``helpers`` it calls there. A Triton kernel
    (``@triton.jit``) is read through its ``fn``. Each product of two tiles
    costs ``2 · B_r · B_c · d`` FLOPs."""
    function = check.function("function", getattr(function, "fn", function))
    by_name = {}
    for helper in helpers:
        helper = check.function("helpers", getattr(helper, "fn", helper))
        by_name[helper.__name__] = helper
    source = textwrap.dedent(inspect.getsource(function))
    tree = ast.parse(source).body[0]
    innermost = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.For)
        and not any(isinstance(inner, ast.For) for inner in node.body)
    ]
    count = 0
    for node in ast.walk(innermost[0] if innermost else tree):
        if isinstance(node, ast.Call):
            called = node.func
            name = getattr(called, "attr", getattr(called, "id", None))
            if name in ("einsum", "dot"):
                count += 1
            elif name in by_name:
                count += count_matrix_products(by_name[name])
    return count


# From chapters/09-1-tiling.md, section "An attention backend".
_WARNED: set[tuple[str, str]] = set()


def _fallback_reason(mask, bias, dropout_p) -> str | None:
    check.probability("dropout_p", dropout_p)
    unsupported = [
        name
        for name, used in (
            ("a mask", mask is not None),
            ("a bias", bias is not None),
            (f"dropout_p={dropout_p}", dropout_p > 0.0),
        )
        if used
    ]
    return " and ".join(unsupported) or None


def _warn_once(backend: str, reason: str) -> None:
    if (backend, reason) in _WARNED:
        return
    _WARNED.add((backend, reason))
    warnings.warn(
        f"the {backend!r} attention backend does not implement {reason}; "
        "these calls fall back to lib.attention.sdpa_attention (this "
        "warning is shown once)",
        RuntimeWarning,
        stacklevel=4,
    )


def sdpa_fallback(
    backend: str,
    q,
    k,
    v,
    mask=None,
    bias=None,
    dropout_p=0.0,
    *,
    scale=None,
    causal=False,
) -> torch.Tensor | None:
    """What a FlashAttention backend does with what its tiles lack.

    None when there is nothing to fall back for (no ``mask``, no ``bias``,
    no dropout); else :func:`lib.attention.sdpa_attention`'s result, with a
    ``RuntimeWarning`` naming ``backend`` and what it lacks, shown once per
    backend and reason. Arguments as
    :func:`lib.attention.sdpa_attention`."""
    reason = _fallback_reason(mask, bias, dropout_p)
    if reason is None:
        return None
    _warn_once(backend, reason)
    options = dict(scale=scale, causal=causal)
    return sdpa_attention(q, k, v, mask, bias, dropout_p, **options)


def flash_attention_torch(
    q,
    k,
    v,
    mask=None,
    bias=None,
    dropout_p=0.0,
    *,
    scale=None,
    causal=False,
    block_q: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    """The ``"flash_torch"`` backend: :class:`FlashAttentionTorch`.

    Arguments as :func:`lib.attention.sdpa_attention`; ``mask``, ``bias``
    and dropout fall back to it (warned once). Any head dim; float16,
    bfloat16, float32, float64. The inputs are checked by
    :class:`FlashAttentionTorch` (errors name it)."""
    options = dict(scale=scale, causal=causal)
    fallback = sdpa_fallback("flash_torch", q, k, v, mask, bias, dropout_p, **options)
    if fallback is not None:
        return fallback
    return FlashAttentionTorch.apply(q, k, v, scale, causal, block_q, block_k)


# replace=True: re-importing this module replaces its own backend
register_attention_backend("flash_torch", flash_attention_torch, replace=True)
