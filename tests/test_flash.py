"""lib.flash: IO counts, online softmax, tiled attention in PyTorch, its backend.

The Triton kernels of page 9.2 (lib.flash_triton) and the benchmark are tested in
tests/test_flash_triton.py.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from einops import einsum

from lib import flash
from lib.attention import (
    ATTENTION_BACKENDS,
    padding_mask,
    scaled_dot_product_attention,
    sdpa_attention,
    set_attention_backend,
)
from lib.flash import (
    FlashAttentionTorch,
    attention_core_flops,
    attention_hbm_bytes,
    causal_block_kind,
    check_flash_arguments,
    count_matrix_products,
    flash_attention_torch,
    online_softmax,
    roofline_seconds,
    sdpa_fallback,
    tiled_attention_forward,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
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


def test_count_matrix_products_reads_the_innermost_loop():
    assert count_matrix_products(flash.tiled_attention_forward) == 2  # q kᵀ and p v
    # FlashAttention-2's five
    assert count_matrix_products(flash.tiled_attention_backward) == 5

    def helper(a, b):
        return einsum(a, b, "i j, j k -> i k")

    def loop(a, b):
        out = einsum(a, b, "i j, j k -> i k")  # outside the loop: not counted
        for _ in range(3):
            out = helper(out, b) + einsum(out, b, "i j, j k -> i k")
        return out

    assert count_matrix_products(loop) == 1
    assert count_matrix_products(loop, [helper]) == 2
    assert count_matrix_products(helper) == 1  # no loop: the whole body
    with pytest.raises(TypeError, match="function must be callable, got int"):
        count_matrix_products(3)
    with pytest.raises(TypeError, match="helpers must be callable"):
        count_matrix_products(loop, ["helper"])


# --------------------------------------------------------------------------- backend


def test_the_backend_is_registered():
    assert ATTENTION_BACKENDS["flash_torch"] is flash_attention_torch


def test_mask_bias_and_dropout_fall_back_to_sdpa_with_one_warning():
    backend, attend = "flash_torch", flash_attention_torch
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


def test_sdpa_fallback_is_none_without_a_mask_bias_or_dropout():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to fall back for: no warning
        assert sdpa_fallback("mine", q, k, v, causal=True) is None
    with pytest.warns(RuntimeWarning, match="'mine' attention backend .* a bias"):
        out = sdpa_fallback("mine", q, k, v, bias=torch.zeros(8, 8), scale=0.5)
    torch.testing.assert_close(out, sdpa_attention(q, k, v, scale=0.5))
    with pytest.raises(ValueError, match="dropout_p must be a probability"):
        sdpa_fallback("mine", q, k, v, dropout_p=2.0)


def test_check_flash_arguments_for_a_kernel_s_dtypes_head_dims_and_tiles():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, device="cpu")
    kernel = dict(dtypes=(torch.float32,), head_dims=(16, 32), kernel_blocks=True)
    assert check_flash_arguments("f", q, k, v, None, False, None, 32, **kernel) == 0.25
    assert check_flash_arguments("f", q, k, v, 2.0, True, 8, 8) == 2.0
    with pytest.raises(TypeError, match="f takes torch.float32; got torch.float64"):
        check_flash_arguments(
            "f", q.double(), k.double(), v.double(), None, False, 16, 16, **kernel
        )
    with pytest.raises(ValueError, match=r"f: head dims \(16, 32\), got 8"):
        check_flash_arguments(
            "f", q[..., :8], k[..., :8], v[..., :8], None, False, 16, 16, **kernel
        )
    with pytest.raises(ValueError, match="powers of two >= 16: 24"):
        check_flash_arguments("f", q, k, v, None, False, 24, None, **kernel)
    with pytest.raises(TypeError, match="f: block_q must be an int, got NoneType"):
        check_flash_arguments("f", q, k, v, None, False, None, 16)  # only a kernel's


def test_bad_scale_and_blocks():
    q, k, v = _qkv(1, 2, 2, 8, 8, 16, device="cpu")
    with pytest.raises(ValueError, match="scale must be positive and finite"):
        flash_attention_torch(q, k, v, scale=-1.0)
    with pytest.raises(ValueError, match="block_q"):
        flash_attention_torch(q, k, v, block_q=0)
    out = flash_attention_torch(q, k, v, scale=1.0)
    torch.testing.assert_close(out, sdpa_attention(q, k, v, scale=1.0))


def test_a_gpt_switched_to_the_backend_gives_the_same_logits_and_gradients(
    backend="flash_torch",
):
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


# ------------------------------------------- issue 19: every public function, bad input


def test_tiled_attention_refuses_integer_inputs():  # it returned int32 before
    q = torch.ones(1, 1, 4, 4, dtype=torch.int32)
    for call in (
        lambda: flash.tiled_attention_forward(q, q, q, scale=1.0),
        lambda: flash_attention_torch(q, q, q),
    ):
        with pytest.raises(TypeError, match="q must be a floating-point tensor"):
            call()


def test_empty_inputs_give_empty_outputs_and_no_keys_give_zeros():
    attend = flash_attention_torch
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
