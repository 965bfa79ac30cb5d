"""The checkers of chapter 10 accept the reference answers and diagnose typical mistakes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from lib.exercises._common import ExerciseError
from lib.exercises.vit import (
    check_conv_stem,
    check_interpolate_positions,
    check_pool_tokens,
)


# -- Exercise 1 ---------------------------------------------------------------------------------
def _interpolate(
    pos, old_grid, new_grid, *, mode="bicubic", align=False, cls="keep", **bugs
):
    (h, w), (new_h, new_w) = old_grid, new_grid
    head, grid = pos[:, :1], pos[:, 1:]
    if bugs.get("reshape"):
        grid = grid.reshape(1, pos.shape[-1], h, w)
    elif bugs.get("read_transposed"):
        grid = rearrange(grid, "1 (w h) d -> 1 d h w", h=h, w=w)
    else:
        grid = rearrange(grid, "1 (h w) d -> 1 d h w", h=h, w=w)
    size = (new_w, new_h) if bugs.get("size_swapped") else (new_h, new_w)
    kwargs = {} if mode == "nearest" else {"align_corners": align}
    grid = F.interpolate(grid, size=size, mode=mode, **kwargs)
    if bugs.get("reshape"):
        grid = grid.reshape(1, new_h * new_w, pos.shape[-1])
    elif bugs.get("write_transposed"):
        grid = rearrange(grid, "1 d h w -> 1 (w h) d")
    else:
        grid = rearrange(grid, "1 d h w -> 1 (h w) d")
    if cls == "drop":
        return grid
    if cls == "scaled":
        head = head * 2
    return torch.cat([head, grid], dim=1)


def test_interpolate_positions_accepts_the_reference():
    assert check_interpolate_positions(_interpolate)


def test_interpolate_positions_reports_not_attempted():
    def stub(pos, old_grid, new_grid):
        raise NotImplementedError

    assert check_interpolate_positions(stub) is None


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (dict(cls="drop"), "class token's row is missing"),
        (dict(cls="scaled"), "class token's row changed"),
        (dict(read_transposed=True), "read into the grid column by column"),
        (dict(write_transposed=True), "written out column by column"),
        (dict(size_swapped=True), "height and width of the new grid are swapped"),
        (dict(reshape=True), "plain reshape"),
        (dict(mode="bilinear"), "bilinear interpolation; use mode='bicubic'"),
        (dict(mode="nearest"), "nearest-neighbour"),
        (dict(align=True), "align_corners=True"),
    ],
)
def test_interpolate_positions_diagnoses_mistakes(options, match):
    wrong = lambda pos, old_grid, new_grid: _interpolate(
        pos, old_grid, new_grid, **options
    )
    with pytest.raises(ExerciseError, match=match):
        check_interpolate_positions(wrong)


def test_interpolate_positions_catches_in_place_edits_and_other_errors():
    def edits(pos, old_grid, new_grid):
        pos[:, 0] = 0.0
        return _interpolate(pos, old_grid, new_grid)

    with pytest.raises(ExerciseError, match="modified its input"):
        check_interpolate_positions(edits)

    noisy = lambda pos, o, n: (
        _interpolate(pos, o, n)
        + 0.1 * (torch.arange(1 + n[0] * n[1]) > 0)[None, :, None]
    )
    with pytest.raises(ExerciseError, match="differs from the reference"):
        check_interpolate_positions(noisy)


# -- Exercise 2 ---------------------------------------------------------------------------------
def _pool(features, how):
    if how not in ("cls", "mean"):
        raise ValueError(f"how must be 'cls' or 'mean', got {how!r}")
    return features[:, 0] if how == "cls" else features[:, 1:].mean(1)


def test_pool_tokens_accepts_the_reference():
    assert check_pool_tokens(_pool)


def test_pool_tokens_reports_not_attempted(capsys):
    def stub(features, how):
        raise NotImplementedError

    assert check_pool_tokens(stub) is None
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda f, how: f[:, -1] if how == "cls" else _pool(f, how), "not the last"),
        (lambda f, how: f.mean(1) if how == "mean" else _pool(f, how), "includes the"),
        (lambda f, how: f[:, 1:].amax(1) if how == "mean" else _pool(f, how), "max-"),
        (lambda f, how: f[:, 1:].sum(1) if how == "mean" else _pool(f, how), "sum"),
        (lambda f, how: f.mean(-1) if how == "mean" else _pool(f, how), "axis 1"),
        (lambda f, how: _pool(f, how) + 0.1, "differs from the reference"),
    ],
)
def test_pool_tokens_diagnoses_mistakes(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check_pool_tokens(wrong)


def test_pool_tokens_wants_a_value_error_for_another_pooling():
    def lenient(features, how):
        return features[:, 0] if how == "cls" else features[:, 1:].mean(1)

    with pytest.raises(ExerciseError, match="was accepted"):
        check_pool_tokens(lenient)

    def wrong_type(features, how):
        if how not in ("cls", "mean"):
            raise KeyError(how)
        return lenient(features, how)

    with pytest.raises(ExerciseError, match="raised KeyError"):
        check_pool_tokens(wrong_type)

    def in_place(features, how):
        features[:, 0] = 0
        return _pool(features, how)

    with pytest.raises(ExerciseError, match="in place"):
        check_pool_tokens(in_place)


# -- Exercise 3 ---------------------------------------------------------------------------------
class _Stem(nn.Module):
    def __init__(
        self, in_channels, d_model, patch_size, *, relu=True, order="(h w)", extra=0
    ):
        super().__init__()
        layers, channels = [], in_channels
        for _ in range(patch_size.bit_length() - 1 + extra):
            layers.append(nn.Conv2d(channels, 16, 3, stride=2, padding=1))
            if relu:
                layers.append(nn.ReLU())
            channels = 16
        layers.append(nn.Conv2d(channels, d_model, 1))
        self.net, self.order = nn.Sequential(*layers), order

    def forward(self, images):
        out = self.net(images)
        if self.order == "map":
            return out
        if self.order == "features first":
            return rearrange(out, "b d h w -> b d (h w)")
        return rearrange(out, f"b d h w -> b {self.order} d")


class _PatchConv(nn.Module):
    """The plain patch embedding: one p×p convolution with stride p (no overlap), and ReLU."""

    def __init__(self, in_channels, d_model, patch_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, d_model, patch_size, stride=patch_size)
        self.out = nn.Conv2d(d_model, d_model, 1)

    def forward(self, images):
        return rearrange(
            self.out(torch.relu(self.conv(images))), "b d h w -> b (h w) d"
        )


def test_conv_stem_accepts_the_reference():
    assert check_conv_stem(lambda c, d, p: _Stem(c, d, p))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda c, d, p: _Stem(c, d, p, order="map"), "feature map"),
        (
            lambda c, d, p: _Stem(c, d, p, order="features first"),
            "features before tokens",
        ),
        (lambda c, d, p: _Stem(c, d, p, order="(w h)"), "column-major"),
        (lambda c, d, p: _Stem(c, d, p, extra=1), r"shrinks the image 8×, not 4×"),
        (lambda c, d, p: _Stem(c, d, p, relu=False), "is affine"),
        (lambda c, d, p: _PatchConv(c, d, p), "do not overlap"),
        (lambda c, d, p: nn.Conv2d, "should return an nn.Module"),
    ],
)
def test_conv_stem_diagnoses_mistakes(make, match):
    with pytest.raises(ExerciseError, match=match):
        check_conv_stem(make)


# -- Exercise 2b: a linear probe ----------------------------------------------------------


def _probe(train_x, train_y, val_x, val_y, steps=300, fit_on_validation=False):
    torch.manual_seed(0)
    if fit_on_validation:
        train_x, train_y = val_x, val_y
    probe = nn.Linear(train_x.shape[-1], int(train_y.max()) + 1)
    optimizer = torch.optim.Adam(probe.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = nn.functional.cross_entropy(probe(train_x), train_y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return (probe(val_x).argmax(-1) == val_y).float().mean().item()


def test_train_probe_accepts_the_reference_and_reports_a_stub(capsys):
    from lib.exercises.vit import check_train_probe

    assert check_train_probe(_probe)

    def stub(*args):
        raise NotImplementedError

    assert check_train_probe(stub) is None
    assert "Exercise 2b" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (lambda *a: _probe(*a, fit_on_validation=True), "saw the validation labels"),
        (lambda *a: _probe(*a, steps=0), "a linear classifier separates these blobs"),
        (lambda *a: torch.tensor([_probe(*a)] * 2), "return the validation accuracy"),
        (lambda *a: 100 * _probe(*a), "a float in \\[0, 1\\]"),
    ],
    ids=["peeks", "untrained", "tensor", "percent"],
)
def test_train_probe_diagnoses_mistakes(wrong, match):
    from lib.exercises._common import ExerciseError
    from lib.exercises.vit import check_train_probe

    with pytest.raises(ExerciseError, match=match):
        check_train_probe(wrong)
