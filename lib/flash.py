# This file is generated from chapters/09-flash-attention.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/09-flash-attention.md, section "Why attention is memory-bound".
"""FlashAttention (chapter 9): IO counts, online softmax, tiled attention.

Three implementations of one function, exact attention that never stores the
``(q_pos, k_pos)`` score matrix:

* :func:`online_softmax`: the running maximum and running sum, on rows.
* :func:`tiled_attention_forward` and :func:`tiled_attention_backward`, in
  PyTorch, wrapped as :class:`FlashAttentionTorch`, an ``autograd.Function``
  that saves only ``q``, ``k``, ``v``, the output and the log-sum-exp, and
  recomputes the scores in backward.
* Triton kernels for the forward pass and both halves of the backward pass,
  wrapped as :class:`FlashAttentionTriton`. Without a GPU they run in
  Triton's interpreter when ``TRITON_INTERPRET=1`` is set before this module
  is imported.

Importing the module registers two attention backends (see
:mod:`lib.attention`): ``"flash_torch"`` (:func:`flash_attention_torch`) and
``"flash_triton"`` (:func:`flash_attention_triton`). Both compute attention
with ``causal`` (bottom-right aligned), grouped key/value heads and any
``scale``; a ``mask``, a ``bias`` or dropout make them fall back to
:func:`lib.attention.sdpa_attention`, with a warning shown once. Shapes:
``q`` is ``(batch heads q_pos d_head)``, ``k`` and ``v``
``(batch kv_heads k_pos d_head)``."""

from __future__ import annotations

import math
import os
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
    "tiled_attention_forward",
    "tiled_attention_backward",
    "FlashAttentionTorch",
    "TRITON_INTERPRETED",
    "TRITON_HEAD_DIMS",
    "triton_support",
    "triton_attention_forward",
    "triton_attention_backward",
    "FlashAttentionTriton",
    "flash_attention_torch",
    "flash_attention_triton",
]


# Linux x86_64 wheels only; elsewhere the Triton backend says so when called
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None


# From chapters/09-flash-attention.md, section "Why attention is memory-bound".
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


# From chapters/09-flash-attention.md, section "Online softmax".
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


# From chapters/09-flash-attention.md, section "The tiled forward pass".
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


# From chapters/09-flash-attention.md, section "The tiled forward pass".
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


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_SHAPES = (
    "q is (batch, heads, q_pos, d), k and v (batch, kv_heads, k_pos, d): "
    "4-D tensors, heads a multiple of kv_heads"
)
_SCALE = "scale must be positive and finite, or None for 1/√d_head"
_OTHER = "use the 'flash_torch' or 'sdpa' backend for this model"


def _check_attention(
    owner, q, k, v, scale, causal, block_q, block_k, *, triton=False, **saved
) -> float:
    """Check the arguments of ``owner``, for the Triton kernels with
    ``triton`` (``saved``: the backward's ``out``, ``lse`` and
    ``grad_out``); return the scale, ``1/√d`` for None. Shapes, dtypes and
    devices only: the data is never read."""
    # first: where the kernels cannot run, say so before anything else
    if triton:
        _require_triton(q, owner)
    # 4-D first: the sizes below read them
    for name, t in dict(q=q, k=k, v=v).items():
        check.tensor(name, t, "batch heads pos d", owner=owner, hint=_SHAPES)
    if not q.device == k.device == v.device:
        raise ValueError(f"{owner}: q, k, v are on {q.device}, {k.device}, {v.device}")
    (batch, heads, q_len, d), kv_heads = q.shape, k.shape[1]
    check.positive_ints(heads=heads, kv_heads=kv_heads, d_head=d, owner=owner)
    check.attention_inputs(q, k, v, owner=owner, hint=_SHAPES)
    check.tensor("v", v, "... d", d=d, owner=owner, hint="q, k and v have one head dim")
    if q.dtype not in (dtypes := _FLOATS[:3] if triton else _FLOATS):
        raise TypeError(f"{owner} takes {', '.join(map(str, dtypes))}; got {q.dtype}")
    if triton and d not in TRITON_HEAD_DIMS:
        raise ValueError(f"{owner}: head dims {TRITON_HEAD_DIMS}, got {d}; {_OTHER}")
    # lse is (b h q), out and grad_out (b h q d)
    rows = dict(b=batch, h=heads, q=q_len, owner=owner)
    if saved:
        check.same_device(q=q, **saved, owner=owner)
    for name, t in saved.items():
        axes, sizes = ("b h q", rows) if name == "lse" else ("b h q d", dict(rows, d=d))
        check.tensor(name, t, axes, floating=True, **sizes)
    check.boolean("causal", causal, owner=owner)
    for name, size in dict(block_q=block_q, block_k=block_k).items():
        if not triton:
            check.positive_int(name, size, owner=owner)
        elif size is not None and (check.integer(name, size) < 16 or size & (size - 1)):
            raise ValueError(f"{owner}: block sizes are powers of two >= 16: {size}")
    if scale is None:
        return 1.0 / math.sqrt(d)
    positive = dict(low=0.0, low_open=True, owner=owner, hint=_SCALE)
    return check.finite_float("scale", scale, **positive)


def _above_diagonal(q_start, q_stop, k_start, k_stop, offset, device) -> torch.Tensor:
    """``(q_pos k_pos)``: True where key ``j`` is in the future of ``i``."""
    rows = torch.arange(q_start, q_stop, device=device)
    cols = torch.arange(k_start, k_stop, device=device)
    last_visible = rearrange(rows, "q_pos -> q_pos 1") + offset
    return rearrange(cols, "k_pos -> 1 k_pos") > last_visible


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
    options = dict(causal=causal, block_q=block_q, block_k=block_k)
    scale = _check_attention("tiled_attention_forward", q, k, v, scale, **options)
    return _tiled_forward(q, k, v, scale=scale, **options)


def _tiled_forward(q, k, v, *, scale, causal, block_q, block_k):
    kv_heads, q_len, k_len = k.shape[1], q.shape[2], k.shape[2]
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


# From chapters/09-flash-attention.md, section "The backward pass, with recomputation".
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
    options = dict(causal=causal, block_q=block_q, block_k=block_k)
    saved = dict(out=out, lse=lse, grad_out=grad_out)
    owner = "tiled_attention_backward"
    scale = _check_attention(owner, q, k, v, scale, **options, **saved)
    return _tiled_backward(q, k, v, out, lse, grad_out, scale=scale, **options)


def _tiled_backward(q, k, v, out, lse, grad_out, *, scale, causal, block_q, block_k):
    kv_heads, q_len, k_len = k.shape[1], q.shape[2], k.shape[2]
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


# From chapters/09-flash-attention.md, section "The backward pass, with recomputation".
class FlashAttentionTorch(torch.autograd.Function):
    """Tiled attention whose backward saves only q, k, v, out and lse.

    ``FlashAttentionTorch.apply(q, k, v, scale, causal, block_q, block_k)``
    returns ``out`` ``(batch heads q_pos d)``; see
    :func:`tiled_attention_forward` for shapes and for the checks (``scale``
    None is ``1/√d``)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, block_q, block_k):
        options = dict(causal=causal, block_q=block_q, block_k=block_k)
        scale = _check_attention("FlashAttentionTorch", q, k, v, scale, **options)
        options["scale"] = scale
        out, lse = _tiled_forward(q, k, v, **options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _tiled_backward(q, k, v, out, lse, grad_out, **ctx.options)
        return (*grads, None, None, None, None)


# From chapters/09-flash-attention.md, section "Triton: the same algorithm as a GPU kernel".
# Triton reads TRITON_INTERPRET when a kernel is decorated, that is when
# this module is imported: in interpreter mode the kernels below run on the
# CPU, one program at a time.
TRITON_INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET") == "1"
# powers of two (tl.arange needs them), at least 16 (tl.dot needs that)
TRITON_HEAD_DIMS = (16, 32, 64, 128)
# exp(x) = exp2(x * log2(e)): exp2 is the GPU's native exponential
_LOG2E = 1.4426950408889634


def _triton_jit(fn):
    """``triton.jit`` where Triton is installed, else the plain function."""
    return fn if triton is None else triton.jit(fn)


_DTYPE_OR_NONE = (torch.dtype, type(None))


def triton_support(
    device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> tuple[bool, str]:
    """Whether the Triton kernels can run on ``device`` with ``dtype``.

    ``device`` is by default the current CUDA GPU, else the CPU. Returns
    ``(True, how)``, or ``(False, why)`` where ``why`` also says what to
    do.

    In Triton's interpreter bfloat16 is computed in float32 (the
    interpreter's own bfloat16 arithmetic is wrong, by orders of magnitude
    in Triton 3.x); float64 is never supported."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    check.instance("dtype", dtype, _DTYPE_OR_NONE, what="a torch.dtype or None")
    if dtype is not None and dtype not in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ):
        return (False, f"the kernels take float16, bfloat16 and float32, not {dtype}")
    if triton is None:
        return False, (
            "Triton is not installed (pip install triton; Linux x86_64 "
            "wheels only); use the 'sdpa' backend"
        )
    if TRITON_INTERPRETED and device.type in ("cpu", "cuda"):
        how = "Triton's interpreter (TRITON_INTERPRET=1): exact but slow"
        if dtype == torch.bfloat16:
            how += "; bfloat16 computed in float32"
        return True, how
    if device.type == "cpu":
        return False, (
            "the tensors are on the CPU and Triton compiles for GPUs; set "
            "TRITON_INTERPRET=1 before importing lib.flash to run the "
            "kernels in Triton's (slow) interpreter, or use the 'sdpa' "
            "backend"
        )
    if device.type != "cuda":
        return (False, f"Triton does not run on {device.type!r} devices; use 'sdpa'")
    name = torch.cuda.get_device_name(device)
    if torch.version.hip is not None:
        return True, f"{name} (ROCm)"
    major, minor = torch.cuda.get_device_capability(device)
    gpu = f"{name} (compute capability {major}.{minor})"
    if (major, minor) < (7, 5):
        return False, (
            f"{gpu} is too old: the kernels need 7.5 (Turing, e.g. a T4) "
            "or newer; use the 'sdpa' or 'flash_torch' backend"
        )
    if dtype == torch.bfloat16 and major < 8:
        return False, (
            f"{gpu} has no bfloat16 tensor cores, which tl.dot needs (8.0, "
            "Ampere, or newer); use float16 there (lib.utils.get_precision "
            "picks it), or a newer GPU for bfloat16"
        )
    if major < 8:
        return (True, f"{gpu}: float16 and float32 (bfloat16 needs 8.0 or newer)")
    return True, f"{gpu}: float16, bfloat16 and float32"


def _require_triton(q: torch.Tensor, caller: str) -> None:
    """Raise a ``RuntimeError`` saying why the kernels cannot run on ``q``.

    (A dtype they never take is left to the dtype check: ``TypeError``.)"""
    dtype = getattr(q, "dtype", None)
    dtype = dtype if dtype in (torch.float16, torch.bfloat16, torch.float32) else None
    ok, why = triton_support(getattr(q, "device", None), dtype)
    if not ok:
        raise RuntimeError(f"{caller} cannot run here: {why}")


# From chapters/09-flash-attention.md, section "The forward kernel".
@_triton_jit
def _online_softmax_step(acc, row_sum, row_max, scores, v, DOT_PRECISION: tl.constexpr):
    """Fold a tile of base-2 scores ``(BLOCK_M BLOCK_N)`` into the state."""
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    # rows with no key yet: subtract 0, not -inf
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp2(row_max - safe_max)  # 2^{m_old - m_new}
    weights = tl.exp2(scores - safe_max[:, None])
    row_sum = row_sum * rescale + tl.sum(weights, 1)
    acc = acc * rescale[:, None]
    acc += tl.dot(weights.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, row_sum, new_max


@_triton_jit
def _flash_forward_kernel(
    Q,
    K,
    V,
    OUT,
    LSE,  # pointers; LSE is (batch heads q_pos) float32, contiguous
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    n_heads,
    group,
    q_len,
    k_len,
    scale_log2,
    length_bucket,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # length_bucket is unused here: it is the autotuner's key (the lengths,
    # rounded up).
    start_m = tl.program_id(0) * BLOCK_M  # this program's block of queries
    batch_head = tl.program_id(1)  # ... of this (batch, head)
    # int64: the offsets can pass 2^31
    batch = (batch_head // n_heads).to(tl.int64)
    head = (batch_head % n_heads).to(tl.int64)
    kv_head = head // group  # GQA: `group` query heads share a k/v head
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qm
    q = tl.load(q_ptrs + dims[None, :], mask=rows[:, None] < q_len, other=0.0)
    k_base = K + batch * stride_kb + kv_head * stride_kh + dims[None, :]
    v_base = V + batch * stride_vb + kv_head * stride_vh + dims[None, :]

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    offset = k_len - q_len  # causal: query i sees key j iff j <= i + offset
    if CAUSAL:
        full_end = tl.maximum(start_m + offset + 1, 0) // BLOCK_N * BLOCK_N
        end = tl.minimum(tl.maximum(start_m + BLOCK_M + offset, 0), k_len)
    else:
        full_end = k_len // BLOCK_N * BLOCK_N
        end = k_len
    # 1. Key blocks that every row of this block sees whole: no mask.
    for start_n in range(0, full_end, BLOCK_N):
        keys = start_n + cols
        k = tl.load(k_base + keys[:, None] * stride_kn)
        v = tl.load(v_base + keys[:, None] * stride_vn)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        acc, row_sum, row_max = _online_softmax_step(
            acc, row_sum, row_max, scores, v, DOT_PRECISION
        )
    # 2. Blocks the diagonal crosses, and the ragged last block: masked.
    for start_n in range(full_end, end, BLOCK_N):
        keys = start_n + cols
        key_ok = keys[:, None] < k_len
        k = tl.load(k_base + keys[:, None] * stride_kn, mask=key_ok, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn, mask=key_ok, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        visible = keys[None, :] < k_len
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + offset)
        scores = tl.where(visible, scores, float("-inf"))
        acc, row_sum, row_max = _online_softmax_step(
            acc, row_sum, row_max, scores, v, DOT_PRECISION
        )

    seen = row_sum > 0.0  # a query that sees no key: output 0, lse -inf
    safe_sum = tl.where(seen, row_sum, 1.0)
    out = acc / safe_sum[:, None]
    # back to natural units: times ln 2
    lse = (row_max + tl.log2(safe_sum)) * 0.6931471805599453
    lse = tl.where(seen, lse, float("-inf"))
    o_ptrs = OUT + batch * stride_ob + head * stride_oh + rows[:, None] * stride_om
    o_ptrs += dims[None, :]
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=rows[:, None] < q_len)
    tl.store(LSE + batch_head.to(tl.int64) * q_len + rows, lse, mask=rows < q_len)


# From chapters/09-flash-attention.md, section "The backward kernels".
@_triton_jit
def _dkdv_step(
    dk,
    dv,
    k,
    v,
    start_m,
    q_base,
    do_base,
    lse_base,
    delta_base,
    stride_qm,
    stride_dom,
    q_len,
    keys,
    offset,
    scale_log2,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One tile of the dK/dV loop: P again, dV += Pᵀ dO and dK += dSᵀ Q."""
    rows = start_m + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    q = tl.load(q_base + rows[:, None] * stride_qm, mask=row_ok[:, None], other=0.0)
    do = tl.load(do_base + rows[:, None] * stride_dom, mask=row_ok[:, None], other=0.0)
    lse = tl.load(lse_base + rows, mask=row_ok, other=float("inf"))
    # a query that saw no key: lse = +inf makes its weights P = 0
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    delta = tl.load(delta_base + rows, mask=row_ok, other=0.0)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    # P, recomputed: 2^(s log2(e) - lse log2(e))
    weights = tl.exp2(scores - lse[:, None] * 1.4426950408889634)
    if MASKED:
        weights = tl.where(keys[None, :] <= rows[:, None] + offset, weights, 0.0)
    dv += tl.dot(tl.trans(weights.to(do.dtype)), do, input_precision=DOT_PRECISION)
    d_weights = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    d_scores = weights * (d_weights - delta[:, None])  # dS = P * (dP - D)
    dk += tl.dot(tl.trans(d_scores.to(q.dtype)), q, input_precision=DOT_PRECISION)
    return dk, dv


@_triton_jit
def _flash_backward_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,  # DK, DV: (batch heads k_pos d), per query head
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    n_heads,
    group,
    q_len,
    k_len,
    scale,
    scale_log2,
    length_bucket,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N  # this program's block of keys
    batch_head = tl.program_id(1)
    batch = (batch_head // n_heads).to(tl.int64)
    head = (batch_head % n_heads).to(tl.int64)
    kv_head = head // group
    keys = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    key_ok = keys[:, None] < k_len
    k_ptrs = K + batch * stride_kb + kv_head * stride_kh + keys[:, None] * stride_kn
    v_ptrs = V + batch * stride_vb + kv_head * stride_vh + keys[:, None] * stride_vn
    k = tl.load(k_ptrs + dims[None, :], mask=key_ok, other=0.0)
    v = tl.load(v_ptrs + dims[None, :], mask=key_ok, other=0.0)
    q_base = Q + batch * stride_qb + head * stride_qh + dims[None, :]
    do_base = DO + batch * stride_dob + head * stride_doh + dims[None, :]
    lse_base = LSE + batch_head.to(tl.int64) * q_len
    delta_base = DELTA + batch_head.to(tl.int64) * q_len
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    offset = k_len - q_len
    # queries before `first` see none of this block, from `band_end` on all
    if CAUSAL:
        first = tl.maximum(start_n - offset, 0) // BLOCK_M * BLOCK_M
        last_partial = tl.maximum(start_n + BLOCK_N - 1 - offset, 0)
        band_end = tl.cdiv(last_partial, BLOCK_M) * BLOCK_M
    else:
        first = 0
        band_end = 0
    # 1. the blocks of queries on the diagonal: masked
    for start_m in range(first, band_end, BLOCK_M):
        dk, dv = _dkdv_step(
            dk,
            dv,
            k,
            v,
            start_m,
            q_base,
            do_base,
            lse_base,
            delta_base,
            stride_qm,
            stride_dom,
            q_len,
            keys,
            offset,
            scale_log2,
            BLOCK_M,
            True,
            DOT_PRECISION,
        )
    # 2. below it: every query sees every key of the block
    for start_m in range(band_end, q_len, BLOCK_M):
        dk, dv = _dkdv_step(
            dk,
            dv,
            k,
            v,
            start_m,
            q_base,
            do_base,
            lse_base,
            delta_base,
            stride_qm,
            stride_dom,
            q_len,
            keys,
            offset,
            scale_log2,
            BLOCK_M,
            False,
            DOT_PRECISION,
        )
    dk = dk * scale
    out_offsets = batch * stride_dkb + head * stride_dkh + keys[:, None] * stride_dkn
    out_offsets += dims[None, :]
    tl.store(DK + out_offsets, dk.to(DK.dtype.element_ty), mask=key_ok)
    tl.store(DV + out_offsets, dv.to(DV.dtype.element_ty), mask=key_ok)


@_triton_jit
def _dq_step(
    dq,
    q,
    do,
    lse_log2,
    delta,
    start_n,
    k_base,
    v_base,
    stride_kn,
    stride_vn,
    k_len,
    rows,
    offset,
    scale_log2,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One tile of the dQ loop: recompute P, then dQ += dS K."""
    keys = start_n + tl.arange(0, BLOCK_N)
    key_ok = keys[:, None] < k_len
    k = tl.load(k_base + keys[:, None] * stride_kn, mask=key_ok, other=0.0)
    v = tl.load(v_base + keys[:, None] * stride_vn, mask=key_ok, other=0.0)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    weights = tl.exp2(scores - lse_log2[:, None])
    if MASKED:  # keys past the end too: 2^(0 - lse) could overflow for them
        visible = keys[None, :] < k_len
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + offset)
        weights = tl.where(visible, weights, 0.0)
    d_weights = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
    d_scores = weights * (d_weights - delta[:, None])
    dq += tl.dot(d_scores.to(k.dtype), k, input_precision=DOT_PRECISION)
    return dq


@_triton_jit
def _flash_backward_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dqb,
    stride_dqh,
    stride_dqm,
    n_heads,
    group,
    q_len,
    k_len,
    scale,
    scale_log2,
    length_bucket,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M  # this program's block of queries
    batch_head = tl.program_id(1)
    batch = (batch_head // n_heads).to(tl.int64)
    head = (batch_head % n_heads).to(tl.int64)
    kv_head = head // group
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < q_len
    q_ptrs = Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qm
    do_ptrs = DO + batch * stride_dob + head * stride_doh + rows[:, None] * stride_dom
    q = tl.load(q_ptrs + dims[None, :], mask=row_ok[:, None], other=0.0)
    do = tl.load(do_ptrs + dims[None, :], mask=row_ok[:, None], other=0.0)
    row_offsets = batch_head.to(tl.int64) * q_len + rows
    lse = tl.load(LSE + row_offsets, mask=row_ok, other=float("inf"))
    lse_log2 = tl.where(lse == float("-inf"), float("inf"), lse) * 1.4426950408889634
    delta = tl.load(DELTA + row_offsets, mask=row_ok, other=0.0)
    k_base = K + batch * stride_kb + kv_head * stride_kh + dims[None, :]
    v_base = V + batch * stride_vb + kv_head * stride_vh + dims[None, :]
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    offset = k_len - q_len
    if CAUSAL:  # as in the forward kernel
        full_end = tl.maximum(start_m + offset + 1, 0) // BLOCK_N * BLOCK_N
        end = tl.minimum(tl.maximum(start_m + BLOCK_M + offset, 0), k_len)
    else:
        full_end = k_len // BLOCK_N * BLOCK_N
        end = k_len
    # 1. the tiles that every row sees whole
    for start_n in range(0, full_end, BLOCK_N):
        dq = _dq_step(
            dq,
            q,
            do,
            lse_log2,
            delta,
            start_n,
            k_base,
            v_base,
            stride_kn,
            stride_vn,
            k_len,
            rows,
            offset,
            scale_log2,
            BLOCK_N,
            False,
            CAUSAL,
            DOT_PRECISION,
        )
    # 2. the diagonal and the ragged end: masked
    for start_n in range(full_end, end, BLOCK_N):
        dq = _dq_step(
            dq,
            q,
            do,
            lse_log2,
            delta,
            start_n,
            k_base,
            v_base,
            stride_kn,
            stride_vn,
            k_len,
            rows,
            offset,
            scale_log2,
            BLOCK_N,
            True,
            CAUSAL,
            DOT_PRECISION,
        )
    dq = dq * scale
    dq_ptrs = DQ + batch * stride_dqb + head * stride_dqh + rows[:, None] * stride_dqm
    tl.store(dq_ptrs + dims[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


# From chapters/09-flash-attention.md, section "Launching the kernels".
def _triton_configs(shapes):
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)
        for m, n, warps, stages in shapes
    ]


# The autotuner's candidates: (BLOCK_M, BLOCK_N, warps, pipeline stages).
_FORWARD_TILES = [
    (128, 64, 4, 3),
    (128, 128, 8, 3),
    (128, 64, 8, 3),
    (64, 64, 4, 3),
    (128, 32, 4, 4),
    (64, 32, 4, 2),
]
_DKDV_TILES = [
    (32, 128, 8, 3),
    (64, 128, 8, 3),
    (32, 64, 4, 3),
    (64, 64, 4, 2),
    (16, 64, 4, 2),
]
_DQ_TILES = [(128, 32, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (64, 32, 4, 2)]
# the interpreter's cost is per program: few, large tiles
_INTERPRETER_BLOCK = 64
if triton is not None and not TRITON_INTERPRETED:
    # a GPU: let Triton's autotuner pick the tiles
    _TUNING_KEY = ["length_bucket", "HEAD_DIM", "CAUSAL"]
    _autotune = lambda tiles: triton.autotune(_triton_configs(tiles), key=_TUNING_KEY)
    _forward_tuned = _autotune(_FORWARD_TILES)(_flash_forward_kernel)
    _dkdv_tuned = _autotune(_DKDV_TILES)(_flash_backward_dkdv_kernel)
    _dq_tuned = _autotune(_DQ_TILES)(_flash_backward_dq_kernel)


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _launch_options(q, k, causal, block_q, block_k):
    """Kernel keywords, and whether to autotune (not with explicit blocks,
    nor in the interpreter). The autotuner's key is the power of two above
    the longer length, so a growing KV cache does not re-tune at every
    step."""
    bucket = 1 << max(q.shape[2], k.shape[2], 1).bit_length()
    options = dict(
        HEAD_DIM=q.shape[-1],
        CAUSAL=bool(causal),
        # float32: exact products, not TF32 (16-bit inputs ignore this)
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    tuned = block_q is None and block_k is None and not TRITON_INTERPRETED
    if not tuned:  # (sizes checked by the public callers)
        options["BLOCK_M"] = block_q or _INTERPRETER_BLOCK
        options["BLOCK_N"] = block_k or _INTERPRETER_BLOCK
    return bucket, options, tuned


def triton_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton forward pass; the contract of the tiled forward pass.

    See :func:`tiled_attention_forward`.

    Inputs must have a contiguous last axis; ``lse`` is float32.
    ``block_q``/``block_k`` (powers of two >= 16) fix the tile; by default
    the autotuner picks it on a GPU."""
    options = dict(causal=causal, block_q=block_q, block_k=block_k)
    owner = "triton_attention_forward"
    scale = _check_attention(owner, q, k, v, scale, **options, triton=True)
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError(f"{owner}: q, k, v need a contiguous last axis")
    return _triton_forward(q, k, v, scale=scale, **options)


def _triton_forward(q, k, v, *, scale, causal, block_q, block_k):
    if TRITON_INTERPRETED and q.dtype == torch.bfloat16:
        # the interpreter's bfloat16 arithmetic is wrong: compute in float32
        blocks = dict(block_q=block_q, block_k=block_k)
        as_float = (t.float() for t in (q, k, v))
        out, lse = _triton_forward(*as_float, scale=scale, causal=causal, **blocks)
        return out.to(q.dtype), lse
    batch, heads, q_len, _ = q.shape
    if not q.numel() or not k.shape[2]:
        # nothing to launch: no query, or no key
        lse = torch.full((batch, heads, q_len), -math.inf, device=q.device)
        return torch.zeros_like(q), lse
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, q_len, dtype=torch.float32, device=q.device)
    bucket, options, tuned = _launch_options(q, k, causal, block_q, block_k)
    args = (
        q,
        k,
        v,
        out,
        lse,
        *_strides(q),
        *_strides(k),
        *_strides(v),
        *_strides(out),
        heads,
        heads // k.shape[1],
        q_len,
        k.shape[2],
        scale * _LOG2E,
        bucket,
    )
    grid = lambda meta: (triton.cdiv(q_len, meta["BLOCK_M"]), batch * heads)
    kernel = _forward_tuned if tuned else _flash_forward_kernel
    kernel[grid](*args, **options)
    return out, lse


def triton_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton backward pass: ``D`` by PyTorch, the dK/dV and dQ kernels.

    Same contract as :func:`tiled_attention_backward`; returns
    ``(dq, dk, dv)``."""
    options = dict(causal=causal, block_q=block_q, block_k=block_k)
    saved = dict(out=out, lse=lse, grad_out=grad_out)
    owner = "triton_attention_backward"
    scale = _check_attention(owner, q, k, v, scale, **options, **saved, triton=True)
    return _triton_backward(q, k, v, out, lse, grad_out, scale=scale, **options)


def _triton_backward(q, k, v, out, lse, grad_out, *, scale, causal, block_q, block_k):
    if TRITON_INTERPRETED and q.dtype == torch.bfloat16:
        # the interpreter's bfloat16 arithmetic is wrong: compute in float32
        options = dict(scale=scale, causal=causal, block_q=block_q, block_k=block_k)
        q32, k32, v32, out32, grad32 = (t.float() for t in (q, k, v, out, grad_out))
        grads = _triton_backward(q32, k32, v32, out32, lse, grad32, **options)
        return tuple(g.to(q.dtype) for g in grads)
    if not q.numel() or not k.shape[2]:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    batch, heads, q_len, d_head = q.shape
    kv_heads, k_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    delta = reduce(grad_out.float() * out.float(), "b h q_pos d -> b h q_pos", "sum")
    dq = torch.empty_like(q)
    # one slice of dk and dv per query head, summed over each group below
    per_query_head = (batch, heads, k_len, d_head)
    slice_dtype = q.dtype if group == 1 else torch.float32
    dk = torch.empty(per_query_head, dtype=slice_dtype, device=q.device)
    dv = torch.empty(per_query_head, dtype=slice_dtype, device=q.device)
    bucket, options, tuned = _launch_options(q, k, causal, block_q, block_k)
    sizes = (heads, group, q_len, k_len, scale, scale * _LOG2E, bucket)
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(grad_out))
    dkdv_grid = lambda meta: (triton.cdiv(k_len, meta["BLOCK_N"]), batch * heads)
    inputs = (q, k, v, grad_out, lse, delta)
    dkdv_kernel = _dkdv_tuned if tuned else _flash_backward_dkdv_kernel
    dkdv_kernel[dkdv_grid](*inputs, dk, dv, *strides, *_strides(dk), *sizes, **options)
    dq_grid = lambda meta: (triton.cdiv(q_len, meta["BLOCK_M"]), batch * heads)
    dq_kernel = _dq_tuned if tuned else _flash_backward_dq_kernel
    dq_kernel[dq_grid](*inputs, dq, *strides, *_strides(dq), *sizes, **options)
    if group > 1:
        sum_group = "b (kv_heads group) k_pos d -> b kv_heads k_pos d"
        dk = reduce(dk, sum_group, "sum", group=group)
        dv = reduce(dv, sum_group, "sum", group=group)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


class FlashAttentionTriton(torch.autograd.Function):
    """The Triton kernels in one autograd op; it saves q, k, v, out and lse.

    ``FlashAttentionTriton.apply(q, k, v, scale, causal, block_q, block_k)``
    returns ``out``; the block sizes may be None (autotuned on a GPU),
    ``scale`` None is ``1/√d``. Inputs whose last axis is not contiguous are
    copied."""

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, block_q, block_k):
        options = dict(causal=causal, block_q=block_q, block_k=block_k)
        owner = "FlashAttentionTriton"
        scale = _check_attention(owner, q, k, v, scale, **options, triton=True)
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        options["scale"] = scale
        out, lse = _triton_forward(q, k, v, **options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out.stride(-1) != 1:
            grad_out = grad_out.contiguous()
        grads = _triton_backward(q, k, v, out, lse, grad_out, **ctx.options)
        return (*grads, None, None, None, None)


# From chapters/09-flash-attention.md, section "Two new attention backends".
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
        stacklevel=3,
    )


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
    reason = _fallback_reason(mask, bias, dropout_p)
    if reason is not None:
        _warn_once("flash_torch", reason)
        options = dict(scale=scale, causal=causal)
        return sdpa_attention(q, k, v, mask, bias, dropout_p, **options)
    return FlashAttentionTorch.apply(q, k, v, scale, causal, block_q, block_k)


def flash_attention_triton(
    q,
    k,
    v,
    mask=None,
    bias=None,
    dropout_p=0.0,
    *,
    scale=None,
    causal=False,
    block_q: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """The ``"flash_triton"`` backend: :class:`FlashAttentionTriton`.

    Arguments as :func:`lib.attention.sdpa_attention`; ``mask``, ``bias``
    and dropout fall back to it (warned once). Head dims 16, 32, 64, 128;
    float16, bfloat16 (compute capability 8.0+) and float32. Raises
    ``RuntimeError`` where Triton cannot run. The inputs are checked by
    :class:`FlashAttentionTriton` (errors name it)."""
    reason = _fallback_reason(mask, bias, dropout_p)
    if reason is not None:
        _warn_once("flash_triton", reason)
        options = dict(scale=scale, causal=causal)
        return sdpa_attention(q, k, v, mask, bias, dropout_p, **options)
    return FlashAttentionTriton.apply(q, k, v, scale, causal, block_q, block_k)


# replace=True: re-importing this module replaces its own two backends
for _name, _backend in (
    ("flash_torch", flash_attention_torch),
    ("flash_triton", flash_attention_triton),
):
    register_attention_backend(_name, _backend, replace=True)
