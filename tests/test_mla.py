"""Unit tests of multi-head latent attention in lib.models (chapter 7): the latent cache,
the absorbed decoding form, and bad input."""

from __future__ import annotations

import pytest
import torch

from lib.attention import kv_cache_bytes
from lib.models import LatentCache, MultiHeadLatentAttention

D_MODEL, N_HEADS, D_LATENT = 48, 4, 24


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _layer(**kwargs) -> MultiHeadLatentAttention:
    return MultiHeadLatentAttention(D_MODEL, N_HEADS, D_LATENT, **kwargs).eval()


def _decode(layer, x, prompt_len, absorbed):
    """Outputs of feeding ``x`` (batch seq d_model) through the cache: the prompt, then
    one position at a time."""
    out, cache = layer(x[:, :prompt_len], use_cache=True, absorbed=absorbed)
    outputs = [out]
    for t in range(prompt_len, x.shape[1]):
        step = dict(past=cache, use_cache=True, absorbed=absorbed)
        out, cache = layer(x[:, t : t + 1], **step)
        outputs.append(out)
    return torch.cat(outputs, dim=1), cache


def test_the_cache_holds_only_the_latent():
    layer = _layer()
    x = torch.randn(3, 10, D_MODEL)
    with torch.no_grad():
        out, cache = layer(x, use_cache=True)
    assert out.shape == (3, 10, D_MODEL)
    assert isinstance(cache, LatentCache)
    assert cache.latent.shape == (3, 10, D_LATENT) and cache.seq_len == 10
    assert torch.allclose(cache.latent, layer.kv_down(x))
    # what a layer caches per token, against multi-head attention of the same heads
    d_head = D_MODEL // N_HEADS
    mha = kv_cache_bytes(1, N_HEADS, d_head, 1, bytes_per_value=4)
    mla = cache.latent[0, 0].numel() * cache.latent.element_size()
    assert mla == D_LATENT * 4 and mha == 2 * N_HEADS * d_head * 4
    assert mha == 4 * mla  # 2·4·12 = 96 numbers against 24


@pytest.mark.parametrize("d_head", [None, 7])
def test_absorbed_form_equals_the_expanded_one(d_head):
    layer = _layer(d_head=d_head)
    x = torch.randn(2, 9, D_MODEL, dtype=torch.float64)
    layer = layer.double()
    with torch.no_grad():
        expanded = layer(x)
        absorbed = layer(x, absorbed=True)
    assert torch.allclose(absorbed, expanded, atol=1e-12)
    assert (absorbed - expanded).abs().max() < 1e-12 < expanded.abs().max()


@pytest.mark.parametrize("absorbed", [False, True])
def test_decoding_with_the_latent_cache_equals_the_full_pass(absorbed):
    layer = _layer()
    x = torch.randn(2, 11, D_MODEL)
    with torch.no_grad():
        full = layer(x)
        decoded, cache = _decode(layer, x, 4, absorbed)
    assert torch.allclose(decoded, full, atol=1e-5)
    assert cache.latent.shape == (2, 11, D_LATENT)


def test_attention_is_causal():
    layer = _layer()
    x = torch.randn(1, 8, D_MODEL)
    y = x.clone()
    y[:, 5] += 1.0
    with torch.no_grad():
        for absorbed in (False, True):
            before, after = layer(x, absorbed=absorbed), layer(y, absorbed=absorbed)
            moved = (after - before).abs().amax(dim=-1)[0] > 1e-6
            assert moved.nonzero().flatten().tolist() == [5, 6, 7]


def test_select_and_crop_of_the_cache():
    layer = _layer()
    x = torch.randn(3, 6, D_MODEL)
    with torch.no_grad():
        _, cache = layer(x, use_cache=True)
        rows = torch.tensor([2, 2, 0])
        selected = cache.select(rows)
        assert torch.equal(selected.latent, cache.latent[rows])
        # decoding on from the gathered rows equals decoding those rows of the batch
        new = torch.randn(3, 1, D_MODEL)
        out, _ = layer(new, past=selected, use_cache=True, absorbed=True)
        full = layer(torch.cat([x[rows], new], dim=1))
    assert torch.allclose(out, full[:, -1:], atol=1e-5)
    cropped = cache.crop(4)
    assert cropped.seq_len == 4 and torch.equal(cropped.latent, cache.latent[:, :4])
    with pytest.raises(ValueError, match="length"):
        cache.crop(7)


def test_gradients_reach_every_weight():
    layer = MultiHeadLatentAttention(D_MODEL, N_HEADS, D_LATENT)
    layer(torch.randn(2, 5, D_MODEL)).pow(2).mean().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="d_latent"):
        MultiHeadLatentAttention(D_MODEL, N_HEADS, 0)
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadLatentAttention(50, 4, 8)
    layer = _layer()
    with pytest.raises(ValueError, match="d_model"):
        layer(torch.randn(2, 5, D_MODEL + 1))
    with pytest.raises(TypeError, match="absorbed"):
        layer(torch.randn(2, 5, D_MODEL), absorbed=1)
    with pytest.raises(TypeError, match="past"):
        layer(torch.randn(2, 5, D_MODEL), past=torch.zeros(2, 3, D_LATENT))
    _, cache = layer(torch.randn(2, 5, D_MODEL), use_cache=True)
    with pytest.raises(ValueError, match="batch"):
        layer(torch.randn(3, 1, D_MODEL), past=cache)
