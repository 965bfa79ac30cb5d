"""lib.vit and lib.vit_training: patches, the ViT, its helpers, equality with
transformers' ViT, and its training (the MNIST recipe)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from einops import rearrange
from torch import nn

from lib.hf_weights import StateDictMismatchError, expand_rows
from lib.models import TransformerConfig
from lib.vit import (
    VIT_BLOCK_NAMES,
    PatchEmbedding,
    ViT,
    ViTConfig,
    config_from_vit,
    conv_kernels_as_rows,
    load_hf_vit_state_dict,
    patchify,
    vit_rows,
    vit_state_dict,
)
from lib.vit_training import (
    classification_loss,
    confusion_matrix,
    image_batches,
    mean_attention_distance,
    random_translate,
)

SMALL = ViTConfig(
    image_size=12, patch_size=4, n_classes=5, d_model=16, n_heads=2, n_layers=2
)


# -- patches -----------------------------------------------------------------------------------
def test_patchify_orders_patches_row_by_row_and_channels_first():
    images = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    patches = patchify(images, 4)
    assert patches.shape == (2, 6, 3 * 16)
    # patch 4 is grid row 1, column 1; its vector is channel 0's 4x4 block, then 1, then 2
    want = images[1, :, 4:8, 4:8].reshape(-1)
    assert torch.equal(patches[1, 4], want)
    back = rearrange(patches, "b (h w) (c p1 p2) -> b c (h p1) (w p2)", h=2, c=3, p1=4)
    assert torch.equal(back, images)


def test_patch_embedding_equals_a_strided_convolution():
    torch.manual_seed(0)
    embed = PatchEmbedding(in_channels=3, patch_size=4, d_model=8)
    conv = nn.Conv2d(3, 8, kernel_size=4, stride=4)
    with torch.no_grad():
        conv.weight.copy_(
            rearrange(embed.proj.weight, "d (c p1 p2) -> d c p1 p2", c=3, p1=4)
        )
        conv.bias.copy_(embed.proj.bias)
    images = torch.randn(2, 3, 8, 12)
    want = rearrange(conv(images), "b d h w -> b (h w) d")
    torch.testing.assert_close(embed(images), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("images", "error", "match"),
    [
        (
            torch.rand(2, 1, 10, 12),
            ValueError,
            r"image size 10×12 is not divisible by the patch",
        ),
        (torch.rand(2, 1, 12, 13), ValueError, "not divisible by the patch size 4"),
        (torch.rand(2, 12, 12), ValueError, r"4-D .*add the channel axis"),
        (
            torch.zeros(2, 1, 12, 12, dtype=torch.uint8),
            TypeError,
            "floating point.*255",
        ),
        ([[0.0]], TypeError, "must be a torch.Tensor"),
    ],
)
def test_patchify_rejects_bad_images(images, error, match):
    with pytest.raises(error, match=match):
        patchify(images, 4)


def test_patch_embedding_checks_its_sizes_and_channels():
    with pytest.raises(
        ValueError, match="PatchEmbedding: patch_size must be an int >= 1"
    ):
        PatchEmbedding(1, 0, 8)
    with pytest.raises(ValueError, match=r"expected 1 channel\(s\), got 3"):
        PatchEmbedding(1, 4, 8)(torch.rand(2, 3, 8, 8))


# -- configuration and model --------------------------------------------------------------------
def test_config_builds_the_encoder_config():
    cfg = ViTConfig(
        image_size=(8, 12), patch_size=4, n_classes=3, d_model=16, n_heads=2
    )
    assert cfg.image_hw == (8, 12) and cfg.grid == (2, 3) and cfg.n_patches == 6
    enc = cfg.encoder
    assert isinstance(enc, TransformerConfig)
    assert enc.positions == "none" and enc.max_len == 7 and enc.norm_eps == 1e-6
    assert (enc.d_model, enc.n_heads, enc.n_layers) == (16, 2, cfg.n_layers)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            dict(image_size=30, patch_size=7),
            r"image size 30×30 is not divisible by the patch",
        ),
        (dict(image_size=(28, 30), patch_size=7), r"28×30 is not divisible"),
        (
            dict(image_size=28, patch_size=0),
            "ViTConfig: patch_size must be an int >= 1",
        ),
        (dict(image_size=(28,), patch_size=7), r"int or \(height, width\)"),
        (
            dict(image_size=28, patch_size=7, in_channels=0),
            "ViTConfig: in_channels must be an int >= 1",
        ),
        (dict(image_size=28, patch_size=7, d_model=30, n_heads=4), "does not divide"),
    ],
)
def test_config_rejects_bad_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ViTConfig(n_classes=10, **kwargs)


def test_vit_shapes_and_attention_weights():
    torch.manual_seed(0)
    model = ViT(SMALL).eval()
    images = torch.randn(3, 1, 12, 12)
    assert model(images).shape == (3, 5)
    assert model.embed(images).shape == (3, 10, 16)
    weights = model.attention_weights(images)
    assert len(weights) == 2 and all(w.shape == (3, 2, 10, 10) for w in weights)
    torch.testing.assert_close(weights[1].sum(-1), torch.ones(3, 2, 10))
    # the block-by-block path that collects the weights computes the same features
    x = model.embed(images)
    for block in model.encoder.blocks:
        x = block.ffn(block.self_attn(x, need_weights=True)[0])
    torch.testing.assert_close(model.encoder.final_norm(x), model.features(images))


def test_vit_rejects_wrong_channels_and_sizes():
    model = ViT(SMALL)
    with pytest.raises(ValueError, match=r"expected 1 channel\(s\), got 3"):
        model(torch.rand(2, 3, 12, 12))
    with pytest.raises(
        ValueError, match=r"built for 12×12 images .* got 16×16.*interpolate"
    ):
        model(torch.rand(2, 1, 16, 16))
    with pytest.raises(ValueError, match="not divisible by the patch size 4"):
        model(torch.rand(2, 1, 14, 14))
    with pytest.raises(TypeError, match="takes a ViTConfig"):
        ViT(SMALL.encoder)


def test_only_the_position_table_knows_the_layout():
    """Shuffling patches together with their position rows leaves the class token unchanged."""
    torch.manual_seed(0)
    model = ViT(SMALL).eval()
    images = torch.randn(2, 1, 12, 12)
    perm = torch.randperm(SMALL.n_patches)
    tokens = model.patch_embed(images)[:, perm] + model.pos_embedding[:, 1:][:, perm]
    cls = (model.cls_token + model.pos_embedding[:, :1]).expand(2, -1, -1)
    shuffled = model.head(model.encoder(torch.cat([cls, tokens], 1))[:, 0])
    torch.testing.assert_close(shuffled, model(images), atol=1e-5, rtol=1e-5)


def test_dropout_is_used_in_training_only():
    cfg = dataclasses.replace(SMALL, dropout=0.5)
    model = ViT(cfg)
    images = torch.randn(2, 1, 12, 12)
    model.eval()
    assert torch.equal(model(images), model(images))
    model.train()
    assert not torch.equal(model(images), model(images))


# -- training helpers ---------------------------------------------------------------------------
def test_random_translate_shifts_each_image_within_the_range():
    images = torch.zeros(16, 2, 10, 10)
    images[:, :, 3:7, 3:7] = torch.rand(16, 2, 4, 4)  # blank border of 3 pixels
    moved = random_translate(images, 2, torch.Generator().manual_seed(0))
    assert moved.shape == images.shape
    offsets = set()
    for original, result in zip(images, moved):
        matches = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if torch.equal(torch.roll(original, (dy, dx), dims=(-2, -1)), result)
        ]
        assert len(matches) == 1
        offsets.add(matches[0])
    assert len(offsets) > 4  # different images moved differently
    again = random_translate(images, 2, torch.Generator().manual_seed(0))
    assert torch.equal(again, moved)
    assert random_translate(images, 0) is images


def test_random_translate_fills_with_zeros_and_checks_its_argument():
    images = torch.ones(32, 1, 5, 5)
    moved = random_translate(images, 1, torch.Generator().manual_seed(1))
    assert set(moved.unique().tolist()) <= {0.0, 1.0} and (moved == 0).any()
    with pytest.raises(ValueError, match="max_shift must be an int >= 0"):
        random_translate(images, -1)


def test_confusion_matrix_counts_true_by_predicted():
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    predictions = torch.tensor([0, 1, 1, 2, 0, 2])
    matrix = confusion_matrix(predictions, labels, 3)
    assert matrix.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert matrix.sum() == 6 and matrix.diag().sum() == 4
    with pytest.raises(ValueError, match="in 0..2"):
        confusion_matrix(torch.tensor([3]), torch.tensor([0]), 3)
    with pytest.raises(ValueError, match="1-D integer tensor"):
        confusion_matrix(torch.tensor([0.5]), torch.tensor([0]), 3)
    with pytest.raises(ValueError, match="differ"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0]), 3)


def test_mean_attention_distance_reference_points():
    grid, patch = (3, 4), 5
    tokens = 1 + 12
    rows, cols = torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], -1).float() * patch
    pairwise = torch.cdist(centres, centres)
    uniform = torch.full((2, 3, tokens, tokens), 1 / tokens)
    got = mean_attention_distance(uniform, grid, patch)
    assert got.shape == (3,)
    torch.testing.assert_close(got, torch.full((3,), pairwise.mean().item()))
    itself = torch.eye(tokens).expand(1, 1, tokens, tokens)
    assert mean_attention_distance(itself, grid, patch).item() == 0
    # every patch query looks only at the next patch in the sequence (wrapping to patch 0)
    shifted = torch.zeros(1, 1, tokens, tokens)
    for q in range(12):
        shifted[0, 0, 1 + q, 1 + (q + 1) % 12] = 1.0
    want = torch.stack([pairwise[q, (q + 1) % 12] for q in range(12)]).mean()
    torch.testing.assert_close(mean_attention_distance(shifted, grid, patch)[0], want)
    with pytest.raises(ValueError, match=r"\(batch, heads, 13, 13\)"):
        mean_attention_distance(torch.rand(1, 1, 12, 12), grid, patch)


# -- transformers' ViT ---------------------------------------------------------------------------
def _hf_config(transformers, **overrides):
    sizes = dict(
        image_size=(8, 12),
        patch_size=4,
        num_channels=3,
        hidden_size=24,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=40,
        num_labels=7,
    )
    return transformers.ViTConfig(**{**sizes, **overrides})


def test_equals_transformers_vit_model():
    transformers = pytest.importorskip("transformers")
    hf_config = _hf_config(transformers)
    torch.manual_seed(0)
    reference = transformers.ViTModel(hf_config, add_pooling_layer=False).eval()
    cfg = config_from_vit(hf_config)
    assert cfg.norm_eps == 1e-12 and cfg.grid == (2, 3) and cfg.in_channels == 3
    ours = ViT(cfg).eval()
    head_before = ours.head.weight.detach().clone()
    assert load_hf_vit_state_dict(ours, reference.state_dict()) is ours
    assert torch.equal(
        ours.head.weight, head_before
    )  # a bare ViTModel has no classifier
    images = torch.randn(2, 3, 8, 12)
    with torch.no_grad():
        want = reference(pixel_values=images).last_hidden_state
        got = ours.features(images)
    assert got.shape == want.shape == (2, 7, 24)
    assert (got - want).abs().max() <= 1e-5


def test_equals_transformers_vit_classifier():
    transformers = pytest.importorskip("transformers")
    hf_config = _hf_config(transformers, image_size=8)
    torch.manual_seed(1)
    reference = transformers.ViTForImageClassification(hf_config).eval()
    ours = load_hf_vit_state_dict(
        ViT(config_from_vit(hf_config)).eval(), reference.state_dict()
    )
    assert ours.cfg.n_classes == 7
    images = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        gap = (reference(pixel_values=images).logits - ours(images)).abs().max()
    assert gap <= 1e-5


def test_vit_state_dict_stacks_qkv_and_unflattens_nothing_else():
    transformers = pytest.importorskip("transformers")
    hf_config = _hf_config(transformers)
    theirs = transformers.ViTModel(hf_config, add_pooling_layer=False).state_dict()
    ours = vit_state_dict(theirs, config_from_vit(hf_config))
    assert "head.weight" not in ours
    # the block's names of the installed transformers: 4.x, or 5.x's renamed ones
    names = VIT_BLOCK_NAMES[
        "5.x" if "layers.1.layernorm_before.weight" in theirs else "4.x"
    ]
    block = names["block"].format(i=1)
    qkv = ours["encoder.blocks.1.self_attn.sublayer.qkv_proj.weight"]
    for rows, name in zip(qkv.split(24), names["qkv"]):
        assert torch.equal(rows, theirs[block + name + ".weight"])
    kernel = theirs["embeddings.patch_embeddings.projection.weight"]  # (24 3 4 4)
    assert torch.equal(ours["patch_embed.proj.weight"], conv_kernels_as_rows(kernel))
    assert torch.equal(
        ours["patch_embed.proj.weight"][5, 16:32], kernel[5, 1].flatten()
    )


def test_loader_rejects_poolers_and_unused_missing_or_misshapen_keys():
    transformers = pytest.importorskip("transformers")
    hf_config = _hf_config(transformers)
    cfg = config_from_vit(hf_config)
    with_pooler = transformers.ViTModel(hf_config).state_dict()
    with pytest.raises(ValueError, match=r"pooler.*add_pooling_layer=False"):
        load_hf_vit_state_dict(ViT(cfg), with_pooler)
    state = transformers.ViTModel(hf_config, add_pooling_layer=False).state_dict()
    renamed = dict(state)
    renamed["layernorm.scale"] = renamed.pop("layernorm.weight")  # a renamed key
    with pytest.raises(
        StateDictMismatchError,
        match=r"(?s)missing.*layernorm.weight.*unexpected.*layernorm.scale",
    ):
        load_hf_vit_state_dict(ViT(cfg), renamed)
    # the blocks' key prefix of the installed transformers (5.x renamed it)
    layer = (
        "layers." if "layers.0.layernorm_before.weight" in state else "encoder.layer."
    )
    with pytest.raises(StateDictMismatchError, match=rf"(?s)missing .*{layer}2"):
        load_hf_vit_state_dict(ViT(dataclasses.replace(cfg, n_layers=3)), state)
    with pytest.raises(StateDictMismatchError, match=rf"(?s)unexpected .*{layer}1"):
        load_hf_vit_state_dict(ViT(dataclasses.replace(cfg, n_layers=1)), state)
    with pytest.raises(StateDictMismatchError, match=r"(?s)mis-shaped.*pos_embedding"):
        load_hf_vit_state_dict(ViT(dataclasses.replace(cfg, image_size=(8, 16))), state)


def test_rows_cover_every_parameter_once():
    model = ViT(SMALL)
    rows = list(
        expand_rows(
            vit_rows("vit.", head=True), {"i": range(2), "w": ("weight", "bias")}
        )
    )
    ours = [key for keys, _, _ in rows for key in keys]
    assert sorted(ours) == sorted(model.state_dict()) and len(set(ours)) == len(ours)
    theirs = [key for _, keys, _ in rows for key in keys]
    assert len(set(theirs)) == len(theirs)
    assert all(k.startswith(("vit.", "classifier.")) for k in theirs)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(hidden_act="gelu_new"), "hidden_act='gelu_new'.*only 'gelu'"),
        (dict(qkv_bias=False), "qkv_bias=False"),
    ],
)
def test_config_from_vit_rejects_what_we_do_not_build(overrides, match):
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=match):
        config_from_vit(_hf_config(transformers, **overrides))


# -- issue 19: every public function, bad input -------------------------------------------------
def test_config_from_vit_carries_both_dropout_rates():
    transformers = pytest.importorskip("transformers")
    hf = _hf_config(
        transformers, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2
    )
    cfg = config_from_vit(hf)
    assert (cfg.dropout, cfg.attention_dropout) == (0.1, 0.2)
    model = ViT(cfg)
    assert model.dropout.p == 0.1  # after the position embeddings
    for block in model.encoder.blocks:
        assert block.self_attn.sublayer.dropout == 0.2  # on the attention weights
        assert block.self_attn.dropout.p == block.ffn.dropout.p == 0.1  # residuals
    plain = ViT(
        dataclasses.replace(SMALL, dropout=0.3)
    )  # None: the one rate everywhere
    assert plain.encoder.blocks[0].self_attn.sublayer.dropout == 0.3


def test_config_from_vit_refuses_what_is_not_a_vit_config():
    with pytest.raises(TypeError, match=r"config must be a transformers ViTConfig.*"):
        config_from_vit({"image_size": 28})
    with pytest.raises(ValueError, match="attention_dropout must be a probability"):
        ViTConfig(image_size=28, patch_size=7, n_classes=10, attention_dropout=1.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(image_size=28.0), ValueError, r"image_size must be an int or \(height"),
        (dict(image_size=(28, 28, 3)), ValueError, "image_size must be an int or"),
        (dict(image_size=(28, "28")), TypeError, "width must be an int"),
        (dict(image_size=28, n_classes=0), ValueError, "n_classes must be an int >= 1"),
        (dict(image_size=True), TypeError, "height must be an int, got bool"),
    ],
)
def test_config_rejects_bad_image_sizes_and_classes(kwargs, error, match):
    with pytest.raises(error, match=match):
        ViTConfig(**{"patch_size": 7, "n_classes": 10, **kwargs})


def test_patchify_checks_the_patch_size():
    images = torch.rand(2, 1, 8, 8)
    with pytest.raises(ValueError, match="patch_size must be an int >= 1, got 0"):
        patchify(images, 0)
    with pytest.raises(TypeError, match="patch_size must be an int, got float"):
        patchify(images, 4.0)
    assert patchify(torch.rand(0, 1, 8, 8), 4).shape == (0, 4, 16)  # an empty batch


def test_random_translate_refuses_a_shift_that_is_not_an_int():
    images = torch.rand(2, 1, 8, 8)
    for bad in (1.5, True):
        with pytest.raises(TypeError, match="max_shift must be an int"):
            random_translate(images, bad)
    with pytest.raises(TypeError, match="images must be a floating-point tensor"):
        random_translate(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), 1)


def test_image_batches_draw_shift_normalise_and_depend_on_the_step_only():
    images = torch.randint(0, 256, (50, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(50) % 10
    batches = image_batches(
        images, labels, 16, max_shift=1, flip=True, mean=0.5, std=0.25
    )
    batch = batches(3)
    assert batch["images"].shape == (16, 3, 8, 8) and batch["labels"].shape == (16,)
    assert batch["images"].dtype == torch.float32
    assert torch.equal(batches(3)["images"], batch["images"])  # (seed, step) only
    assert not torch.equal(batches(4)["images"], batch["images"])
    plain = image_batches(images.float() / 255, labels, 16)(3)  # same draw, no changes
    assert torch.equal(plain["labels"], batch["labels"])
    assert plain["images"].min() >= 0 and plain["images"].max() <= 1
    model = ViT(dataclasses.replace(SMALL, image_size=8, in_channels=3, n_classes=10))
    loss = classification_loss(model, batch)
    want = torch.nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
    torch.testing.assert_close(loss, want)


@pytest.mark.parametrize(
    ("labels", "kwargs", "error", "match"),
    [
        (torch.zeros(10), {}, TypeError, "labels must be an integer tensor"),
        (
            torch.zeros(9, dtype=torch.long),
            {},
            ValueError,
            r"labels must have shape \(n\) with n=10",
        ),
        (
            torch.zeros(10, dtype=torch.long),
            dict(batch_size=0),
            ValueError,
            "batch_size must be an int >= 1",
        ),
        (
            torch.zeros(10, dtype=torch.long),
            dict(mean=float("nan")),
            ValueError,
            "mean must be a finite number, got nan",
        ),
        (
            torch.zeros(10, dtype=torch.long),
            dict(std=0.0),
            ValueError,
            "std must be a finite number > 0",
        ),
        (
            torch.zeros(10, dtype=torch.long),
            dict(flip=1),
            TypeError,
            "flip must be True or False",
        ),
        (
            torch.zeros(10, dtype=torch.long),
            dict(max_shift=-1),
            ValueError,
            "max_shift must be an int >= 0",
        ),
    ],
)
def test_image_batches_refuse_bad_arguments(labels, kwargs, error, match):
    with pytest.raises(error, match=match):
        image_batches(torch.rand(10, 1, 8, 8), labels, **{"batch_size": 4, **kwargs})


def test_image_batches_refuse_an_empty_set():
    empty = torch.rand(0, 1, 8, 8), torch.zeros(0, dtype=torch.long)
    with pytest.raises(ValueError, match="n_images must be an int >= 1, got 0"):
        image_batches(*empty, 4)


def test_confusion_matrix_sizes_and_empty_inputs():
    empty = torch.zeros(0, dtype=torch.long)
    assert torch.equal(
        confusion_matrix(empty, empty, 3), torch.zeros(3, 3, dtype=torch.long)
    )
    with pytest.raises(ValueError, match="n_classes must be an int >= 1"):
        confusion_matrix(empty, empty, 0)
    with pytest.raises(ValueError, match=r"labels must be in 0..2, got -1..0"):
        confusion_matrix(torch.tensor([0, 0]), torch.tensor([-1, 0]), 3)


def test_mean_attention_distance_checks_its_grid_and_weights():
    weights = torch.full((1, 1, 5, 5), 0.2)
    with pytest.raises(TypeError, match=r"grid must be \(rows, columns\)"):
        mean_attention_distance(weights, 4)
    with pytest.raises(ValueError, match="grid_rows must be an int >= 1"):
        mean_attention_distance(weights, (0, 4))
    with pytest.raises(ValueError, match="patch_size must be a finite number > 0"):
        mean_attention_distance(weights, (2, 2), -1)
    with pytest.raises(TypeError, match="weights must be a floating-point tensor"):
        mean_attention_distance(torch.ones(1, 1, 5, 5, dtype=torch.long), (2, 2))
    nan = weights.clone()
    nan[0, 0, 1, 1] = float("nan")
    assert torch.isnan(mean_attention_distance(nan, (2, 2))).all()  # documented


def test_weight_loading_helpers_refuse_wrong_types():
    with pytest.raises(TypeError, match="prefix must be a str"):
        vit_rows(prefix=1)
    with pytest.raises(TypeError, match="head must be True or False"):
        vit_rows(head="yes")
    with pytest.raises(ValueError, match=r"kernel must have shape \(d_model c p1 p2\)"):
        conv_kernels_as_rows(torch.rand(4, 3, 2))
    with pytest.raises(TypeError, match="their_state_dict must be a state dict"):
        vit_state_dict([("cls_token", torch.zeros(1))], SMALL)
    with pytest.raises(TypeError, match="model must be a ViT, got Linear"):
        load_hf_vit_state_dict(nn.Linear(2, 2), {})


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_vit_names_images_of_another_dtype_than_its_weights(dtype):
    """Issue 32: float16/float64 images met torch's matmul dtype error before."""
    from lib.vit import ViT, ViTConfig

    model = ViT(
        ViTConfig(image_size=28, patch_size=7, n_classes=10, d_model=32, n_heads=4,
                  n_layers=1)
    )  # fmt: skip
    images = torch.rand(2, 1, 28, 28, dtype=dtype)
    with pytest.raises(
        TypeError,
        match=f"images {dtype}, weight torch.float32; convert them to the model.s dtype",
    ):
        model(images)
    assert model(images.float()).shape == (2, 10)


def test_mnist_vit_sizes_take_overrides_and_name_unknown_ones():
    from lib.vit_training import SHIPPED_VIT_SIZES, mnist_vit_sizes

    cfg, budget = mnist_vit_sizes("smoke", **SHIPPED_VIT_SIZES)
    assert (cfg.d_model, cfg.n_layers, cfg.patch_size) == (96, 4, 7)
    assert budget == {
        k: SHIPPED_VIT_SIZES[k] for k in ("steps", "batch_size", "lr", "max_shift")
    }
    with pytest.raises(ValueError, match=r"no size \['width'\]"):
        mnist_vit_sizes("smoke", width=3)


def test_mnist_split_holds_out_a_thousand_and_refuses_a_bad_size():
    from lib.datasets import mnist_split

    train_x, train_y, val_x, val_y = mnist_split()
    assert train_x.shape == (9_000, 1, 28, 28) and val_x.shape == (1_000, 1, 28, 28)
    assert len(train_y) == 9_000 and set(train_y.tolist()) == set(range(10))
    assert 0.0 <= float(train_x.min()) and float(train_x.max()) <= 1.0
    assert torch.equal(mnist_split()[3], val_y)  # the same split every time
    for bad in (0, 10_000, 2.5, True):
        with pytest.raises(ValueError, match="n_val must be an int in 1..9999"):
            mnist_split(bad)


def test_vit_run_returns_a_recipes_result_and_its_file():
    """Chapter 10's recipe at a tiny size (two steps): the shape of chapter 8's results,
    the same seed the same model, and the file lib.shipped ships from it."""
    from lib.datasets import mnist_split
    from lib.vit_training import mnist_vit_files, mnist_vit_sizes, vit_run

    tiny = dict(steps=2, d_model=16, n_layers=1, d_ff=16, batch_size=8)
    result = vit_run("smoke", sizes=tiny, seed=3, device="cpu", progress=False)
    assert {"metrics", "curves", "config", "samples", "models", "tokenizer"} <= set(
        result
    )
    cfg, budget = mnist_vit_sizes("smoke", **tiny)
    assert result["config"] == cfg and result["budget"] == budget
    metrics, model = result["metrics"], result["models"]["vit"]
    assert metrics["steps"] == 2 and metrics["val_images"] == 1000
    assert metrics["parameters"] == sum(p.numel() for p in model.parameters())
    assert (
        metrics["val_accuracy_low"]
        <= metrics["val_accuracy"]
        <= metrics["val_accuracy_high"]
    )
    right = (result["predictions"] == mnist_split()[3]).float().mean()
    assert float(right) == pytest.approx(metrics["val_accuracy"])  # the held-out 1,000
    assert (
        result["curves"]["train"]["step"] == [1, 2]
        and len(result["curves"]["validation"]["step"]) == 2
    )
    again = vit_run("smoke", sizes=tiny, seed=3, device="cpu", progress=False)
    assert torch.equal(again["models"]["vit"].head.weight, model.head.weight)
    ((name, file),) = mnist_vit_files(result).items()
    assert name == "vit-mnist" and file["model"] is model and file["metrics"] is metrics
    assert (file["inputs"]["mean"], file["inputs"]["std"]) == (
        result["mean"],
        result["std"],
    )
    with pytest.raises(ValueError, match=r"no size \['width'\]"):
        vit_run("smoke", sizes=dict(width=3))
