"""lib.flash_triton: the Triton kernels, their support check and backend; the benchmark.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here
before lib.flash_triton defines its kernels), at tiny sizes; with a GPU the same tests
run compiled, and more run at head dims 64 and 128 in float16 and bfloat16.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib.util
import warnings
from pathlib import Path

import pytest

from lib import flash, flash_triton
from lib.attention import (
    ATTENTION_BACKENDS,
    MultiHeadAttention,
    padding_mask,
    scaled_dot_product_attention,
    sdpa_attention,
    set_attention_backend,
)
from lib.flash_triton import (
    FlashAttentionTriton,
    flash_attention_triton,
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
    monkeypatch.setattr(flash_triton, "triton", None)
    supported, why = triton_support("cpu")
    assert not supported and "not installed" in why
    q, k, v = _qkv(1, 2, 2, 16, 16, 16, device="cpu")
    with pytest.raises(RuntimeError, match="cannot run here.*'sdpa'"):
        flash_attention_triton(q, k, v)
    monkeypatch.undo()
    monkeypatch.setattr(flash_triton, "TRITON_INTERPRETED", False)
    if flash_triton.triton is not None:
        assert "TRITON_INTERPRET=1" in triton_support("cpu")[1]
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            flash_attention_triton(q, k, v)


def _fake_gpu(monkeypatch, name, capability):
    """Pretend that CUDA has one GPU ``name`` with ``capability``, compiled Triton."""
    if flash_triton.triton is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setattr(flash_triton, "TRITON_INTERPRETED", False)
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
        flash_triton.triton_attention_forward(fake_gpu_q(), q, q, scale=1.0)
    with pytest.raises(RuntimeError, match=r"Tesla T4 \(compute capability 7\.5\)"):
        flash_triton.triton_attention_forward(fake_gpu_q(), q, q, scale=1.0)


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
    if flash_triton.triton is not None:
        monkeypatch.setattr(flash_triton, "TRITON_INTERPRETED", True)
        supported, how = triton_support("cpu", torch.bfloat16)
        assert supported and "interpreter" in how


# --------------------------------------------------------------------------- backend


def test_the_backend_is_registered():
    assert ATTENTION_BACKENDS["flash_triton"] is flash_attention_triton
    MultiHeadAttention(32, 2, backend="flash_triton")  # a known name


def test_mask_bias_and_dropout_fall_back_to_sdpa_with_one_warning():
    backend, attend = "flash_triton", flash_attention_triton
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


@needs_triton
def test_a_gpt_switched_to_the_backend_gives_the_same_logits_and_gradients(
    backend="flash_triton",
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
    monkeypatch.setattr(flash_triton, "TRITON_INTERPRETED", False)
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

    if not flash_triton.TRITON_INTERPRETED:
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

    if not flash_triton.TRITON_INTERPRETED:
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


# ------------------------------------------- issue 19: every public function, bad input


@needs_triton
@pytest.mark.skipif(
    not flash_triton.TRITON_INTERPRETED, reason="the interpreter's bfloat16"
)
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


@needs_triton
def test_empty_inputs_give_empty_outputs_and_no_keys_give_zeros():
    attend = flash_attention_triton
    q, k, v = _qkv(2, 2, 2, 8, 8, 16)
    no_keys = attend(q, k[:, :, :0], v[:, :, :0])  # what sdpa_attention gives too
    assert torch.equal(no_keys, torch.zeros_like(q))
    assert torch.equal(no_keys, sdpa_attention(q, k[:, :, :0], v[:, :, :0]))
    assert attend(q[:, :, :0], k, v).shape == (2, 2, 0, 16)
    assert attend(q[:0], k[:0], v[:0]).shape == (0, 2, 8, 16)
    leaves = [t.clone().requires_grad_() for t in (q, k[:, :, :0], v[:, :, :0])]
    grads = torch.autograd.grad(attend(*leaves).sum(), leaves)
    assert torch.equal(grads[0], torch.zeros_like(q))


@needs_triton
def test_triton_entry_points_check_their_arguments():
    q, k, v = _qkv(1, 1, 1, 16, 16, 16)
    with pytest.raises(TypeError, match="block_q must be an int, got str"):
        flash_triton.triton_attention_forward(q, k, v, block_q="16")
    strided = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match="need a contiguous last axis"):
        flash_triton.triton_attention_forward(strided, k, v)
    out, lse = flash_triton.triton_attention_forward(q, k, v, block_q=16, block_k=16)
    with pytest.raises(ValueError, match="lse must have shape"):
        flash_triton.triton_attention_backward(q, k, v, out, lse[0], torch.ones_like(q))
