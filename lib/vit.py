# This file is generated from chapters/10-1-vit.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/10-1-vit.md, section "Patches as tokens".
"""The Vision Transformer (chapter 10 of the course): images as sequences of
patches.

* :func:`patchify` cuts images into flattened patches with one einops
  pattern; :class:`PatchEmbedding` projects them (a linear layer: a strided
  convolution).
* :class:`ViTConfig` and :class:`ViT`: a CLS token, learned position
  embeddings, chapter 7's :class:`~lib.models.Encoder` unchanged, a
  classification head.
* :func:`config_from_vit`, :func:`vit_rows`, :func:`vit_state_dict`,
  :func:`load_hf_vit_state_dict`: the weights of ``transformers``'
  ``ViTModel`` and ``ViTForImageClassification`` (4.x and 5.x names),
  through chapter 7's table-driven loader.
* On import it registers the ViT with chapter 7: the model kind ``"vit"``
  in :mod:`lib.model_file` (:func:`lib.model_file.save_model` and
  :func:`~lib.model_file.load_model`, the shipped ``vit-mnist``) and the
  hub loader of ``ViTConfig`` (:func:`lib.pretrained.load_pretrained`).

Axis names: ``batch``, ``channels``, ``height``, ``width``; ``patches`` (the
grid, row by row), ``tokens`` (the CLS token, then the patches),
``d_model``, ``heads``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from torch import nn

from lib import _checks as check
from lib.hf_weights import Row, concat, convert_state_dict, load_checked, same
from lib.model_file import RUNTIME_FIELDS, ModelKind, register_model_kind
from lib.models import Encoder, TransformerConfig, init_weights
from lib.pretrained import HubLoader, register_hub_loader

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "patchify",
    "PatchEmbedding",
    "ViTConfig",
    "ViT",
    "config_from_vit",
    "conv_kernels_as_rows",
    "VIT_BLOCK_NAMES",
    "vit_rows",
    "vit_state_dict",
    "load_hf_vit_state_dict",
]


# From chapters/10-1-vit.md, section "Patches as tokens".
_IMAGES_HINT = (
    "a ViT takes 4-D floating point images (batch, channels, height, "
    "width): add the channel axis with images[:, None], convert uint8 "
    "pixels with images.float() / 255"
)


def _check_images(images: object, p: int, channels: int | None = None) -> None:
    """``images`` must be a float ``(batch channels height width)`` tensor
    that patches of side ``p`` tile exactly (with ``channels`` channels, if
    given)."""
    check.tensor("images", images, "batch c h w", floating=True, hint=_IMAGES_HINT)
    _, got, h, w = images.shape
    if channels is not None and got != channels:
        raise ValueError(f"expected {channels} channel(s), got {got} in {images.shape}")
    if h % p or w % p:
        raise ValueError(f"image size {h}×{w} is not divisible by the patch size {p}")


def _check_patchify(images: object, patch_size: int) -> None:
    """The front door of :func:`patchify`."""
    _check_images(images, check.positive_int("patch_size", patch_size))


# From chapters/10-1-vit.md, section "Patches as tokens".
@check.front_door(_check_patchify)
def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut images into non-overlapping square patches, each flattened to a
    vector.

    ``images`` ``(batch channels height width)`` -> ``(batch patches
    (channels p1 p2))`` with ``p1 = p2 = patch_size`` and ``patches =
    (height/p)·(width/p)`` in row-major order: left to right, then top to
    bottom.
    """
    p = patch_size
    return rearrange(images, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p)


# From chapters/10-1-vit.md, section "A linear layer on patches is a strided convolution".
def _check_patch_input(embedding: nn.Module, images: object) -> None:
    """The front door of ``PatchEmbedding.forward``."""
    _check_images(images, embedding.patch_size, embedding.in_channels)
    # float16 or float64 images meet float32 weights: say so here, not
    # in the matrix product (autocast casts them itself)
    check.same_dtype_and_device(
        autocast=True,
        owner="PatchEmbedding",
        hint="convert them to the model's dtype, e.g. images.float()",
        images=images,
        weight=embedding.proj.weight,
    )


# From chapters/10-1-vit.md, section "A linear layer on patches is a strided convolution".
class PatchEmbedding(nn.Module):
    """Images -> one vector per patch: :func:`patchify`, then one linear
    layer.

    ``forward(images)``: ``(batch channels height width)`` -> ``(batch
    patches d_model)``. The same weights act on every patch, so this equals
    a convolution with kernel size and stride ``patch_size`` whose kernels,
    flattened as ``(channels p1 p2)``, are the rows of ``proj.weight``.
    """

    def __init__(self, in_channels: int, patch_size: int, d_model: int) -> None:
        super().__init__()
        sizes = dict(in_channels=in_channels, patch_size=patch_size, d_model=d_model)
        check.positive_ints(**sizes, owner="PatchEmbedding")
        self.in_channels, self.patch_size = in_channels, patch_size
        self.proj = nn.Linear(in_channels * patch_size**2, d_model)

    @check.front_door(_check_patch_input)
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(patchify(images, self.patch_size))


# From chapters/10-1-vit.md, section "A class token, positions, and chapter 7's encoder".
def _check_vit_config(cfg: ViTConfig) -> None:
    """The image's fields of a :class:`ViTConfig`: sizes, the attention
    dropout, patches that tile the image."""
    size, owner = cfg.image_size, "ViTConfig"
    if not isinstance(size, int | tuple) or len(cfg.image_hw) != 2:
        raise ValueError(f"image_size must be an int or (height, width): {size}")
    sizes = dict(zip(("height", "width"), cfg.image_hw))
    sizes |= dict(n_classes=cfg.n_classes, in_channels=cfg.in_channels)
    check.positive_ints(**sizes, patch_size=cfg.patch_size, owner=owner)
    if cfg.attention_dropout is not None:
        check.probability("attention_dropout", cfg.attention_dropout, owner=owner)
    _check_images(torch.empty(0, cfg.in_channels, *cfg.image_hw), cfg.patch_size)


# From chapters/10-1-vit.md, section "A class token, positions, and chapter 7's encoder".
@dataclass(frozen=True)
class ViTConfig:
    """A Vision Transformer: the images and their patches, then the
    encoder's sizes.

    ``image_size`` (an int for square images, or ``(height, width)``),
    ``patch_size`` (square patches that tile the image exactly),
    ``n_classes``, ``in_channels`` (1 for MNIST, 3 for RGB); the encoder:
    ``d_model``, ``n_heads``, ``n_layers``, ``d_ff`` (None: ``4·d_model``),
    ``activation`` (exact GELU, as ViT), ``norm_eps`` (1e-6 as in the
    paper's code; ``transformers`` uses 1e-12), ``dropout`` (after the
    position embeddings, on the attention weights and after every sublayer),
    ``attention_dropout`` (on the attention weights, where it differs from
    ``dropout``; None: ``dropout``), ``attn_backend``.
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
    attention_dropout: float | None = None
    attn_backend: str = "sdpa"

    def __post_init__(self) -> None:
        _check_vit_config(self)
        # building the encoder's config checks the other fields
        _ = self.encoder

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
        """Chapter 7's configuration for the encoder (positions are added
        before it)."""
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


# From chapters/10-1-vit.md, section "A class token, positions, and chapter 7's encoder".
_RESIZE = (
    "one position embedding per patch: resize the images, or interpolate "
    "the position embeddings (exercise 1)"
)


def _check_image_size(cfg: ViTConfig, images: torch.Tensor) -> None:
    """Images of the size the position embeddings were built for."""
    if images.shape[-2:] != cfg.image_hw:
        h, w = cfg.image_hw
        got = "×".join(map(str, images.shape[-2:]))
        raise ValueError(f"ViT built for {h}×{w} images but got {got}: {_RESIZE}")


# From chapters/10-1-vit.md, section "A class token, positions, and chapter 7's encoder".
class ViT(nn.Module):
    """Vision Transformer: ``images (batch channels height width)`` ->
    ``logits (batch classes)``.

    ``embed(images)`` gives the encoder's input ``(batch tokens d_model)``:
    the class token, then the patch embeddings, plus the position
    embeddings. ``features(images)`` is the encoder's output ``(batch tokens
    d_model)`` (after its final norm); the head reads token 0.
    ``attention_weights(images)`` returns each layer's weights ``(batch
    heads tokens tokens)``.
    """

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        hint = (
            "ViT takes a ViTConfig, which makes the encoder's TransformerConfig itself"
        )
        self.cfg = check.instance("cfg", cfg, ViTConfig, owner="ViT", hint=hint)
        self.patch_embed = PatchEmbedding(cfg.in_channels, cfg.patch_size, cfg.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        n_tokens = 1 + cfg.n_patches
        self.pos_embedding = nn.Parameter(torch.zeros(1, n_tokens, cfg.d_model))
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(cfg.encoder)
        if cfg.attention_dropout is not None:
            # a rate of its own on the attention weights
            for block in self.encoder.blocks:
                block.self_attn.sublayer.dropout = cfg.attention_dropout
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)
        # chapter 7: N(0, 0.02), scaled residual projections
        init_weights(self)
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.pos_embedding, std=0.02)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        # (batch patches d_model); patch_embed checks the images
        patches = self.patch_embed(images)
        _check_image_size(self.cfg, images)
        cls = repeat(self.cls_token, "1 1 d -> b 1 d", b=images.shape[0])
        return self.dropout(torch.cat([cls, patches], dim=1) + self.pos_embedding)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.embed(images))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images)[:, 0])

    def attention_weights(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's attention weights ``(batch heads tokens tokens)``,
        in order."""
        x, weights = self.embed(images), []
        for block in self.encoder.blocks:
            x, layer_weights = block.self_attn(x, need_weights=True)
            x = block.ffn(x)
            weights.append(layer_weights)
        return weights


# From chapters/10-1-vit.md, section "The same model as Hugging Face's ViTModel".
_HF_VIT_FIELDS = (
    "image_size patch_size num_labels num_channels hidden_size "
    "num_attention_heads num_hidden_layers intermediate_size hidden_act "
    "layer_norm_eps hidden_dropout_prob attention_probs_dropout_prob"
).split()


def _check_hf_vit_config(config: object) -> None:
    """A ``transformers`` ``ViTConfig`` of a model we build: every field
    read, the exact GELU, qkv biases."""
    name = type(config).__name__
    if missing := [field for field in _HF_VIT_FIELDS if not hasattr(config, field)]:
        raise TypeError(f"config must be a transformers ViTConfig: no {missing} in it")
    if (activation := config.hidden_act) != "gelu":
        raise ValueError(f"{name}.hidden_act={activation!r}: only 'gelu' is built")
    if not getattr(config, "qkv_bias", True):
        raise ValueError(f"{name}.qkv_bias=False: our fused qkv_proj always has biases")


# From chapters/10-1-vit.md, section "The same model as Hugging Face's ViTModel".
def config_from_vit(config: object, n_classes: int | None = None) -> ViTConfig:
    """Our :class:`ViTConfig` of a ``transformers`` ``ViTConfig`` (read by
    attribute).

    ``n_classes`` defaults to ``config.num_labels``, the size of its
    classifier. Both dropout rates are carried: ``hidden_dropout_prob``
    (after the embeddings and every sublayer) as ``dropout``,
    ``attention_probs_dropout_prob`` as ``attention_dropout``. What we do
    not build (another activation, no qkv biases) is refused, naming the
    field.
    """
    _check_hf_vit_config(config)
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
        attention_dropout=config.attention_probs_dropout_prob,
    )


# From chapters/10-1-vit.md, section "The same model as Hugging Face's ViTModel".
def conv_kernels_as_rows(kernel: torch.Tensor) -> torch.Tensor:
    """A patch convolution's kernels ``(d_model c p1 p2)`` as the rows of
    our linear layer ``(d_model (c p1 p2))``: the equivalence shown above,
    read backwards."""
    check.tensor("kernel", kernel, "d_model c p1 p2")
    return rearrange(kernel, "d c p1 p2 -> d (c p1 p2)")


#: transformers' names inside a ViT block: 4.x, and 5.x (which renamed them)
VIT_BLOCK_NAMES = {
    "4.x": {
        "block": "encoder.layer.{i}.",
        "qkv": (
            "attention.attention.query",
            "attention.attention.key",
            "attention.attention.value",
        ),
        "out": "attention.output.dense",
        "fc1": "intermediate.dense",
        "fc2": "output.dense",
    },
    "5.x": {
        "block": "layers.{i}.",
        "qkv": ("attention.q_proj", "attention.k_proj", "attention.v_proj"),
        "out": "attention.o_proj",
        "fc1": "mlp.fc1",
        "fc2": "mlp.fc2",
    },
}


def vit_rows(prefix: str = "", head: bool = False, names: str = "4.x") -> list[Row]:
    """``transformers``' ViT table, with the block names of ``names``
    (``"4.x"`` or ``"5.x"``, :data:`VIT_BLOCK_NAMES`). ``{i}`` runs over the
    blocks, ``{w}`` over ``weight`` and ``bias``. ``prefix`` is ``"vit."``
    in ``ViTForImageClassification``, whose ``classifier`` is our ``head``
    (``head=True``).
    """
    check.string("prefix", prefix)
    check.boolean("head", head)
    check.one_of("names", names, tuple(VIT_BLOCK_NAMES))
    table = VIT_BLOCK_NAMES[names]
    e = prefix + "embeddings."
    ours, theirs = "encoder.blocks.{i}.", prefix + table["block"]
    qkv = tuple(theirs + name + ".{w}" for name in table["qkv"])
    block = [  # (ours under encoder.blocks.{i}., theirs under their block)
        ("self_attn.norm.{w}", "layernorm_before.{w}"),
        ("self_attn.sublayer.out_proj.{w}", table["out"] + ".{w}"),
        ("ffn.norm.{w}", "layernorm_after.{w}"),
        ("ffn.sublayer.w_in.{w}", table["fc1"] + ".{w}"),
        ("ffn.sublayer.w_out.{w}", table["fc2"] + ".{w}"),
    ]
    conv = e + "patch_embeddings.projection."
    rows: list[Row] = [
        ("cls_token", e + "cls_token", same),
        ("pos_embedding", e + "position_embeddings", same),
        ("patch_embed.proj.weight", conv + "weight", conv_kernels_as_rows),
        ("patch_embed.proj.bias", conv + "bias", same),
        # q, k and v stacked as the rows [q; k; v] of our fused projection
        (ours + "self_attn.sublayer.qkv_proj.{w}", qkv, concat),
        *[(ours + o, theirs + t, same) for o, t in block],
        ("encoder.final_norm.{w}", prefix + "layernorm.{w}", same),
    ]
    if head:
        rows.append(("head.{w}", "classifier.{w}", same))
    return rows


# From chapters/10-1-vit.md, section "The same model as Hugging Face's ViTModel".
_POOLER = (
    "the state dict has a pooler, which ViT does not use: build the "
    "reference with ViTModel(config, add_pooling_layer=False)"
)


def _check_their_state_dict(their_state_dict: object) -> None:
    """A mapping of ``transformers``' keys, without a pooler."""
    check.instance("their_state_dict", their_state_dict, Mapping, what="a state dict")
    if any(key.startswith(("pooler.", "vit.pooler.")) for key in their_state_dict):
        raise ValueError(_POOLER)


# From chapters/10-1-vit.md, section "The same model as Hugging Face's ViTModel".
def vit_state_dict(
    their_state_dict: Mapping[str, torch.Tensor], cfg: ViTConfig
) -> dict[str, torch.Tensor]:
    """A ``ViTModel`` (built with ``add_pooling_layer=False``) or
    ``ViTForImageClassification`` state dict as the state dict of
    ``ViT(cfg)``; from a bare ``ViTModel``, which has no classifier, without
    our ``head``."""
    _check_their_state_dict(their_state_dict)
    prefix = "vit." if any(key.startswith("vit.") for key in their_state_dict) else ""
    # transformers 5 renamed the blocks (layers.{i}.attention.q_proj, ...)
    names = (
        "5.x"
        if any(k.startswith(prefix + "layers.") for k in their_state_dict)
        else "4.x"
    )
    head = "classifier.weight" in their_state_dict
    with torch.device("meta"):  # shapes only, no data
        shapes = {key: t.shape for key, t in ViT(cfg).state_dict().items()}
    if not head:
        shapes = {key: shape for key, shape in shapes.items() if key[:5] != "head."}
    return convert_state_dict(
        their_state_dict,
        vit_rows(prefix, head, names),
        shapes,
        ranges={"i": range(cfg.n_layers), "w": ("weight", "bias")},
        what="transformers ViT -> ViT",
    )


def load_hf_vit_state_dict(
    model: ViT, their_state_dict: Mapping[str, torch.Tensor]
) -> ViT:
    """Load a ``transformers`` ViT state dict into ``model`` (our head is
    kept when the reference has none); returns ``model``. Raises
    ``ValueError`` if it does not fit."""
    check.instance("model", model, ViT)
    ours = vit_state_dict(their_state_dict, model.cfg)
    if "head.weight" not in ours:
        ours |= {k: v for k, v in model.state_dict().items() if k.startswith("head.")}
    return load_checked(model, ours)


# From chapters/10-1-vit.md, section "The same model as Hugging Face's ViTModel".
register_model_kind(
    ModelKind(
        "vit",
        ViT,
        ViTConfig,
        runtime=(*RUNTIME_FIELDS, "attention_dropout"),
        module="lib.vit",
    )
)


def _vit_from_hub(ours: ViT, reference: nn.Module) -> ViT:
    return load_hf_vit_state_dict(ours, reference.state_dict())


register_hub_loader(
    "ViTConfig",
    HubLoader(
        build=lambda config: ViT(config_from_vit(config)),
        convert=_vit_from_hub,
        labels=True,
    ),
)
