# This file is generated from chapters/10-vit.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""The Vision Transformer (chapter 10 of the course): images as sequences of patches.

* :func:`patchify` cuts images into flattened patches with one einops pattern;
  :class:`PatchEmbedding` projects them (a linear layer: a strided convolution).
* :class:`ViTConfig` and :class:`ViT`: a CLS token, learned position embeddings,
  chapter 7's :class:`~lib.models.Encoder` unchanged, a classification head.
* :func:`random_translate` (augmentation), :func:`confusion_matrix`,
  :func:`mean_attention_distance` (how far, in pixels, each head looks).
* :func:`config_from_vit`, :func:`vit_rows`, :func:`vit_state_dict`,
  :func:`load_hf_vit_state_dict`: the weights of ``transformers``' ``ViTModel`` and
  ``ViTForImageClassification`` (4.x names), through chapter 7's table-driven loader.

Axis names: ``batch``, ``channels``, ``height``, ``width``; ``patches`` (the grid, row
by row), ``tokens`` (the CLS token, then the patches), ``d_model``, ``heads``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, reduce, repeat
from torch import nn

from lib import _checks as check
from lib.hf_weights import Row, concat, convert_state_dict, load_checked, same
from lib.models import Encoder, TransformerConfig, init_weights

__all__ = [
    "patchify",
    "PatchEmbedding",
    "ViTConfig",
    "ViT",
    "random_translate",
    "confusion_matrix",
    "mean_attention_distance",
    "config_from_vit",
    "conv_kernels_as_rows",
    "vit_rows",
    "vit_state_dict",
    "load_hf_vit_state_dict",
]


def _check_images(
    images: object,
    patch_size: int,
    channels: int | None = None,
) -> torch.Tensor:
    """``images`` as a float ``(batch channels height width)`` tensor that
    ``patch_size`` tiles exactly (with ``channels`` channels if given), or an error."""
    if not isinstance(images, torch.Tensor):
        raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dim() != 4:
        hint = " (add the channel axis: images[:, None])" if images.dim() == 3 else ""
        raise ValueError(
            "images must be 4-D (batch, channels, height, width), "
            f"got shape {tuple(images.shape)}{hint}"
        )
    if not images.is_floating_point():
        raise TypeError(
            f"images must be floating point, got {images.dtype} "
            "(convert uint8 pixels first: images.float() / 255)"
        )
    if channels is not None and images.shape[1] != channels:
        raise ValueError(
            f"expected {channels} channel(s), got {images.shape[1]} "
            f"in images of shape {tuple(images.shape)}"
        )
    height, width = images.shape[-2:]
    p = patch_size
    if height % p or width % p:
        raise ValueError(
            f"image size {height}×{width} is not divisible by the patch size {p}: "
            f"crop or pad the images to a multiple of {p} "
            f"(e.g. {height // p * p}×{width // p * p})"
        )
    return images


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut images into non-overlapping square patches, each flattened to a vector.

    ``images`` ``(batch channels height width)`` -> ``(batch patches (channels p1 p2))``
    with ``p1 = p2 = patch_size`` and ``patches = (height/p)·(width/p)`` in row-major
    order: left to right, then top to bottom.
    """
    _check_images(images, patch_size)
    p = patch_size
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p)


class PatchEmbedding(nn.Module):
    """Images -> one vector per patch: :func:`patchify`, then one linear layer.

    ``forward(images)``: ``(batch channels height width)`` ->
    ``(batch patches d_model)``. The same weights act on every patch, so this equals a
    convolution with kernel size and stride ``patch_size`` whose kernels, flattened as
    ``(channels p1 p2)``, are the rows of ``proj.weight``.
    """

    def __init__(self, in_channels: int, patch_size: int, d_model: int) -> None:
        super().__init__()
        for name, value in [
            ("in_channels", in_channels),
            ("patch_size", patch_size),
            ("d_model", d_model),
        ]:
            check.positive_int(name, value, owner="PatchEmbedding")
        self.in_channels, self.patch_size = in_channels, patch_size
        self.proj = nn.Linear(in_channels * patch_size**2, d_model)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_images(images, self.patch_size, self.in_channels)
        return self.proj(patchify(images, self.patch_size))


@dataclass(frozen=True)
class ViTConfig:
    """A Vision Transformer: the images and their patches, then the encoder's sizes.

    ``image_size`` (an int for square images, or ``(height, width)``), ``patch_size``
    (square patches that tile the image exactly), ``n_classes``, ``in_channels`` (1 for
    MNIST, 3 for RGB); the encoder: ``d_model``, ``n_heads``, ``n_layers``, ``d_ff``
    (None: ``4·d_model``), ``activation`` (exact GELU, as ViT), ``norm_eps`` (1e-6 as in
    the paper's code; ``transformers`` uses 1e-12), ``dropout`` (after the position
    embeddings and in every block), ``attn_backend``.
    """

    image_size: int | tuple[int, int]
    patch_size: int
    n_classes: int
    in_channels: int = 1
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int | None = None
    activation: str = "gelu"
    norm_eps: float = 1e-6
    dropout: float = 0.0
    attn_backend: str = "sdpa"

    def __post_init__(self) -> None:
        sizes = self.image_size
        if isinstance(sizes, int):
            sizes = (sizes, sizes)
        if not isinstance(sizes, tuple) or len(sizes) != 2:
            raise ValueError(
                f"ViTConfig.image_size must be an int or (height, width), got {sizes!r}"
            )
        named = ("patch_size", "n_classes", "in_channels")
        fields = [("height", sizes[0]), ("width", sizes[1])]
        for name, value in fields + [(name, getattr(self, name)) for name in named]:
            check.positive_int(name, value, owner="ViTConfig")
        if sizes[0] % self.patch_size or sizes[1] % self.patch_size:
            raise ValueError(
                f"ViTConfig: image size {sizes[0]}×{sizes[1]} is not divisible by the "
                f"patch size {self.patch_size}"
            )
        _ = self.encoder  # builds the encoder's config, which checks the other fields

    @property
    def image_hw(self) -> tuple[int, int]:
        """``(height, width)`` of the images."""
        size = self.image_size
        return (size, size) if isinstance(size, int) else tuple(size)

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row: ``(height/p, width/p)``."""
        height, width = self.image_hw
        return height // self.patch_size, width // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def encoder(self) -> TransformerConfig:
        """Chapter 7's configuration for the encoder (positions are added before it)."""
        return TransformerConfig(
            vocab_size=1,  # unused: the encoder takes embedded input
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.n_layers,
            d_ff=self.d_ff,
            activation=self.activation,
            norm_eps=self.norm_eps,
            positions="none",
            max_len=1 + self.n_patches,
            dropout=self.dropout,
            attn_backend=self.attn_backend,
        )


class ViT(nn.Module):
    """Vision Transformer: ``images (batch channels height width)`` ->
    ``logits (batch classes)``.

    ``embed(images)`` gives the encoder's input ``(batch tokens d_model)``: the class
    token, then the patch embeddings, plus the position embeddings.
    ``features(images)`` is the encoder's output ``(batch tokens d_model)`` (after its
    final norm); the head reads token 0. ``attention_weights(images)`` returns each
    layer's weights ``(batch heads tokens tokens)``.
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ViTConfig):
            raise TypeError(f"ViT takes a ViTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.patch_embed = PatchEmbedding(cfg.in_channels, cfg.patch_size, cfg.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        n_tokens = 1 + cfg.n_patches
        self.pos_embedding = nn.Parameter(torch.zeros(1, n_tokens, cfg.d_model))
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(cfg.encoder)
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        init_weights(self)  # chapter 7: N(0, 0.02), scaled residual projections
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.pos_embedding, std=0.02)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        _check_images(images, self.cfg.patch_size, self.cfg.in_channels)
        if tuple(images.shape[-2:]) != self.cfg.image_hw:
            (height, width), (rows, cols) = self.cfg.image_hw, self.cfg.grid
            got = f"{images.shape[-2]}×{images.shape[-1]}"
            raise ValueError(
                f"this ViT was built for {height}×{width} images (one position "
                f"embedding per patch of a {rows}×{cols} grid), got {got}: resize the "
                "images, or interpolate the position embeddings to the new grid "
                "(exercise 1)"
            )
        patches = self.patch_embed(images)  # (batch patches d_model)
        cls = repeat(self.cls_token, "1 1 d -> b 1 d", b=images.shape[0])
        return self.dropout(torch.cat([cls, patches], dim=1) + self.pos_embedding)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embed(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images)[:, 0])

    def attention_weights(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's attention weights ``(batch heads tokens tokens)``, in order."""
        x, weights = self.embed(images), []
        for block in self.encoder.blocks:
            x, layer_weights = block.self_attn(x, need_weights=True)
            x = block.ffn(x)
            weights.append(layer_weights)
        return weights


def config_from_vit(config: object, n_classes: int | None = None) -> ViTConfig:
    """Our :class:`ViTConfig` of a ``transformers`` ``ViTConfig`` (read by attribute).

    ``n_classes`` defaults to ``config.num_labels``, the size of its classifier.
    """
    name = type(config).__name__
    activation = getattr(config, "hidden_act", None)
    if activation != "gelu":
        raise ValueError(f"{name}.hidden_act={activation!r}: only 'gelu' is built")
    if not getattr(config, "qkv_bias", True):
        raise ValueError(f"{name}.qkv_bias=False: our fused qkv_proj always has biases")
    size = config.image_size
    return ViTConfig(
        image_size=size if isinstance(size, int) else tuple(size),
        patch_size=config.patch_size,
        n_classes=config.num_labels if n_classes is None else n_classes,
        in_channels=config.num_channels,
        d_model=config.hidden_size,
        n_heads=config.num_attention_heads,
        n_layers=config.num_hidden_layers,
        d_ff=config.intermediate_size,
        norm_eps=config.layer_norm_eps,
        dropout=config.hidden_dropout_prob,
    )


def conv_kernels_as_rows(kernel: torch.Tensor) -> torch.Tensor:
    """A patch convolution's kernels ``(d_model c p1 p2)`` as the rows of our linear
    layer ``(d_model (c p1 p2))``: the equivalence shown above, read backwards."""
    return rearrange(kernel, "d c p1 p2 -> d (c p1 p2)")


def vit_rows(prefix: str = "", head: bool = False) -> list[Row]:
    """``transformers``' ViT table (4.x names). ``{i}`` runs over the blocks, ``{w}``
    over ``weight`` and ``bias``. ``prefix`` is ``"vit."`` in
    ``ViTForImageClassification``, whose ``classifier`` is our ``head`` (``head=True``).
    """
    e = prefix + "embeddings."
    ours, theirs = "encoder.blocks.{i}.", prefix + "encoder.layer.{i}."
    attention = theirs + "attention.attention."
    qkv = tuple(attention + name + ".{w}" for name in ("query", "key", "value"))
    block = [  # (ours under encoder.blocks.{i}., theirs under encoder.layer.{i}.)
        ("self_attn.norm.{w}", "layernorm_before.{w}"),
        ("self_attn.sublayer.out_proj.{w}", "attention.output.dense.{w}"),
        ("ffn.norm.{w}", "layernorm_after.{w}"),
        ("ffn.sublayer.w_in.{w}", "intermediate.dense.{w}"),
        ("ffn.sublayer.w_out.{w}", "output.dense.{w}"),
    ]
    conv = e + "patch_embeddings.projection."
    rows: list[Row] = [
        ("cls_token", e + "cls_token", same),
        ("pos_embedding", e + "position_embeddings", same),
        ("patch_embed.proj.weight", conv + "weight", conv_kernels_as_rows),
        ("patch_embed.proj.bias", conv + "bias", same),
        (ours + "self_attn.sublayer.qkv_proj.{w}", qkv, concat),  # rows [q; k; v]
        *[(ours + o, theirs + t, same) for o, t in block],
        ("encoder.final_norm.{w}", prefix + "layernorm.{w}", same),
    ]
    if head:
        rows.append(("head.{w}", "classifier.{w}", same))
    return rows


def vit_state_dict(
    their_state_dict: Mapping[str, torch.Tensor], cfg: ViTConfig
) -> dict[str, torch.Tensor]:
    """A ``ViTModel`` (built with ``add_pooling_layer=False``) or
    ``ViTForImageClassification`` state dict as the state dict of ``ViT(cfg)``; from a
    bare ``ViTModel``, which has no classifier, without our ``head``."""
    if any(key.startswith(("pooler.", "vit.pooler.")) for key in their_state_dict):
        raise ValueError(
            "the state dict has a pooler, which ViT does not use: build the reference "
            "with ViTModel(config, add_pooling_layer=False)"
        )
    prefix = "vit." if any(key.startswith("vit.") for key in their_state_dict) else ""
    head = "classifier.weight" in their_state_dict
    with torch.device("meta"):  # shapes only, no data
        shapes = {key: t.shape for key, t in ViT(cfg).state_dict().items()}
    if not head:
        shapes = {key: shape for key, shape in shapes.items() if key[:5] != "head."}
    return convert_state_dict(
        their_state_dict,
        vit_rows(prefix, head),
        shapes,
        ranges={"i": range(cfg.n_layers), "w": ("weight", "bias")},
        what="transformers ViT -> ViT",
    )


def load_hf_vit_state_dict(
    model: ViT,
    their_state_dict: Mapping[str, torch.Tensor],
) -> ViT:
    """Load a ``transformers`` ViT state dict into ``model`` (our head is kept when the
    reference has none); returns ``model``. Raises ``ValueError`` if it does not fit."""
    ours = vit_state_dict(their_state_dict, model.cfg)
    if "head.weight" not in ours:
        ours |= {k: v for k, v in model.state_dict().items() if k.startswith("head.")}
    return load_checked(model, ours)


def random_translate(
    images: torch.Tensor, max_shift: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Shift each image by its own random offset in ``-max_shift..max_shift`` pixels,
    vertically and horizontally, filling the uncovered border with zeros.

    ``images`` ``(batch channels height width)`` -> the same shape. ``generator`` (on
    the CPU) makes the shifts reproducible. ``max_shift=0`` returns ``images`` itself.
    """
    _check_images(images, 1)
    if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 0:
        raise ValueError(f"max_shift must be an int >= 0, got {max_shift!r}")
    if max_shift == 0:
        return images
    batch, _, height, width = images.shape
    padded = F.pad(images, (max_shift,) * 4)  # zeros around every side
    offsets = torch.randint(0, 2 * max_shift + 1, (2, batch), generator=generator)
    device = images.device
    offsets = offsets.to(device)
    rows = offsets[0, :, None] + torch.arange(height, device=device)  # (batch height)
    cols = offsets[1, :, None] + torch.arange(width, device=device)  # (batch width)
    index = torch.arange(batch, device=device)[:, None, None]
    moved = padded[index, :, rows[:, :, None], cols[:, None, :]]  # (batch h w channels)
    return rearrange(moved, "b h w c -> b c h w")


def confusion_matrix(
    predictions: torch.Tensor, labels: torch.Tensor, n_classes: int
) -> torch.Tensor:
    """Counts ``(true predicted)``: entry ``[i, j]`` is how many items of class ``i``
    were predicted as ``j``. ``predictions`` and ``labels``: integer ``(batch,)``."""
    for name, t in [("predictions", predictions), ("labels", labels)]:
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.is_floating_point():
            raise ValueError(f"{name} must be a 1-D integer tensor, got {t!r:.60}")
        if t.numel() and (t.min() < 0 or t.max() >= n_classes):
            raise ValueError(f"{name} must be in 0..{n_classes - 1}")
    if predictions.shape != labels.shape:
        raise ValueError(f"{predictions.shape=} and {labels.shape=} differ")
    pairs = labels.long() * n_classes + predictions.long()
    counts = torch.bincount(pairs, minlength=n_classes**2)
    return rearrange(counts, "(true predicted) -> true predicted", true=n_classes)


def mean_attention_distance(
    weights: torch.Tensor, grid: tuple[int, int], patch_size: int = 1
) -> torch.Tensor:
    """Each head's mean attention distance, in pixels (in patches for ``patch_size=1``).

    ``weights`` ``(batch heads tokens tokens)`` with ``tokens = 1 + grid_h·grid_w``
    (the class token first, ignored: each query patch's weights on the key patches are
    renormalised to sum to one). Returns ``(heads,)``: the distance between patch
    centres weighted by attention, averaged over query patches and the batch.
    """
    gh, gw = grid
    tokens = 1 + gh * gw
    if weights.dim() != 4 or tuple(weights.shape[-2:]) != (tokens, tokens):
        raise ValueError(
            f"weights must be (batch, heads, {tokens}, {tokens}) for a {gh}×{gw} grid "
            f"plus the class token, got {tuple(weights.shape)}"
        )
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=-1).to(weights)
    centres = centres * patch_size
    distance = torch.cdist(centres, centres)  # (q_patch k_patch), Euclidean
    patch_weights = weights[:, :, 1:, 1:]
    patch_weights = patch_weights / patch_weights.sum(-1, keepdim=True).clamp_min(1e-12)
    per_query = einsum(patch_weights, distance, "b h q k, q k -> b h q")
    return reduce(per_query, "b h q -> h", "mean")
