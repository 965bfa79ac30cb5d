"""lib.utils.get_precision and TFS_PRECISION: the choice on each kind of hardware, each
forced value, and the loss scaler that lib.training.train builds for fp16.

A CUDA GPU is simulated: ``get_precision`` reads only the device's type and
``torch.cuda.is_bf16_supported``, which the tests replace; CUDA's initialisation is
replaced by a failure, so that a test that reached a real GPU would fail, here and on a
machine that has one."""

from __future__ import annotations

import warnings
from typing import ClassVar

import pytest
import torch

from lib import utils
from lib.utils import PRECISION_ENV, PRECISIONS, Precision, get_precision

CUDA, CPU, MPS = torch.device("cuda"), torch.device("cpu"), torch.device("mps")
FP16_SCALED = Precision(torch.float16, use_grad_scaler=True)
BF16 = Precision(torch.bfloat16, use_grad_scaler=False)
FP32 = Precision(torch.float32, use_grad_scaler=False)


@pytest.fixture
def gpu(monkeypatch):
    """A simulated CUDA GPU: ``gpu(bf16=True)`` an Ampere or newer one (an H100),
    ``gpu(bf16=False)`` an older one (Colab's T4). TFS_PRECISION starts unset."""
    monkeypatch.delenv(PRECISION_ENV, raising=False)

    def never(*args, **kwargs):  # what any real CUDA call goes through first
        pytest.fail("get_precision initialised CUDA: it must read the device type only")

    monkeypatch.setattr(torch.cuda, "_lazy_init", never)

    def simulate(bf16: bool, name: str = "Tesla T4") -> None:
        def is_bf16_supported(including_emulation: bool = True) -> bool:
            # the T4 emulates bf16 slowly: get_precision must not count emulation
            assert including_emulation is False, "emulated bf16 counted as support"
            return bf16

        monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    return simulate


def _quietly(device: torch.device) -> Precision:
    """``get_precision(device)``, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return get_precision(device)


def test_auto_follows_the_hardware(gpu, monkeypatch):
    gpu(bf16=True)
    assert _quietly(CUDA) == BF16
    gpu(bf16=False)
    assert _quietly(CUDA) == FP16_SCALED
    assert _quietly(CPU) == FP32 and _quietly(MPS) == FP32
    # "auto" and an empty value are the default, spelled out
    for value in ("auto", " AUTO ", ""):
        monkeypatch.setenv(PRECISION_ENV, value)
        assert utils.precision_setting() == "auto"
        assert _quietly(CUDA) == FP16_SCALED


# (TFS_PRECISION, the GPU has bf16) -> the precision on that GPU
FORCED_ON_A_GPU = {
    ("fp16", True): FP16_SCALED,  # an H100 runs what a T4 must run
    ("fp16", False): FP16_SCALED,
    ("bf16", True): BF16,
    ("fp32", True): FP32,
    ("fp32", False): FP32,
}


@pytest.mark.parametrize(("value", "has_bf16"), list(FORCED_ON_A_GPU))
def test_a_forced_precision_on_a_gpu(gpu, monkeypatch, value, has_bf16):
    gpu(bf16=has_bf16)
    monkeypatch.setenv(PRECISION_ENV, value.upper())  # read as get_profile reads
    assert utils.precision_setting() == value
    precision = _quietly(CUDA)
    assert precision == FORCED_ON_A_GPU[value, has_bf16]
    assert precision.name == value
    assert precision == PRECISIONS[value]  # the table autocast reads names from


def test_bf16_on_a_gpu_without_it_names_the_gpu_and_suggests_fp16(gpu, monkeypatch):
    gpu(bf16=False, name="Tesla T4")
    monkeypatch.setenv(PRECISION_ENV, "bf16")
    with pytest.raises(RuntimeError) as raised:
        get_precision(CUDA)
    message = str(raised.value)
    assert "TFS_PRECISION=bf16, but Tesla T4 has no bfloat16 support" in message
    assert "use TFS_PRECISION=fp16" in message


@pytest.mark.parametrize("value", ["fp16", "bf16"])
@pytest.mark.parametrize("device", [CPU, MPS], ids=["cpu", "mps"])
def test_a_cpu_keeps_fp32_and_says_why(gpu, monkeypatch, value, device):
    gpu(bf16=True)  # a GPU beside it changes nothing for the CPU's tensors
    monkeypatch.setenv(PRECISION_ENV, value)
    with pytest.warns(UserWarning, match=f"TFS_PRECISION={value} applies to CUDA"):
        precision = get_precision(device)
    assert precision == FP32
    monkeypatch.setenv(PRECISION_ENV, "fp32")
    assert _quietly(device) == FP32  # asked for: no warning


@pytest.mark.parametrize("device", [CUDA, CPU], ids=["cuda", "cpu"])
def test_an_unknown_value_names_the_variable_the_value_and_the_choices(
    gpu, monkeypatch, device
):
    gpu(bf16=True)
    monkeypatch.setenv(PRECISION_ENV, "half")
    allowed = "use 'auto' .*, 'bf16', 'fp16' .* or 'fp32'"
    with pytest.raises(ValueError, match=f"TFS_PRECISION='half' is not a precision; {allowed}"):  # fmt: skip
        get_precision(device)
    with pytest.raises(ValueError, match="TFS_PRECISION='half'"):
        utils.precision_setting()


# --- what lib.training.train does with the precision ------------------------------------


class RecordingScaler(torch.amp.GradScaler):
    """A ``torch.amp.GradScaler`` that notes each of its methods ``train`` calls."""

    made: ClassVar[list[RecordingScaler]] = []

    def __init__(self, device: str = "cuda", *args, **kwargs):
        super().__init__(device, *args, **kwargs)
        self.device_type, self.calls = device, []
        RecordingScaler.made.append(self)

    def scale(self, outputs):
        self.calls.append("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.calls.append("unscale_")
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.calls.append("step")
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        self.calls.append("update")
        return super().update(new_scale)


def _train_two_steps(monkeypatch, precision: Precision | None):
    """A tiny GPT trained two steps on the CPU with ``precision`` (None: train's
    default); returns the scalers train made, its losses, and whether weights moved."""
    from lib.batches import lm_batches
    from lib.models import GPT, TransformerConfig
    from lib.training import make_optimizer, train

    RecordingScaler.made = []
    monkeypatch.setattr(torch.amp, "GradScaler", RecordingScaler)
    torch.manual_seed(0)
    config = TransformerConfig(
        vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=8
    )
    model = GPT(config)
    before = [p.detach().clone() for p in model.parameters()]
    stream = torch.randint(0, 20, (500,), generator=torch.Generator().manual_seed(0))
    batches = lm_batches(stream, batch_size=4, seq_len=8, seed=0)
    optimizer = make_optimizer(model, 1e-2)
    history = train(model, batches, optimizer=optimizer, n_steps=2, precision=precision)
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return RecordingScaler.made, history.losses, moved


def test_train_builds_and_uses_a_grad_scaler_for_fp16_on_the_cpu(
    monkeypatch, one_torch_thread
):
    # float16 autocast on a CPU (torch >= 2.3) with the CPU's GradScaler: the path a
    # T4 takes, run without one
    scalers, losses, moved = _train_two_steps(monkeypatch, PRECISIONS["fp16"])
    (scaler,) = scalers
    assert scaler.device_type == "cpu" and scaler.is_enabled()
    assert scaler.calls == ["scale", "unscale_", "step", "update"] * 2
    assert scaler.get_scale() == 2.0**16  # no overflow: the initial scale kept
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert moved  # scaler.step applied the unscaled gradients


def test_train_takes_the_forced_choice_when_given_no_precision(
    monkeypatch, one_torch_thread
):
    # no scaler for fp32; and on a CPU a forced fp16 falls back to fp32, with a
    # warning, through train's own call of get_precision
    scalers, _, moved = _train_two_steps(monkeypatch, PRECISIONS["fp32"])
    assert scalers == [] and moved
    monkeypatch.setenv(PRECISION_ENV, "fp16")
    with pytest.warns(UserWarning, match="TFS_PRECISION=fp16 applies to CUDA"):
        scalers, _, moved = _train_two_steps(monkeypatch, None)
    assert scalers == [] and moved
