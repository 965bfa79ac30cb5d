"""Benchmark: chapter 9's Triton FlashAttention against PyTorch's SDPA backends (GPU).

Prints, for 16-bit inputs (bf16; fp16 on GPUs without bf16, such as Colab's T4, where
``lib.utils.get_precision`` picks it) of 4 sequences x 32 heads at 1k-16k tokens, head dims 64 and
128, causal and not, the TFLOP/s of the forward and of the forward+backward pass of

* ``triton``: our kernels (``lib.flash_triton.flash_attention_triton``, autotuned),
* ``sdpa_flash``: ``scaled_dot_product_attention`` restricted to FlashAttention-2,
* ``sdpa_cudnn``: restricted to its cuDNN backend,
* ``sdpa_math``: restricted to the unfused math path (out of memory when long),

and the ratio of ours to each, all measured in the same run (FLOPs: ``4 · q · k · d``
per head for the forward, visible pairs only when causal; forward+backward 3.5 times
that).
Then the peak memory of one forward+backward pass (1 sequence x 32 heads, d 64) against
the length for the math path, the tiled PyTorch version and the Triton kernel.

Every measured size is also checked: our output and gradients against the reference
(SDPA's flash backend on a GPU, the math path on a CPU), the largest absolute error per
size in the record; the script exits with status 1 (after writing the record) if one is
off by more than the tolerance of the dtype. It never asserts on time.

Without a CUDA GPU it runs only with ``TRITON_INTERPRET=1`` (Triton's interpreter, on the
CPU, in float32), at the sizes given, for the kernels and the methods a CPU has
(``triton``, ``sdpa_math``): a check that the script and its record work, not a
measurement of speed (``scripts/gpu_records.py --dry-run`` runs it at tiny sizes). Without
either it prints that it needs one and exits with status 0. ``--out DIR`` also writes there ``metrics.json``, in the one
schema of ``lib.utils.write_record`` (GPU, versions, commit, wall time, command; the
sizes as ``config``; the ratios of ours to SDPA's flash backend per pass as ``metrics``;
every measurement under ``extra``: ``speed`` and ``memory``), with ``speed.png`` and
``memory.png``: the files chapter 9 (page 9.2) shows from ``book/results/``.

    python bench/bench_flash.py [--lengths 1024 2048 4096 8192 16384]
        [--head-dims 64 128] [--batch 4] [--heads 32]
        [--out book/results/09-flash-attention-h100]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from lib.utils import get_precision, write_record  # noqa: E402 (after the path is set)

METHODS = ("triton", "sdpa_flash", "sdpa_cudnn", "sdpa_math")
MEMORY_METHODS = ("sdpa_math", "flash_torch", "triton")
# ours / sdpa_flash. Our backward does 7 matrix products to FlashAttention-2's 5
# (its dQ kernel recomputes q kᵀ and dO vᵀ), so a training step does 9/7 the
# arithmetic: 0.8 asks for about 3 % more products per second than
# FlashAttention-2 (page 9.2 counts them from the kernels' code).
TARGETS = {"fwd": 1.0, "fwd+bwd": 0.8}


def _sdpa(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def attend(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(
                q,
                k,
                v,
                is_causal=causal,
            )

    return attend


def attention_methods() -> dict:
    """Name -> ``fn(q, k, v, causal)`` for every method timed here."""
    from lib.flash import FlashAttentionTorch
    from lib.flash_triton import flash_attention_triton

    return {
        "triton": lambda q, k, v, causal: flash_attention_triton(
            q,
            k,
            v,
            causal=causal,
        ),
        "sdpa_flash": _sdpa("FLASH_ATTENTION"),
        "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
        "sdpa_math": _sdpa("MATH"),
        "flash_torch": lambda q, k, v, causal: FlashAttentionTorch.apply(
            q,
            k,
            v,
            q.shape[-1] ** -0.5,
            causal,
            1024,
            1024,
        ),
    }


def _qkv(batch, heads, seq_len, d_head, dtype, device, requires_grad):
    return [
        torch.randn(
            batch,
            heads,
            seq_len,
            d_head,
            dtype=dtype,
            device=device,
        ).requires_grad_(requires_grad)
        for _ in range(3)
    ]


# The largest absolute error allowed against the reference, per dtype: bf16 keeps 8 bits
# of mantissa, fp16 11; the gradients sum over a whole sequence, hence their own bound.
TOLERANCE = {
    torch.bfloat16: {"out": 2e-2, "grad": 1e-1},
    torch.float16: {"out": 4e-3, "grad": 2e-2},
    torch.float32: {"out": 1e-4, "grad": 1e-3},
}
# the methods a CPU runs (Triton's interpreter, and SDPA's unfused path)
CPU_METHODS = ("triton", "sdpa_math")


def _median_ms(step, repeats: int = 3) -> float:
    """Median wall-clock milliseconds of ``step()`` on a CPU (no CUDA events there)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def time_method(fn, q, k, v, causal: bool, backward: bool) -> float | None:
    """Milliseconds per call (median of triton.testing.do_bench on a GPU, of three
    wall-clock runs on a CPU); None if it fails."""
    grad_out = torch.randn_like(q)
    cuda = q.device.type == "cuda"

    def step():
        out = fn(q, k, v, causal)
        if backward:
            out.backward(grad_out)
            q.grad = k.grad = v.grad = None

    try:
        step()  # warm-up, autotuning, and a check that the backend takes the inputs
        if not cuda:
            return _median_ms(step)
        import triton

        torch.cuda.synchronize()
        return triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=[q, k, v])
    except (RuntimeError, torch.OutOfMemoryError) as error:
        message = str(error).splitlines()[0][:90]
        print(f"      (not run: {type(error).__name__}: {message})")
        return None
    finally:
        if cuda:
            torch.cuda.empty_cache()


def _outputs(fn, q, k, v, causal: bool, backward: bool, grad_out):
    """``fn``'s output and (with ``backward``) the gradients of q, k and v; raises
    what ``fn`` raises."""
    inputs = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]
    out = fn(*inputs, causal)
    grads = []
    if backward:
        out.backward(grad_out)
        grads = [t.grad for t in inputs]
    return out.detach(), grads


def max_errors(
    ours, references: dict, q, k, v, causal: bool, backward: bool
) -> tuple[dict | None, str]:
    """The largest absolute difference between ``ours`` and the first of
    ``references`` (name -> function) that runs these inputs: of the outputs, and with
    ``backward`` of the gradients of q, k and v (one random output gradient). Returns
    the errors (None when no reference ran) and the reference used, or why none was."""
    grad_out = torch.randn_like(q)
    try:
        out, grads = _outputs(ours, q, k, v, causal, backward, grad_out)
    except (RuntimeError, torch.OutOfMemoryError) as error:
        return None, f"ours failed: {type(error).__name__}: {str(error)[:80]}"
    for name, reference in references.items():
        try:
            want, want_grads = _outputs(reference, q, k, v, causal, backward, grad_out)
        except (RuntimeError, torch.OutOfMemoryError):
            continue  # e.g. no FlashAttention-2 kernel before Ampere: the next one
        errors = {"out": (out.float() - want.float()).abs().max().item()}
        for grad_name, got, expected in zip(("dq", "dk", "dv"), grads, want_grads):
            errors[grad_name] = (got.float() - expected.float()).abs().max().item()
        return errors, name
    return None, f"no reference ran ({', '.join(references)})"


def within_tolerance(errors: dict, dtype) -> bool:
    """Whether every error of :func:`max_errors` is inside :data:`TOLERANCE`."""
    bounds = TOLERANCE[dtype]
    return all(
        value <= bounds["out" if name == "out" else "grad"]
        for name, value in errors.items()
    )


def peak_memory(fn, seq_len: int, heads: int, d_head: int, dtype) -> int | None:
    """Peak bytes allocated by one forward+backward pass beyond q, k, v; None on OOM."""
    try:
        q, k, v = _qkv(1, heads, seq_len, d_head, dtype, "cuda", True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        fn(q, k, v, False).backward(torch.randn_like(q))
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - baseline
    except torch.OutOfMemoryError:
        return None
    finally:
        q = k = v = None
        torch.cuda.empty_cache()


def measure(
    methods: dict,
    shape: tuple,
    causal: bool,
    backward: bool,
    dtype,
    device: str = "cuda",
) -> list[dict]:
    """Time every method of METHODS on one shape ``(batch heads seq d)``; print them.

    Returns one row per method: the method, the pass ("fwd" or "fwd+bwd"), the sizes,
    milliseconds and TFLOP/s (None where the method could not run, or is not one a CPU
    has).
    """
    from lib.flash import attention_core_flops

    batch, heads, seq_len, d_head = shape
    pass_name = "fwd+bwd" if backward else "fwd"
    work = batch * heads * attention_core_flops(seq_len, seq_len, d_head, causal=causal)
    work = work * 7 / 2 if backward else work
    print(f"{pass_name:>8} d={d_head:<3} causal={causal!s:<5} n={seq_len:>5}:")
    rows = []
    for method in METHODS:
        ms = None
        if device == "cuda" or method in CPU_METHODS:
            q, k, v = _qkv(batch, heads, seq_len, d_head, dtype, device, backward)
            ms = time_method(methods[method], q, k, v, causal, backward)
        tflops = None if ms is None else work / (ms * 1e-3) / 1e12
        rows.append(
            {
                "method": method,
                "pass": pass_name,
                "d_head": d_head,
                "causal": causal,
                "seq_len": seq_len,
                "ms": ms,
                "tflops": tflops,
            },
        )
    ours = rows[0]["ms"]
    for row in rows:
        if row["ms"] is None:
            print(f"      {row['method']:>11}:      -")
            continue
        line = f"      {row['method']:>11}: {row['ms']:9.3f} ms"
        line += f" {row['tflops']:7.1f} TFLOP/s"
        if ours is not None and row["method"] != "triton":
            line += f"   ours is {row['ms'] / ours:5.2f}x as fast"
        print(line)
    return rows


def plot_speed(speed: list[dict]):
    """One panel per (head dim, causal): TFLOP/s against length, forward (solid) and
    forward+backward (dashed), one colour per method. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(row["d_head"], row["causal"]) for row in speed})
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(4 * len(panels), 3.4),
        squeeze=False,
    )
    colours = dict(zip(METHODS, ("C3", "C0", "C2", "C7")))
    for ax, (d_head, causal) in zip(axes[0], panels):
        for method in METHODS:
            for pass_name, style in (("fwd", "-"), ("fwd+bwd", "--")):
                rows = [
                    r
                    for r in speed
                    if (r["d_head"], r["causal"], r["method"], r["pass"])
                    == (d_head, causal, method, pass_name)
                    and r["tflops"] is not None
                ]
                if rows:
                    ax.plot(
                        [r["seq_len"] for r in rows],
                        [r["tflops"] for r in rows],
                        style,
                        marker="o",
                        color=colours[method],
                        label=f"{method} {pass_name}",
                    )
        ax.set_xscale("log", base=2)
        ax.set(
            xlabel="sequence length",
            ylabel="TFLOP/s",
            title=f"d={d_head}, causal={causal}",
        )
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_memory(memory: list[dict]):
    """Peak memory of a forward+backward pass against length, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for method in MEMORY_METHODS:
        rows = [r for r in memory if r["method"] == method]
        rows = [r for r in rows if r["peak_bytes"] is not None]
        if rows:
            ax.loglog(
                [r["seq_len"] for r in rows],
                [r["peak_bytes"] / 2**30 for r in rows],
                "o-",
                label=method,
            )
    ax.set_xscale("log", base=2)
    ax.set(xlabel="sequence length", ylabel="peak GiB (forward+backward)")
    if ax.lines:  # none on a CPU, which measures no GPU memory
        ax.legend()
    fig.tight_layout()
    return fig


def write_results(
    out, command, wall, summary, config, speed, memory, device, correctness=()
):
    """``out/metrics.json`` in ``lib.utils.write_record``'s schema (the ratios per pass
    as ``metrics``, every measurement and the check at each size under ``extra``),
    ``speed.png`` and ``memory.png``. Returns the path of ``metrics.json``."""
    path = write_record(
        out,
        name=Path(out).name,
        command=command,
        wall_seconds=wall,
        metrics=summary,  # per pass: ours / sdpa_flash, min, max and the target
        config=config,
        extra=dict(speed=speed, memory=memory, correctness=list(correctness)),
        device=device,
    )
    plot_speed(speed).savefig(Path(out) / "speed.png", dpi=150)
    plot_memory(memory).savefig(Path(out) / "memory.png", dpi=150)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[1024, 2048, 4096, 8192, 16384],
    )
    parser.add_argument(
        "--memory-lengths",
        type=int,
        nargs="+",
        default=[1024, 4096, 16384, 32768],
    )
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write metrics.json and plots",
    )
    args = parser.parse_args(argv)

    from lib.flash_triton import TRITON_INTERPRETED

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not TRITON_INTERPRETED:
        print(
            "bench_flash.py needs a CUDA GPU: it compares Triton kernels with the GPU "
            "backends of scaled_dot_product_attention. No GPU here, so nothing was "
            "measured (skipped). With TRITON_INTERPRET=1 it checks itself on the CPU "
            "at tiny sizes (--lengths 64 --memory-lengths 64 --head-dims 16).",
        )
        return 0

    import triton

    if TRITON_INTERPRETED:
        print(
            "note: TRITON_INTERPRET=1 is set, so the kernels run in the interpreter",
        )
    started = time.perf_counter()
    torch.manual_seed(0)
    if device == "cuda":
        gpu = torch.cuda.get_device_name()
        precision = get_precision("cuda")  # bf16 from compute capability 8.0, else fp16
        dtype = torch.float16 if precision.dtype == torch.float32 else precision.dtype
    else:  # the interpreter computes in NumPy, which has no bfloat16
        gpu, dtype = "CPU (Triton's interpreter: no speed measured)", torch.float32
    dtype_name = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[
        dtype
    ]
    methods = attention_methods()
    print(
        f"{gpu}, torch {torch.__version__}, triton {triton.__version__}, {dtype_name}, "
        f"batch {args.batch} x {args.heads} heads",
    )
    if dtype == torch.float16:
        print("note: no bf16 tensor cores on this GPU (compute capability < 8.0): fp16")

    # Correctness at every size: ours against the reference, outputs and gradients.
    # the reference: SDPA's flash backend, else (no kernel for this GPU, or a CPU)
    # its math path
    references = ("sdpa_flash", "sdpa_math") if device == "cuda" else ("sdpa_math",)
    correctness = []
    speed = []
    for d_head in args.head_dims:
        for causal in (False, True):
            for seq_len in args.lengths:
                shape = (args.batch, args.heads, seq_len, d_head)
                q, k, v = _qkv(*shape, dtype, device, False)
                errors, reference = max_errors(
                    methods["triton"],
                    {name: methods[name] for name in references},
                    q, k, v, causal, True,
                )  # fmt: skip
                q = k = v = None
                # None: not checked (no reference could run; ours failing is OFF)
                ok = None if errors is None else within_tolerance(errors, dtype)
                if errors is None and reference.startswith("ours failed"):
                    ok = False
                correctness.append(
                    dict(d_head=d_head, causal=causal, seq_len=seq_len,
                         reference=reference, max_abs_error=errors, ok=ok)
                )  # fmt: skip
                shown_errors = (
                    reference
                    if errors is None
                    else f"against {reference}: "
                    + ", ".join(f"{n} {e:.1e}" for n, e in errors.items())
                )
                verdict = {True: "ok", False: "OFF", None: "not checked"}[ok]
                print(
                    f"check d={d_head} causal={causal!s:<5} n={seq_len:>5} "
                    f"{shown_errors} -> {verdict}"
                )
                for backward in (False, True):
                    speed += measure(methods, shape, causal, backward, dtype, device)

    memory = []
    if device == "cuda":
        print("peak memory of one forward+backward pass, 1 sequence x 32 heads, d 64:")
    for seq_len in args.memory_lengths if device == "cuda" else []:
        for method in MEMORY_METHODS:
            peak = peak_memory(methods[method], seq_len, 32, 64, dtype)
            memory.append(dict(method=method, seq_len=seq_len, peak_bytes=peak))
            shown = "out of memory" if peak is None else f"{peak / 2**30:8.2f} GiB"
            print(f"  n={seq_len:>6} {method:>12}: {shown}")

    summary = {}
    for pass_name, target in TARGETS.items():
        ratios = []
        for row in speed:
            ours = (row["method"], row["pass"]) == ("triton", pass_name)
            if not ours or row["ms"] is None:
                continue
            match = [
                r
                for r in speed
                if r["method"] == "sdpa_flash"
                and r["ms"] is not None
                and (r["pass"], r["d_head"], r["causal"], r["seq_len"])
                == (pass_name, row["d_head"], row["causal"], row["seq_len"])
            ]
            if match:
                ratios.append(match[0]["ms"] / row["ms"])
        if ratios:
            summary[pass_name] = dict(min=min(ratios), max=max(ratios), target=target)
            print(
                f"{pass_name}: ours / sdpa_flash between {min(ratios):.2f}x and "
                f"{max(ratios):.2f}x (target >= {target}x)",
            )

    wrong = [c for c in correctness if c["ok"] is False]
    unchecked = [c for c in correctness if c["ok"] is None]
    print(
        f"checked {len(correctness) - len(unchecked)} of {len(correctness)} sizes: "
        + (f"{len(wrong)} OFF beyond tolerance" if wrong else "all within tolerance")
    )
    wall = time.perf_counter() - started
    print(f"wall time {wall:.0f} s")
    if args.out is not None:
        command = [
            "python bench/bench_flash.py",
            *(sys.argv[1:] if argv is None else argv),
        ]
        config = dict(
            dtype=str(dtype).removeprefix("torch."),
            tolerance=TOLERANCE[dtype],
            batch=args.batch,
            heads=args.heads,
            lengths=args.lengths,
            head_dims=args.head_dims,
            memory_lengths=args.memory_lengths,
        )
        write_results(
            args.out,
            " ".join(command),
            wall,
            summary,
            config,
            speed,
            memory,
            device,
            correctness,
        )
        print(f"wrote {args.out}/metrics.json, speed.png and memory.png")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
