"""lib.flash: IO counts, online softmax, tiled attention (PyTorch, Triton), backends.

Without a GPU the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1, set
here before lib.flash defines its kernels), at tiny sizes; with a GPU the same tests
run compiled, and more run at head dims 64 and 128 in float16 and bfloat16.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util
import math
import warnings
from pathlib import Path

import pytest
from einops import einsum

from lib import flash
from lib.attention import (
    ATTENTION_BACKENDS,
    MultiHeadAttention,
    padding_mask,
    scaled_dot_product_attention,
    sdpa_attention,
    set_attention_backend,
)
from lib.flash import (
    FlashAttentionTorch,
    FlashAttentionTriton,
    attention_core_flops,
    attention_hbm_bytes,
    causal_block_kind,
    flash_attention_torch,
    flash_attention_triton,
    online_softmax,
    roofline_seconds,
    tiled_attention_forward,
    triton_support,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TRITON_READY = triton_support(DEVICE)[0]
needs_triton = pytest.mark.skipif(not TRITON_READY, reason="Triton cannot run here")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# Attention outputs: how far a 16-bit kernel may be from the float32 math path, relative
# to the largest reference value. The chapter states the same tolerances.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def _qkv(batch, heads, kv_heads, q_len, k_len, d, dtype=torch.float32, device=DEVICE):
    gen = torch.Generator().manual_seed(q_len * 1000 + k_len)
    shapes = [
        (batch, heads, q_len, d),
        (batch, kv_heads, k_len, d),
        (batch, kv_heads, k_len, d),
    ]
    tensors = [torch.randn(s, generator=gen) for s in shapes]
    return [t.to(device=device, dtype=dtype) for t in tensors]


def _reference(q, k, v, grad_out, causal, scale=None):
    """Output and gradients of chapter 4's math path, in float32 (or float64)."""
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(work).requires_grad_() for t in (q, k, v)]
    out = scaled_dot_product_attention(*leaves, scale=scale, causal=causal)
    grads = torch.autograd.grad(out, leaves, grad_out.to(work))
    return out.detach(), grads


def _assert_near(got, want, tolerance, what=""):
    error = (got.double() - want.double()).abs().max().item()
    bound = tolerance * max(1.0, want.abs().max().item())
    assert error <= bound, f"{what}: max error {error:.2e} > {bound:.2e}"


@pytest.fixture(autouse=True)
def _fresh_warnings():
    flash._WARNED.clear()
    yield
    flash._WARNED.clear()


# --------------------------------------------------------------------------- IO model


def test_attention_core_flops():
    assert attention_core_flops(128, 128, 64) == 4 * 128 * 128 * 64
    assert attention_core_flops(5, 5, 8, causal=True) == 4 * (5 * 6 // 2) * 8
    assert attention_core_flops(2, 4, 8, causal=True) == 4 * (3 + 4) * 8  # bottom-right
    assert attention_core_flops(4, 2, 8, causal=True) == 4 * (0 + 0 + 1 + 2) * 8
    assert attention_core_flops(64, 64, 16, backward=True) == 3.5 * 4 * 64 * 64 * 16
    with pytest.raises(ValueError, match="d_head must be an int >= 1"):
        attention_core_flops(8, 8, 0)


def test_attention_hbm_bytes():
    n, d = 4096, 64
    assert attention_hbm_bytes(n, d, method="standard") == (4 * n * d + 4 * n * n) * 2
    once = attention_hbm_bytes(n, d, method="flash", block_q=None)
    assert once == 4 * n * d * 2 + 4 * n
    blocks = 4096 // 128
    per_block = attention_hbm_bytes(n, d, method="flash", block_q=128)
    assert per_block == (2 * n * d + 2 * n * d * blocks) * 2 + 4 * n
    assert attention_hbm_bytes(
        100,
        d,
        method="flash",
        block_q=64,
        bytes_per_value=4,
    ) == ((2 * 100 * d + 2 * 100 * d * 2) * 4 + 400)  # ragged: two blocks of queries
    ratio = attention_hbm_bytes(65536, d, method="standard") / attention_hbm_bytes(
        65536,
        d,
        method="flash",
        block_q=128,
    )
    assert 3.9 < ratio < 4.0  # tends to 4·B_r / (2·d) = 4
    with pytest.raises(ValueError, match="method must be"):
        attention_hbm_bytes(n, d, method="tiled")


def test_roofline_seconds():
    assert roofline_seconds(10.0, 1.0, 10.0, 1.0) == 1.0
    assert roofline_seconds(1.0, 10.0, 10.0, 1.0) == 10.0
    with pytest.raises(ValueError, match="bandwidth > 0"):
        roofline_seconds(1.0, 1.0, 1.0, 0.0)


# ------------------------------------------------------------------- online softmax


@pytest.mark.parametrize("block_size", [1, 3, 8, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_online_softmax_on_extreme_rows(block_size, dtype):
    big = torch.finfo(dtype).max
    rows = torch.tensor(
        [
            [1e4, -1e4, 0.0, 5.0, 1e4, -3.0, 2.0, 7.0],
            [big, big / 2, -big, 0.0, big, 1.0, -1.0, 3.0],
            [
                -math.inf,
                -math.inf,
                3.0,
                -math.inf,
                -math.inf,
                -math.inf,
                -math.inf,
                0.0,
            ],
            [-50.0, -49.0, -48.0, -47.0, -46.0, -45.0, -44.0, 300.0],
        ],
        dtype=dtype,
    )
    ours = online_softmax(rows, block_size=block_size)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, torch.softmax(rows, dim=-1))
    random_rows = torch.randn(3, 5, 37, dtype=dtype) * 30
    torch.testing.assert_close(
        online_softmax(random_rows, block_size),
        torch.softmax(random_rows, -1),
    )


def test_online_softmax_dead_row_and_bad_input():
    assert torch.equal(online_softmax(torch.full((2, 5), -math.inf)), torch.zeros(2, 5))
    with pytest.raises(TypeError, match="float tensor"):
        online_softmax(torch.arange(5))
    with pytest.raises(ValueError, match="block_size"):
        online_softmax(torch.randn(5), block_size=0)


# -------------------------------------------------------------------- tiled PyTorch


def test_causal_block_kind_matches_the_mask():
    gen = torch.Generator().manual_seed(0)
    for _ in range(500):
        q_len, k_len = (int(x) for x in torch.randint(1, 30, (2,), generator=gen))
        r0 = int(torch.randint(q_len, (1,), generator=gen))
        c0 = int(torch.randint(k_len, (1,), generator=gen))
        r1 = min(r0 + int(torch.randint(1, 9, (1,), generator=gen)), q_len)
        c1 = min(c0 + int(torch.randint(1, 9, (1,), generator=gen)), k_len)
        offset = k_len - q_len
        rows, cols = torch.arange(r0, r1)[:, None], torch.arange(c0, c1)[None, :]
        visible = cols <= rows + offset
        want = "skip" if not visible.any() else "full" if visible.all() else "partial"
        assert causal_block_kind(r0, r1, c0, c1, offset) == want


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("q_len", "k_len", "blocks"),
    [(37, 37, (16, 8)), (20, 50, (8, 16)), (50, 20, (16, 16))],
)
def test_tiled_forward_matches_math_path(q_len, k_len, blocks, causal):
    q, k, v = _qkv(2, 4, 2, q_len, k_len, 16, device="cpu")
    out, lse = tiled_attention_forward(
        q,
        k,
        v,
        scale=0.3,
        causal=causal,
        block_q=blocks[0],
        block_k=blocks[1],
    )
    torch.testing.assert_close(
        out,
        scaled_dot_product_attention(q, k, v, scale=0.3, causal=causal),
    )
    k_all = k.repeat_interleave(2, dim=1)
    scores = 0.3 * einsum(q, k_all, "b h q d, b h k d -> b h q k")
    if causal:
        rows, cols = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]
        future = cols > rows + k_len - q_len
        scores = scores.masked_fill(future, -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1))
    if causal and q_len > k_len:  # the first queries see no key: zeros, lse = -inf
        dead = q_len - k_len
        assert torch.equal(out[:, :, :dead], torch.zeros_like(out[:, :, :dead]))
        assert torch.isneginf(lse[:, :, :dead]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_flash_torch_gradcheck_float64(causal):
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 1, 5, 7, 4, torch.float64, "cpu"))
    fn = lambda q, k, v: FlashAttentionTorch.apply(q, k, v, 0.5, causal, 2, 3)
    assert torch.autograd.gradcheck(fn, (q, k, v))
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 2, 6, 3, 4, torch.float64, "cpu"))
    assert torch.autograd.gradcheck(fn, (q, k, v))  # more queries than keys


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("q_len", "k_len"), [(70, 70), (33, 65)])
def test_flash_torch_float32_gradients_match_math_path(q_len, k_len, causal):
    q, k, v = _qkv(2, 4, 2, q_len, k_len, 32, device="cpu")
    grad_out = torch.randn_like(q)
    want_out, want_grads = _reference(q, k, v, grad_out, causal)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention_torch(*leaves, causal=causal, block_q=32, block_k=16)
    grads = torch.autograd.grad(out, leaves, grad_out)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_flash_torch_saves_only_q_k_v_out_lse():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 2, 64, 64, 8, device="cpu"))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t) or t,
        lambda t: t,
    ):
        out = FlashAttentionTorch.apply(q, k, v, 0.3, True, 16, 16)
    assert [tuple(t.shape) for t in saved] == [(1, 2, 64, 8)] * 4 + [(1, 2, 64)]
    assert saved[3] is out or torch.equal(saved[3], out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_torch_16_bit_inputs(dtype):
    q, k, v = _qkv(1, 2, 2, 40, 40, 16, dtype, "cpu")
    out = flash_attention_torch(q, k, v, causal=True, block_q=16, block_k=16)
    assert out.dtype == dtype
    want = scaled_dot_product_attention(q.float(), k.float(), v.float(), causal=True)
    _assert_near(out, want, TOLERANCE[dtype], "flash_torch")


# --------------------------------------------------------------------------- Triton


TRITON_CASES = [((40, 40), False), ((40, 40), True), ((24, 56), True), ((56, 24), True)]


@needs_triton
@pytest.mark.parametrize(("lengths", "causal"), TRITON_CASES)
def test_triton_forward_and_backward_match_math_path(lengths, causal):
    q, k, v = _qkv(1, 4, 2, *lengths, 16)
    grad_out = torch.randn_like(q)
    want_out, want_grads = _reference(q, k, v, grad_out, causal, scale=0.25)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = FlashAttentionTriton.apply(*leaves, 0.25, causal, 16, 16)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    for got, want in zip(torch.autograd.grad(out, leaves, grad_out), want_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@needs_triton
def test_triton_float16_accumulates_in_float32():
    q, k, v = _qkv(1, 2, 2, 48, 48, 32, torch.float16)
    grad_out = torch.randn_like(q)
    want_out, want_grads = _reference(q, k, v, grad_out, causal=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention_triton(*leaves, causal=True, block_q=16, block_k=16)
    assert out.dtype == torch.float16
    _assert_near(out, want_out, TOLERANCE[torch.float16], "out")
    for name, got, want in zip(
        "qkv",
        torch.autograd.grad(out, leaves, grad_out),
        want_grads,
    ):
        assert got.dtype == torch.float16
        _assert_near(got, want, 4 * TOLERANCE[torch.float16], f"d{name}")


@needs_triton
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's NumPy, on
def test_triton_ragged_keys_with_very_negative_scores():  # rows that are never stored
    # Every score near -400: a key past the end (loaded as 0) would get 2^(0 - lse),
    # which overflows float32, unless the kernels mask it.
    q, k, v = _qkv(1, 1, 1, 20, 20, 16)
    q, k = q.abs() + 4.0, -(k.abs() + 4.0)
    grad_out = torch.randn_like(q)
    want_out, want_grads = _reference(q, k, v, grad_out, causal=False)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention_triton(*leaves, block_q=16, block_k=16)
    grads = torch.autograd.grad(out, leaves, grad_out)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
    assert all(torch.isfinite(g).all() for g in grads)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)


@needs_triton
def test_triton_takes_non_contiguous_inputs():
    q, k, v = _qkv(1, 2, 2, 32, 32, 16)
    # a last axis that is not contiguous, and a view with odd strides
    q_strided = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    k_view = torch.cat([k, k], dim=-1)[
        ...,
        :16,
    ]  # contiguous last axis, other strides odd
    assert q_strided.stride(-1) != 1 and not k_view.is_contiguous()
    out = flash_attention_triton(
        q_strided,
        k_view,
        v,
        causal=True,
        block_q=16,
        block_k=16,
    )
    torch.testing.assert_close(
        out,
        sdpa_attention(q, k, v, causal=True),
        atol=1e-5,
        rtol=1e-4,
    )


@needs_triton
def test_triton_rejects_bad_block_sizes():
    q, k, v = _qkv(1, 1, 1, 16, 16, 16)
    with pytest.raises(ValueError, match="powers of two >= 16"):
        flash_attention_triton(q, k, v, block_q=24, block_k=16)


@needs_gpu
@pytest.mark.parametrize("d_head", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_triton_on_gpu_head_dims_and_16_bit_dtypes(d_head, dtype, causal):
    supported, why = triton_support(DEVICE, dtype)
    if not supported:
        pytest.skip(why)
    q, k, v = _qkv(2, 8, 2, 1000, 1000, d_head, dtype)
    grad_out = torch.randn_like(q)
    want_out, want_grads = _reference(q, k, v, grad_out, causal)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flash_attention_triton(*leaves, causal=causal)  # autotuned tiles
    _assert_near(out, want_out, TOLERANCE[dtype], "out")
    for name, got, want in zip(
        "qkv",
        torch.autograd.grad(out, leaves, grad_out),
        want_grads,
    ):
        _assert_near(got, want, 4 * TOLERANCE[dtype], f"d{name}")


def test_triton_unavailable_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(flash, "triton", None)
    supported, why = triton_support("cpu")
    assert not supported and "not installed" in why
    q, k, v = _qkv(1, 2, 2, 16, 16, 16, device="cpu")
    with pytest.raises(RuntimeError, match="cannot run here.*'sdpa'"):
        flash_attention_triton(q, k, v)
    monkeypatch.undo()
    monkeypatch.setattr(flash, "TRITON_INTERPRETED", False)
    if flash.triton is not None:
        assert "TRITON_INTERPRET=1" in triton_support("cpu")[1]
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            flash_attention_triton(q, k, v)


def _fake_gpu(monkeypatch, name, capability):
    """Pretend that CUDA has one GPU ``name`` with ``capability``, compiled Triton."""
    if flash.triton is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setattr(flash, "TRITON_INTERPRETED", False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(
        torch.cuda, "get_device_capability", lambda device=None: capability
    )


def test_triton_support_on_a_t4_is_float16_only(monkeypatch):
    _fake_gpu(monkeypatch, "Tesla T4", (7, 5))
    for dtype in (None, torch.float16, torch.float32):
        supported, how = triton_support("cuda", dtype)
        assert supported and "Tesla T4 (compute capability 7.5)" in how
        assert "bfloat16 needs 8.0" in how
    assert triton_support() == triton_support("cuda")  # the default: the current GPU
    supported, why = triton_support("cuda", torch.bfloat16)
    assert not supported
    for words in ("Tesla T4", "compute capability 7.5", "use float16", "get_precision"):
        assert words in why
    # the kernels' entry point refuses before any Triton compilation starts
    q = torch.empty(1, 1, 16, 16, dtype=torch.bfloat16)
    fake_gpu_q = type(
        "FakeCudaTensor", (), {"device": torch.device("cuda"), "dtype": q.dtype}
    )
    with pytest.raises(RuntimeError, match="triton_attention_forward cannot run here"):
        flash.triton_attention_forward(fake_gpu_q(), q, q, scale=1.0)
    with pytest.raises(RuntimeError, match=r"Tesla T4 \(compute capability 7\.5\)"):
        flash.triton_attention_forward(fake_gpu_q(), q, q, scale=1.0)


def test_triton_support_on_ampere_and_on_older_gpus(monkeypatch):
    _fake_gpu(monkeypatch, "NVIDIA A100-SXM4-40GB", (8, 0))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        supported, how = triton_support("cuda:0", dtype)
        assert supported and how.endswith("float16, bfloat16 and float32")
    _fake_gpu(monkeypatch, "Tesla P100-PCIE-16GB", (6, 0))
    supported, why = triton_support("cuda", torch.float16)
    assert not supported
    assert "Tesla P100-PCIE-16GB (compute capability 6.0) is too old" in why
    assert "7.5" in why and "'sdpa'" in why


def test_triton_support_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert triton_support() == triton_support("cpu")
    supported, why = triton_support("mps")
    assert not supported and ("'mps'" in why or "not installed" in why)
    if flash.triton is not None:
        monkeypatch.setattr(flash, "TRITON_INTERPRETED", True)
        supported, how = triton_support("cpu", torch.bfloat16)
        assert supported and "interpreter" in how


# --------------------------------------------------------------------------- backends


def test_backends_are_registered():
    assert ATTENTION_BACKENDS["flash_torch"] is flash_attention_torch
    assert ATTENTION_BACKENDS["flash_triton"] is flash_attention_triton
    MultiHeadAttention(32, 2, backend="flash_triton")  # a known name


@pytest.mark.parametrize("backend", ["flash_torch", "flash_triton"])
def test_mask_bias_and_dropout_fall_back_to_sdpa_with_one_warning(backend):
    attend = ATTENTION_BACKENDS[backend]
    q, k, v = _qkv(2, 4, 2, 8, 8, 16, device="cpu")
    mask = padding_mask([8, 5])
    bias = torch.randn(4, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            out_mask = attend(q, k, v, mask, causal=True)
            out_bias = attend(q, k, v, bias=bias)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert "does not implement a mask" in messages[0] and "a bias" in messages[1]
    assert all(backend in m and "sdpa_attention" in m for m in messages)
    torch.testing.assert_close(out_mask, sdpa_attention(q, k, v, mask, causal=True))
    torch.testing.assert_close(out_bias, sdpa_attention(q, k, v, bias=bias))
    with pytest.warns(RuntimeWarning, match="dropout_p=0.5"):
        attend(q, k, v, dropout_p=0.5)


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (lambda q, k, v: (q[..., :8], k[..., :8], v[..., :8]), ValueError, "head dims"),
        (
            lambda q, k, v: (q.double(), k.double(), v.double()),
            TypeError,
            "takes torch",
        ),
        (lambda q, k, v: (q, k.half(), v), TypeError, "share a dtype"),
        (lambda q, k, v: (q, k.to("meta"), v), ValueError, "are on cpu, meta"),
        (lambda q, k, v: (q[:, :3], k, v), ValueError, "multiple of kv_heads"),
        (lambda q, k, v: (q, k, v[..., :8]), ValueError, "one head dim"),
        (lambda q, k, v: (q[0], k, v), ValueError, "4-D tensor"),
    ],
)
def test_bad_inputs_are_clear_errors(make, error, words):
    q, k, v = _qkv(1, 4, 2, 8, 8, 16, device="cpu")
    with pytest.raises(error, match=words):
        flash_attention_triton(*make(q, k, v))


def test_bad_scale_and_blocks():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, device="cpu")
    with pytest.raises(ValueError, match="scale must be positive and finite"):
        flash_attention_torch(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="block_q"):
        flash_attention_torch(q, k, v, block_q=0)
    out = flash_attention_torch(q, k, v, scale=1.0)
    torch.testing.assert_close(out, sdpa_attention(q, k, v, scale=1.0))


@pytest.mark.parametrize(
    "backend",
    ["flash_torch", pytest.param("flash_triton", marks=needs_triton)],
)
def test_a_gpt_switched_to_the_backend_gives_the_same_logits_and_gradients(backend):
    from lib.models import GPT, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=50,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        max_len=32,
    )
    model = GPT(config).to(DEVICE)
    ids = torch.randint(50, (2, 32), device=DEVICE)

    def loss_and_grads():
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1),
            ids[:, 1:].flatten(),
        )
        return logits, torch.autograd.grad(loss, list(model.parameters()))

    set_attention_backend(model, "sdpa")
    want_logits, want_grads = loss_and_grads()
    set_attention_backend(model, backend)
    logits, grads = loss_and_grads()
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- benchmark


def _bench_module():
    path = Path(__file__).resolve().parent.parent / "bench" / "bench_flash.py"
    spec = importlib.util.spec_from_file_location("bench_flash", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_skips_cleanly_without_a_gpu_or_the_interpreter(capsys, monkeypatch):
    bench = _bench_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(flash, "TRITON_INTERPRETED", False)
    assert bench.main([]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out


TINY_BENCH = ["--lengths", "32", "--memory-lengths", "32", "--head-dims", "16"]
TINY_BENCH += ["--batch", "1", "--heads", "1"]


@needs_triton
def test_benchmark_checks_itself_on_the_cpu_at_tiny_sizes(tmp_path, monkeypatch):
    """With Triton's interpreter the benchmark runs its CPU path: the correctness check
    at each size against SDPA's math path, timings of the methods a CPU has, and the
    record (no GPU memory measured)."""
    from lib.utils import read_record

    if not flash.TRITON_INTERPRETED:
        pytest.skip("the CPU path runs under TRITON_INTERPRET=1")
    bench = _bench_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "09-flash-attention-cpu"
    assert bench.main([*TINY_BENCH, "--out", str(out)]) == 0
    record = read_record(out)
    checks = record["extra"]["correctness"]
    assert [(c["causal"], c["seq_len"]) for c in checks] == [(False, 32), (True, 32)]
    for check in checks:
        assert check["ok"] and check["reference"] == "sdpa_math"
        assert set(check["max_abs_error"]) == {"out", "dq", "dk", "dv"}
        assert max(check["max_abs_error"].values()) < 1e-4
    timed = {(r["method"], r["pass"]) for r in record["extra"]["speed"] if r["ms"]}
    assert timed == {(m, p) for m in bench.CPU_METHODS for p in ("fwd", "fwd+bwd")}
    assert record["extra"]["memory"] == [] and record["config"]["dtype"] == "float32"


@needs_triton
def test_benchmark_exits_1_when_our_kernel_is_wrong(tmp_path, monkeypatch, capsys):
    """A kernel off by more than the tolerance fails the run, after writing the record
    that shows by how much."""
    from lib.utils import read_record

    if not flash.TRITON_INTERPRETED:
        pytest.skip("the CPU path runs under TRITON_INTERPRET=1")
    bench = _bench_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    methods = bench.attention_methods()
    right = methods["triton"]
    methods["triton"] = lambda q, k, v, causal: right(q, k, v, causal) * 1.01 + 0.01
    monkeypatch.setattr(bench, "attention_methods", lambda: methods)
    out = tmp_path / "wrong"
    assert bench.main([*TINY_BENCH, "--out", str(out)]) == 1
    assert "2 OFF beyond tolerance" in capsys.readouterr().out
    checks = read_record(out)["extra"]["correctness"]
    assert not any(check["ok"] for check in checks)
    assert all(check["max_abs_error"]["out"] >= 0.01 for check in checks)


def _recorded_measurements(bench):
    speed = [
        {
            "method": m,
            "pass": p,
            "d_head": d,
            "causal": c,
            "seq_len": n,
            "ms": 1.0,
            "tflops": t,
        }
        for m, t in zip(bench.METHODS, (300.0, 290.0, 450.0, None))
        for p in ("fwd", "fwd+bwd")
        for d in (64, 128)
        for c in (False, True)
        for n in (1024, 2048)
    ]
    memory = [
        {
            "method": m,
            "seq_len": n,
            "peak_bytes": None if m == "sdpa_math" and n > 1024 else n,
        }
        for m in bench.MEMORY_METHODS
        for n in (1024, 4096)
    ]
    return speed, memory


def test_benchmark_plots_recorded_results():
    bench = _bench_module()
    speed, memory = _recorded_measurements(bench)
    assert len(bench.plot_speed(speed).axes) == 4
    assert len(bench.plot_memory(memory).axes[0].lines) == 3


def test_benchmark_writes_the_one_record_schema_the_chapter_reads(tmp_path):
    from lib.utils import RECORD_KEYS, read_record

    bench = _bench_module()
    speed, memory = _recorded_measurements(bench)
    summary = {"fwd": dict(min=0.9, max=1.1, target=1.0)}
    out = tmp_path / "09-flash-attention-test"
    config = dict(dtype="bfloat16", batch=4, heads=32)
    path = bench.write_results(
        out, "python bench/bench_flash.py", 12.5, summary, config, speed, memory, "cpu"
    )
    record = read_record(path)
    assert tuple(record) == RECORD_KEYS and record["name"] == out.name
    assert record["metrics"] == summary and record["config"] == config
    assert record["extra"]["speed"] == speed and record["extra"]["memory"] == memory
    assert (out / "speed.png").is_file() and (out / "memory.png").is_file()


# ------------------------------------------- issue 19: every public function, bad input


def test_tiled_attention_refuses_integer_inputs():  # it returned int32 before
    q = torch.ones(1, 1, 4, 4, dtype=torch.int32)
    for call in (
        lambda: flash.tiled_attention_forward(q, q, q, scale=1.0),
        lambda: flash_attention_torch(q, q, q),
    ):
        with pytest.raises(TypeError, match="q must be a floating-point tensor"):
            call()


@needs_triton
@pytest.mark.skipif(not flash.TRITON_INTERPRETED, reason="the interpreter's bfloat16")
def test_triton_bfloat16_in_the_interpreter_is_computed_in_float32():
    supported, how = triton_support("cpu", torch.bfloat16)
    assert supported and "bfloat16 computed in float32" in how
    q, k, v = _qkv(1, 2, 2, 32, 32, 16)
    grad_out = torch.randn_like(q)
    want_out, want_grads = _reference(q, k, v, grad_out, causal=True)
    leaves = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    out = flash_attention_triton(*leaves, causal=True, block_q=16, block_k=16)
    assert out.dtype == torch.bfloat16  # was off by ~8e8 in Triton 3.x's interpreter
    _assert_near(out, want_out, TOLERANCE[torch.bfloat16], "out")
    grads = torch.autograd.grad(out, leaves, grad_out.to(torch.bfloat16))
    for name, got, want in zip("qkv", grads, want_grads):
        assert got.dtype == torch.bfloat16
        _assert_near(got, want, 4 * TOLERANCE[torch.bfloat16], f"d{name}")


def test_triton_support_refuses_float64_and_what_is_not_a_dtype():
    supported, why = triton_support("cpu", torch.float64)
    assert not supported and "float16, bfloat16 and float32, not torch.float64" in why
    with pytest.raises(TypeError, match="dtype must be a torch.dtype or None"):
        triton_support("cpu", "bfloat16")


@pytest.mark.parametrize(
    "backend", ["flash_torch", pytest.param("flash_triton", marks=needs_triton)]
)
def test_empty_inputs_give_empty_outputs_and_no_keys_give_zeros(backend):
    attend = ATTENTION_BACKENDS[backend]
    q, k, v = _qkv(2, 2, 2, 8, 8, 16)
    no_keys = attend(q, k[:, :, :0], v[:, :, :0])  # what sdpa_attention gives too
    assert torch.equal(no_keys, torch.zeros_like(q))
    assert torch.equal(no_keys, sdpa_attention(q, k[:, :, :0], v[:, :, :0]))
    assert attend(q[:, :, :0], k, v).shape == (2, 2, 0, 16)
    assert attend(q[:0], k[:0], v[:0]).shape == (0, 2, 8, 16)
    leaves = [t.clone().requires_grad_() for t in (q, k[:, :, :0], v[:, :, :0])]
    grads = torch.autograd.grad(attend(*leaves).sum(), leaves)
    assert torch.equal(grads[0], torch.zeros_like(q))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(scale=True), TypeError, "scale must be a number, got bool"),
        (dict(scale=math.nan), ValueError, "scale must be positive and finite"),
        (dict(scale=math.inf), ValueError, "scale must be positive and finite"),
        (dict(causal="yes"), TypeError, "causal must be True or False"),
        (dict(dropout_p="0.1"), TypeError, "dropout_p must be a number"),
        (
            dict(dropout_p=1.5),
            ValueError,
            r"dropout_p must be a probability in \[0, 1\)",
        ),
        (dict(block_q=2.5), TypeError, "block_q must be an int"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, error, match):
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, device="cpu")
    with pytest.raises(error, match=match):
        flash_attention_torch(q, k, v, **kwargs)


def test_zero_heads_or_head_dim_are_clear_errors():  # ZeroDivisionError before
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, device="cpu")
    with pytest.raises(ValueError, match="kv_heads must be an int >= 1, got 0"):
        flash_attention_torch(q, k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match="d_head must be an int >= 1, got 0"):
        flash_attention_torch(q[..., :0], k[..., :0], v[..., :0])


def test_tiled_backward_checks_what_the_forward_saved():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, device="cpu")
    out, lse = flash.tiled_attention_forward(q, k, v)  # scale None: 1/√d
    torch.testing.assert_close(out, sdpa_attention(q, k, v))
    grads = flash.tiled_attention_backward(q, k, v, out, lse, torch.ones_like(q))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    with pytest.raises(
        ValueError, match=r"lse must have shape \(b h q\) with b=1, h=2"
    ):
        flash.tiled_attention_backward(q, k, v, out, lse[..., :4], torch.ones_like(q))
    with pytest.raises(ValueError, match="grad_out must have shape"):
        flash.tiled_attention_backward(q, k, v, out, lse, torch.ones(1, 2, 8, 8))


def test_scalar_helpers_check_their_arguments():
    with pytest.raises(TypeError, match="causal must be True or False"):
        attention_core_flops(8, 8, 8, causal="yes")
    with pytest.raises(ValueError, match="block_q must be an int >= 1, got 0"):
        attention_hbm_bytes(64, 8, method="flash", block_q=0)
    with pytest.raises(ValueError, match="flops must be a finite number >= 0, got nan"):
        roofline_seconds(math.nan, 1.0, 1.0, 1.0)
    with pytest.raises(TypeError, match="peak_flops must be a number, got str"):
        roofline_seconds(1.0, 1.0, "1e12", 1.0)
    with pytest.raises(ValueError, match="a tile has q_start < q_stop"):
        causal_block_kind(4, 4, 0, 8, 0)
    with pytest.raises(TypeError, match="offset must be an int, got float"):
        causal_block_kind(0, 4, 0, 8, 0.5)


def test_online_softmax_empty_rows_nan_and_scalars():
    assert online_softmax(torch.empty(3, 0)).shape == (3, 0)  # IndexError before
    nan_row = torch.tensor([[0.0, math.nan, 1.0]])
    assert torch.isnan(online_softmax(nan_row)).all()  # as torch.softmax: documented
    assert torch.isnan(torch.softmax(nan_row, -1)).all()
    with pytest.raises(ValueError, match=r"scores must have shape \(\.\.\. n\)"):
        online_softmax(torch.tensor(1.0))


@needs_triton
def test_triton_entry_points_check_their_arguments():
    q, k, v = _qkv(1, 1, 1, 16, 16, 16)
    with pytest.raises(TypeError, match="block_q must be an int, got str"):
        flash.triton_attention_forward(q, k, v, block_q="16")
    strided = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match="need a contiguous last axis"):
        flash.triton_attention_forward(strided, k, v)
    out, lse = flash.triton_attention_forward(q, k, v, block_q=16, block_k=16)
    with pytest.raises(ValueError, match="lse must have shape"):
        flash.triton_attention_backward(q, k, v, out, lse[0], torch.ones_like(q))


@needs_triton
def test_benchmark_check_names_the_side_that_failed(monkeypatch):
    """Our kernel failing is OFF and says so; a reference that cannot run is replaced
    by the next (FlashAttention-2 has no kernel before Ampere), and with none left the
    size is not checked rather than blamed on us."""
    bench = _bench_module()
    q, k, v = (torch.randn(1, 1, 8, 4) for _ in range(3))
    good = lambda q, k, v, causal: scaled_dot_product_attention(q, k, v, causal=causal)

    def broken(q, k, v, causal):
        raise RuntimeError("no kernel for this GPU")

    errors, used = bench.max_errors(good, {"a": broken, "b": good}, q, k, v, True, True)
    assert used == "b" and max(errors.values()) == 0.0
    assert bench.max_errors(good, {"a": broken}, q, k, v, True, True) == (
        None, "no reference ran (a)"
    )  # fmt: skip
    errors, why = bench.max_errors(broken, {"b": good}, q, k, v, True, True)
    assert errors is None and why.startswith("ours failed: RuntimeError")
