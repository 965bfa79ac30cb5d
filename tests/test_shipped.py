"""lib.shipped: the shipped models' sizes and the measures that re-check a shipped file."""

from __future__ import annotations

import pytest
import torch

from lib.models import GPT, TransformerConfig
from lib.runs import char_gpt_val_loss, run_sizes
from lib.shipped import SHIPPED_SIZES, char_gpt_held_out, linear_pixels_accuracy

# one torch thread for every test here (conftest.py says why)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_shipped_sizes_are_sizes_of_the_recipes():
    for run, sizes in SHIPPED_SIZES.items():
        full = run_sizes(run, "smoke", **sizes)  # unknown keys would raise
        assert all(full[key] == value for key, value in sizes.items())
    with pytest.raises(ValueError, match="no size"):
        run_sizes("bert", "smoke", **SHIPPED_SIZES["bert"], batchsize=3)


def test_char_gpt_held_out_is_the_val_loss_with_its_interval():
    torch.manual_seed(0)
    cfg = TransformerConfig(
        vocab_size=65, d_model=16, n_heads=2, n_layers=1, max_len=64
    )
    model = GPT(cfg)
    sizes = dict(seq_len=64, batch_size=64)
    found = char_gpt_held_out(model, sizes)
    # every window has seq_len characters: the mean of the windows' means is the mean
    assert found["val_loss"] == pytest.approx(char_gpt_val_loss(model, sizes), rel=1e-5)
    assert found["val_loss_low"] < found["val_loss"] < found["val_loss_high"]
    assert found["windows"] == (111_540 - 1) // 64


def test_a_linear_model_on_pixels_separates_what_a_line_separates():
    generator = torch.Generator().manual_seed(0)
    # two classes of 8x8 "images": bright on the left half, or on the right
    left = torch.rand(60, 1, 8, 8, generator=generator) * 0.2
    right = left.clone()
    left[..., :4] += 0.8
    right[..., 4:] += 0.8
    x, y = torch.cat([left, right]), torch.tensor([0] * 60 + [1] * 60)
    assert linear_pixels_accuracy(x[::2], y[::2], x[1::2], y[1::2]) == 1.0
    # labels that have nothing to do with the pixels: about chance
    shuffled = y[torch.randperm(len(y), generator=generator)]
    assert linear_pixels_accuracy(x[::2], shuffled[::2], x[1::2], shuffled[1::2]) < 0.8
