# This file is generated from chapters/09-2-triton.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/09-2-triton.md, section "Triton: the same algorithm as a GPU kernel".
"""FlashAttention in Triton (chapter 9, page 2): kernels and a backend.

The algorithm of :mod:`lib.flash` (page 1) as GPU programs: a forward
kernel, and a backward pass in two kernels (one for ``dk`` and ``dv``, one
for ``dq``), wrapped as :class:`FlashAttentionTriton`, an
``autograd.Function`` that saves only ``q``, ``k``, ``v``, the output and
the log-sum-exp. :func:`triton_support` says whether the kernels can run on
a device and dtype, and why not. Without a GPU they run in Triton's
interpreter when ``TRITON_INTERPRET=1`` is set before this module is
imported (:data:`TRITON_INTERPRETED`).

Importing the module registers the attention backend ``"flash_triton"``
(:func:`flash_attention_triton`; see :mod:`lib.attention`): attention with
``causal`` (bottom-right aligned), grouped key/value heads and any
``scale``, for head dims 16, 32, 64 and 128; a ``mask``, a ``bias`` or
dropout make it fall back to :func:`lib.attention.sdpa_attention`, with a
warning shown once (:func:`lib.flash.sdpa_fallback`). Shapes: ``q`` is
``(batch heads q_pos d_head)``, ``k`` and ``v``
``(batch kv_heads k_pos d_head)``."""

from __future__ import annotations

import math
import os

import torch
from einops import reduce
from torch.autograd.function import once_differentiable

from lib import _checks as check
from lib.attention import register_attention_backend
from lib.flash import check_flash_arguments, sdpa_fallback

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "TRITON_INTERPRETED",
    "TRITON_HEAD_DIMS",
    "triton_support",
    "triton_attention_forward",
    "triton_attention_backward",
    "FlashAttentionTriton",
    "flash_attention_triton",
]


# Linux x86_64 wheels only; elsewhere the Triton backend says so when called
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None


# From chapters/09-2-triton.md, section "Triton: the same algorithm as a GPU kernel".
# Triton reads TRITON_INTERPRET when a kernel is decorated, that is when
# this module is imported: in interpreter mode the kernels below run on the
# CPU, one program at a time.
TRITON_INTERPRETED = triton is not None and os.environ.get("TRITON_INTERPRET") == "1"
# powers of two (tl.arange needs them), at least 16 (tl.dot needs that)
TRITON_HEAD_DIMS = (16, 32, 64, 128)
# tl.dot's input types (float64 never)
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
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
    if dtype is not None and dtype not in _KERNEL_DTYPES:
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
            "TRITON_INTERPRET=1 before importing lib.flash_triton to run "
            "the kernels in Triton's (slow) interpreter, or use the 'sdpa' "
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
    dtype = dtype if dtype in _KERNEL_DTYPES else None
    ok, why = triton_support(getattr(q, "device", None), dtype)
    if not ok:
        raise RuntimeError(f"{caller} cannot run here: {why}")


def _check_triton(owner, q, k, v, scale, causal, block_q, block_k, **saved):
    """:func:`lib.flash.check_flash_arguments` for the kernels: first,
    where they cannot run, say so; then their dtypes, head dims and tiles.
    Returns the scale."""
    _require_triton(q, owner)
    kernel = dict(dtypes=_KERNEL_DTYPES, head_dims=TRITON_HEAD_DIMS)
    return check_flash_arguments(
        owner,
        q,
        k,
        v,
        scale,
        causal,
        block_q,
        block_k,
        **kernel,
        kernel_blocks=True,
        **saved,
    )


# From chapters/09-2-triton.md, section "The forward kernel".
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


# From chapters/09-2-triton.md, section "The backward kernels".
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


# From chapters/09-2-triton.md, section "Launching the kernels".
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
    scale = _check_triton(owner, q, k, v, scale, **options)
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
    scale = _check_triton(owner, q, k, v, scale, **options, **saved)
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
        scale = _check_triton(owner, q, k, v, scale, **options)
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


# From chapters/09-2-triton.md, section "The Triton backend".
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
    options = dict(scale=scale, causal=causal)
    fallback = sdpa_fallback("flash_triton", q, k, v, mask, bias, dropout_p, **options)
    if fallback is not None:
        return fallback
    return FlashAttentionTriton.apply(q, k, v, scale, causal, block_q, block_k)


# replace=True: re-importing this module replaces its own backend
register_attention_backend("flash_triton", flash_attention_triton, replace=True)
