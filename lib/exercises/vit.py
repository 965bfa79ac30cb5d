"""Checkers for the exercises of chapter 10 (the Vision Transformer).

Each checker runs the reader's function on random inputs, compares it with a reference, and
names the typical mistake when it recognises one: a class-token row interpolated with the
grid or dropped, rows and columns of the grid swapped, a ``reshape`` that mixes features
into the grid, the wrong interpolation mode; a pooled token taken from the wrong end, a
mean that includes the class token, max- or sum-pooling; a convolutional stem with the
wrong stride, tokens left as a feature map or in column-major order, patches that do not
overlap, or no nonlinearity.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from lib.exercises._common import (
    ExerciseError,
    call_without_mutation,
    checker,
    expect_close,
    expect_tensor,
    is_close,
)

__all__ = [
    "check_interpolate_positions",
    "check_pool_tokens",
    "check_train_probe",
    "check_conv_stem",
]


# -- Exercise 1: position embeddings for a larger image ----------------------------------------
def _interpolate_positions(
    pos: torch.Tensor,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    *,
    mode: str = "bicubic",
    align_corners: bool | None = False,
    read_transposed: bool = False,
    write_transposed: bool = False,
    size_swapped: bool = False,
    plain_reshape: bool = False,
) -> torch.Tensor:
    """The right answer, or (with the keyword arguments) a typical wrong one."""
    (h, w), (new_h, new_w) = old_grid, new_grid
    cls, grid = pos[:, :1], pos[:, 1:]
    d = pos.shape[-1]
    if plain_reshape:
        grid = grid.reshape(1, d, h, w)
    elif read_transposed:
        grid = rearrange(grid, "1 (w h) d -> 1 d h w", h=h, w=w)
    else:
        grid = rearrange(grid, "1 (h w) d -> 1 d h w", h=h, w=w)
    size = (new_w, new_h) if size_swapped else (new_h, new_w)
    kwargs = {} if align_corners is None else {"align_corners": align_corners}
    grid = F.interpolate(grid, size=size, mode=mode, **kwargs)
    if plain_reshape:
        grid = grid.reshape(1, new_h * new_w, d)
    elif write_transposed:
        grid = rearrange(grid, "1 d h w -> 1 (w h) d")
    else:
        grid = rearrange(grid, "1 d h w -> 1 (h w) d")
    return torch.cat([cls, grid], dim=1)


@checker("Exercise 1: position embeddings for a larger image")
def check_interpolate_positions(interpolate: Callable[..., torch.Tensor]) -> None:
    """``interpolate(pos, old_grid, new_grid)``: ``pos`` ``(1, 1 + h·w, d_model)`` with the
    class row first -> ``(1, 1 + H·W, d_model)``, patch rows resized bicubically."""
    gen = torch.Generator().manual_seed(0)
    d_model = 6
    for old_grid, new_grid in [((2, 3), (4, 5)), ((4, 4), (6, 6)), ((3, 2), (3, 2))]:
        (h, w), (new_h, new_w) = old_grid, new_grid
        pos = torch.randn(1, 1 + h * w, d_model, generator=gen)
        what = f"interpolate_positions(pos, {old_grid}, {new_grid})"
        got = call_without_mutation(interpolate, pos, old_grid, new_grid)
        want = _interpolate_positions(pos, old_grid, new_grid)
        if isinstance(got, torch.Tensor) and tuple(got.shape) == (
            1,
            new_h * new_w,
            d_model,
        ):
            raise ExerciseError(
                f"{what} has shape {tuple(got.shape)}: the class token's row is missing. "
                "Split it off (pos[:, :1]), resize the patch rows, and put it back in front"
            )
        expect_tensor(got, tuple(want.shape), what)
        if not torch.allclose(got[:, 0].double(), pos[:, 0].double(), atol=1e-6):
            raise ExerciseError(
                f"{what}: the class token's row changed. It has no place on the grid: keep "
                "row 0 as it is and interpolate only rows 1..h·w"
            )
        if is_close(got, want):
            continue
        mistakes = [
            (
                dict(read_transposed=True),
                "the patch rows were read into the grid column by column; they are in "
                "row-major order: rearrange(grid, '1 (h w) d -> 1 d h w', h=h, w=w)",
            ),
            (
                dict(write_transposed=True),
                "the resized grid was written out column by column; flatten it row by row: "
                "'1 d h w -> 1 (h w) d'",
            ),
            (
                dict(size_swapped=True),
                "height and width of the new grid are swapped: size=(H, W), with new_grid = (H, W)",
            ),
            (
                dict(plain_reshape=True),
                "a plain reshape turned (h w) d into d h w, which mixes features into the "
                "grid; move the feature axis with rearrange (or permute), not reshape",
            ),
            (
                dict(mode="bilinear"),
                "this is bilinear interpolation; use mode='bicubic' (align_corners=False)",
            ),
            (
                dict(mode="nearest", align_corners=None),
                "this is nearest-neighbour interpolation; use mode='bicubic' (align_corners=False)",
            ),
            (
                dict(align_corners=True),
                "align_corners=True stretches the grid corner to corner; use "
                "align_corners=False, which treats each position as a cell centre",
            ),
        ]
        for options, message in mistakes:
            if is_close(
                got, _interpolate_positions(pos, old_grid, new_grid, **options)
            ):
                raise ExerciseError(f"{what}: {message}")
        if old_grid == new_grid:
            raise ExerciseError(
                f"{what}: the grid did not change size, so the table must come back "
                "unchanged (bicubic interpolation to the same size is the identity)"
            )
        expect_close(got, want, what)


# -- Exercise 2: a mean-pooling head ------------------------------------------------------------
def _pool_tokens(features: torch.Tensor, how: str, *, bug: str = "") -> torch.Tensor:
    """The right answer, or (with ``bug``) a typical wrong one."""
    if how == "cls":
        return features[:, -1] if bug == "last" else features[:, 0]
    if bug == "with_cls":
        return features.mean(1)
    if bug == "max":
        return features[:, 1:].amax(1)
    if bug == "sum":
        return features[:, 1:].sum(1)
    return features[:, 1:].mean(1)


@checker("Exercise 2: a mean-pooling head")
def check_pool_tokens(pool_tokens: Callable[..., torch.Tensor]) -> None:
    """``pool_tokens(features, how)``: ``(batch tokens d_model)``, the class token first
    -> ``(batch d_model)``: the class token's state (``how="cls"``) or the mean of the
    patch tokens' states (``how="mean"``); another ``how`` is a ValueError."""
    gen = torch.Generator().manual_seed(0)
    for batch, tokens, d_model in [(3, 5, 4), (2, 17, 6)]:
        features = torch.randn(batch, tokens, d_model, generator=gen)
        for how in ("cls", "mean"):
            what = f"pool_tokens(features of shape {(batch, tokens, d_model)}, {how!r})"
            got = call_without_mutation(pool_tokens, features, how)
            want = _pool_tokens(features, how)
            if isinstance(got, torch.Tensor) and tuple(got.shape) == (batch, tokens):
                raise ExerciseError(
                    f"{what} has shape {tuple(got.shape)}: it averaged the features of "
                    "each token; average over the tokens (axis 1) instead"
                )
            expect_tensor(got, tuple(want.shape), what)
            if is_close(got, want):
                continue
            mistakes = [
                ("last", "the class token is the first token (index 0), not the last"),
                (
                    "with_cls",
                    "the mean includes the class token; average the patch tokens only "
                    "(features[:, 1:])",
                ),
                ("max", "this is max-pooling; take the mean of the patch tokens"),
                ("sum", "this is the sum of the patch tokens; divide by their number"),
            ]
            for bug, message in mistakes:
                if is_close(got, _pool_tokens(features, how, bug=bug)):
                    raise ExerciseError(f"{what}: {message}")
            expect_close(got, want, what)
    try:
        pool_tokens(torch.zeros(1, 3, 2), "max")
    except ValueError:
        pass
    except NotImplementedError:
        raise
    except Exception as err:
        raise ExerciseError(
            f"pool_tokens(features, 'max') raised {type(err).__name__}; raise a ValueError "
            "that names the choices ('cls' or 'mean')"
        ) from None
    else:
        raise ExerciseError(
            "pool_tokens(features, 'max') was accepted; raise a ValueError that names the "
            "choices ('cls' or 'mean')"
        )


def _probe_data(gen: torch.Generator, separable: bool):
    """Three classes, 240 examples to train and 120 to validate: 8-dimensional blobs
    around three far-apart centres (``separable``), or 64-dimensional noise with random
    labels (enough dimensions for a linear probe to memorise any 120 labels)."""
    d = 8 if separable else 64
    labels = torch.randint(0, 3, (360,), generator=gen)
    features = torch.randn(360, d, generator=gen)
    if separable:
        features = features + 4 * torch.randn(3, d, generator=gen)[labels]
    return features[:240], labels[:240], features[240:], labels[240:]


@checker("Exercise 2b: a linear probe")
def check_train_probe(train_probe: Callable[..., float]) -> None:
    """``train_probe(train_features, train_labels, val_features, val_labels)``: train a
    linear classifier on ``(n d)`` frozen features and return its accuracy on the
    validation set, a float in [0, 1]. Checked on separable blobs (it must find them:
    at least 90 %) and on noise with random labels (it must not reach what only
    training on the validation set would give: at most 60 % of 3 classes)."""
    gen = torch.Generator().manual_seed(0)
    for separable in (True, False):
        data = _probe_data(gen, separable)
        what = "train_probe on " + ("separable blobs" if separable else "random labels")
        got = call_without_mutation(train_probe, *data)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if (
            not isinstance(got, float | int)
            or isinstance(got, bool)
            or not 0 <= got <= 1
        ):
            raise ExerciseError(
                f"{what} returned {got!r}: return the validation accuracy, a float in "
                "[0, 1] (e.g. (guesses == val_labels).float().mean().item())"
            )
        if separable and got < 0.9:
            raise ExerciseError(
                f"{what}: validation accuracy {got:.1%}, but a linear classifier "
                "separates these blobs (>= 90 %). Train nn.Linear(d, n_classes) with "
                "cross-entropy for a few hundred full-batch Adam steps (lr about 1e-2), "
                "then take the argmax of its logits on the validation features"
            )
        if not separable and got > 0.6:
            raise ExerciseError(
                f"{what}: validation accuracy {got:.1%} on labels that are noise: the "
                "probe saw the validation labels. Train on the training set only"
            )


# -- Exercise 3: a convolutional stem -------------------------------------------------------
def _token_changes(
    stem: nn.Module, base: torch.Tensor, row: int, col: int
) -> torch.Tensor:
    """How much each token moves when one pixel of ``base`` changes: ``(tokens,)``."""
    bumped = base.clone()
    bumped[:, :, row, col] += 10.0
    with torch.no_grad():
        return (stem(bumped) - stem(base)).abs().amax(dim=(0, 2))


@checker("Exercise 3: a convolutional stem")
def check_conv_stem(make_conv_stem: Callable[..., nn.Module]) -> None:
    """``make_conv_stem(in_channels, d_model, patch_size)`` returns a module mapping
    ``(batch in_channels H W)`` to ``(batch (H/p)·(W/p) d_model)``: log2(p) stride-2 3×3
    convolutions (padding 1) with ReLU, then a 1×1 convolution; tokens row by row."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    for in_channels, d_model, patch, (height, width) in [
        (3, 32, 4, (16, 24)),
        (1, 24, 8, (32, 32)),
        (2, 8, 2, (6, 10)),
    ]:
        stem = make_conv_stem(in_channels, d_model, patch)
        if not isinstance(stem, nn.Module):
            raise ExerciseError(
                f"make_conv_stem should return an nn.Module, got {type(stem).__name__}"
            )
        stem.eval()
        images = torch.randn(2, in_channels, height, width, generator=gen)
        with torch.no_grad():
            got = call_without_mutation(stem, images)
        grid = (height // patch, width // patch)
        what = f"the stem (in_channels={in_channels}, d_model={d_model}, patch_size={patch})"
        if not isinstance(got, torch.Tensor):
            raise ExerciseError(f"{what} returned {type(got).__name__}, not a tensor")
        if got.dim() == 4:
            raise ExerciseError(
                f"{what} returns a feature map of shape {tuple(got.shape)}; flatten it into "
                "tokens: rearrange(x, 'b d h w -> b (h w) d')"
            )
        if (
            got.dim() == 3
            and got.shape[1] == d_model
            and got.shape[2] == grid[0] * grid[1]
        ):
            raise ExerciseError(
                f"{what} returns {tuple(got.shape)}, features before tokens; the tokens go "
                "on axis 1: 'b d h w -> b (h w) d'"
            )
        if (
            got.dim() == 3
            and got.shape[2] == d_model
            and got.shape[1] != grid[0] * grid[1]
        ):
            for halvings in range(0, 6):
                factor = 2**halvings
                if got.shape[1] == -(-height // factor) * -(-width // factor):
                    raise ExerciseError(
                        f"{what} gives {got.shape[1]} tokens for a {height}×{width} image: it "
                        f"shrinks the image {factor}×, not {patch}× (patch_size); use "
                        f"log2({patch}) = {patch.bit_length() - 1} stride-2 convolutions"
                    )
        expect_tensor(
            got, (2, grid[0] * grid[1], d_model), f"{what}(images {height}×{width})"
        )
        if patch != 4:
            continue

        # Token order and overlap, from which tokens one pixel reaches.
        base = torch.randn(1, in_channels, height, width, generator=gen)
        row, col = 1, 4  # the patch at grid row 1, column 4
        change = _token_changes(stem, base, patch * row, patch * col)
        change = change > 1e-4 * change.max().clamp_min(1e-12)  # which tokens moved
        row_major, column_major = row * grid[1] + col, col * grid[0] + row
        if change[column_major] and not change[row_major]:
            raise ExerciseError(
                f"{what}: the tokens are in column-major order; flatten the grid row by row: "
                "'b d h w -> b (h w) d'"
            )
        if not change[row_major]:
            raise ExerciseError(
                f"{what}: changing the pixel at the top-left corner of patch (row {row}, "
                f"column {col}) did not change token {row_major}; are the tokens in "
                "row-major order, and is every convolution 3×3 with stride 2 and padding 1?"
            )
        border = _token_changes(stem, base, patch * row, patch * col + patch // 2)
        border = border > 1e-4 * border.max().clamp_min(1e-12)
        if not (border[row_major] and border[row_major + 1]):
            raise ExerciseError(
                f"{what}: a pixel half a patch inside patch {row_major} does not reach "
                f"token {row_major + 1} as well, so the patches do not overlap; use 3×3 "
                "kernels with stride 2 and padding 1, not a p×p kernel"
            )

        # Not an affine map: stacked convolutions without ReLU collapse into one.
        a = torch.randn(1, in_channels, height, width, generator=gen)
        b = torch.randn(1, in_channels, height, width, generator=gen)
        with torch.no_grad():
            zero = stem(torch.zeros_like(a))
            affine_gap = (stem(a + b) - stem(a) - stem(b) + zero).abs().max().item()
            scale = stem(a).abs().max().item()
        if affine_gap <= 1e-5 * max(scale, 1.0):
            raise ExerciseError(
                f"{what} is affine (f(a+b) = f(a) + f(b) - f(0)): without a ReLU after each "
                "stride-2 convolution the stack collapses into a single convolution"
            )
