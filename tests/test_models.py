"""Unit tests of lib.models (chapter 7): configuration, the stacks, the caches, bad input."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib.attention import set_attention_backend
from lib.models import (
    BERT,
    GPT,
    T5,
    Decoder,
    Encoder,
    ModelCache,
    SequenceClassifier,
    TransformerConfig,
    count_parameters,
    init_t5_weights,
    init_weights,
    kv_cache_bytes_per_token,
    parameter_breakdown,
)

SMALL = dict(vocab_size=97, d_model=32, n_heads=4, n_layers=2, max_len=40)
CONFIGS = {
    "gpt2": TransformerConfig(**SMALL, activation="gelu_tanh"),
    "llama": TransformerConfig(
        **SMALL,
        n_kv_heads=2,
        positions="rope",
        norm="rmsnorm",
        activation="swiglu",
        bias=False,
        tie_embeddings=False,
    ),
    "alibi": TransformerConfig(**SMALL, positions="alibi"),
    "sinusoidal_post": TransformerConfig(
        **SMALL, positions="sinusoidal", norm_position="post"
    ),
    "t5_positions": TransformerConfig(
        **SMALL, positions="t5", attn_scale=1.0, d_head=12
    ),
}
T5_CFG = TransformerConfig(
    **SMALL, n_decoder_layers=3, positions="t5", norm="rmsnorm", activation="relu",
    bias=False, attn_scale=1.0, d_head=8,
)  # fmt: skip


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _ids(batch=2, seq=12, vocab=97):
    return torch.randint(0, vocab, (batch, seq))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpt_cached_steps_equal_the_full_forward(name):
    model = GPT(CONFIGS[name]).eval()
    ids = _ids()
    with torch.no_grad():
        full = model(ids)
        logits, cache = model.step(ids[:, :5])
        pieces = [logits]
        for t in range(5, ids.shape[1]):
            logits, cache = model.step(ids[:, t : t + 1], cache)
            pieces.append(logits)
    assert (torch.cat(pieces, 1) - full).abs().max() < 1e-5
    assert cache.seq_len == ids.shape[1] and len(cache.self_attn) == 2


@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpt_is_causal(name):
    model = GPT(CONFIGS[name]).eval()
    ids = _ids()
    changed = ids.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 97
    with torch.no_grad():
        a, b = model(ids), model(changed)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-5)
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-3)


def test_bert_is_bidirectional_and_ignores_padding():
    cfg = TransformerConfig(
        **SMALL, norm_position="post", n_token_types=2, embedding_norm=True
    )
    model = BERT(cfg).eval()
    ids = _ids()
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 97
    with torch.no_grad():
        assert not torch.allclose(model(ids)[:, 0], model(changed)[:, 0], atol=1e-4)
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[1, 7:] = False  # sequence 1 has 7 real tokens
        padded = model(ids, mask=mask)
        other_pad = ids.clone()
        other_pad[1, 7:] = 3
        assert torch.allclose(
            padded[1, :7], model(other_pad, mask=mask)[1, :7], atol=1e-5
        )
        alone = model(ids[1:, :7])
        assert torch.allclose(padded[1, :7], alone[0], atol=1e-5)


def test_t5_cached_decoding_and_beam_reordering():
    model = T5(T5_CFG).eval()
    src, tgt = _ids(seq=9), _ids(seq=7)
    with torch.no_grad():
        full = model(src, tgt)
        bound = model.bind(src)
        logits, cache = bound.step(tgt[:, :1])
        pieces = [logits]
        for t in range(1, 7):
            logits, cache = bound.step(tgt[:, t : t + 1], cache)
            pieces.append(logits)
        assert (torch.cat(pieces, 1) - full).abs().max() < 1e-5
        # Beam search: duplicate row 1 and drop row 0; decoding continues as for that batch.
        order = torch.tensor([1, 1])
        _, cache = bound.step(tgt[:, :4])
        logits, _ = bound.step(tgt[order, 4:5], cache.select(order))
        reference = model(src[order], tgt[order, :5])[:, 4:5]
        assert (logits - reference).abs().max() < 1e-5
    assert cache.crop(2).seq_len == 2 and cache.crop(2).cross_attn[0].seq_len == 9


def test_t5_with_source_padding_matches_the_unpadded_source():
    model = T5(T5_CFG).eval()
    src, tgt = _ids(seq=9), _ids(seq=5)
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[0, 6:] = False
    with torch.no_grad():
        padded = model(src, tgt, src_mask=mask)[0]
        alone = model(src[:1, :6], tgt[:1])[0]
    assert (padded - alone).abs().max() < 1e-5


def test_backends_agree_on_a_whole_model():
    model = GPT(CONFIGS["alibi"]).eval()
    ids = _ids()
    with torch.no_grad():
        on_sdpa = model(ids)
        on_math = set_attention_backend(model, "math")(ids)
    assert (on_sdpa - on_math).abs().max() < 1e-5


def test_init_weights_scales_residual_projections():
    cfg = TransformerConfig(vocab_size=500, d_model=256, n_heads=4, n_layers=8)
    model = GPT(cfg)
    block = model.decoder.blocks[0]
    assert abs(block.self_attn.sublayer.qkv_proj.weight.std().item() - 0.02) < 0.002
    expected = 0.02 / math.sqrt(2 * 8)
    assert abs(block.self_attn.sublayer.out_proj.weight.std().item() - expected) < 0.001
    assert abs(block.ffn.sublayer.w_out.weight.std().item() - expected) < 0.001
    assert torch.count_nonzero(block.ffn.sublayer.w_in.bias) == 0
    assert init_weights(model) is model


@pytest.mark.parametrize("activation", ["relu", "geglu"])
def test_t5_initialisation_follows_mesh_tensorflow(activation):
    d_model, n_heads, d_head, d_ff = 256, 4, 32, 768
    cfg = TransformerConfig(
        vocab_size=400, d_model=d_model, n_heads=n_heads, n_layers=1, d_head=d_head,
        d_ff=d_ff, positions="t5", norm="rmsnorm", activation=activation, bias=False,
        attn_scale=1.0, tie_embeddings=activation == "relu",
    )  # fmt: skip
    model = T5(cfg)
    inner = n_heads * d_head
    expected = {"embed.tokens.weight": 1.0}
    if not cfg.tie_embeddings:
        expected["head.weight"] = 1.0
    for stack in ("encoder", "decoder"):
        table = f"{stack}.position_bias.relative_attention_bias.weight"
        expected[table] = d_model**-0.5
        block = f"{stack}.blocks.0."
        expected[block + "ffn.sublayer.w_in.weight"] = d_model**-0.5
        expected[block + "ffn.sublayer.w_out.weight"] = d_ff**-0.5
        attentions = ["self_attn"] + ["cross_attn"] * (stack == "decoder")
        for attn in attentions:
            expected[block + f"{attn}.sublayer.out_proj.weight"] = inner**-0.5
    weights = dict(model.named_parameters())
    for name, std in expected.items():
        assert abs(weights[name].std().item() / std - 1) < 0.06, name
    for attn in (model.encoder.blocks[0].self_attn, model.decoder.blocks[0].cross_attn):
        q, k, v = attn.sublayer.qkv_proj.weight.split([inner] * 3)
        stds = ((d_model * d_head) ** -0.5, d_model**-0.5, d_model**-0.5)
        for part, std in zip((q, k, v), stds):
            assert abs(part.std().item() / std - 1) < 0.06
            assert abs(part.mean().item()) < 0.1 * std
    # the point of the query's size: unscaled scores of unit-RMS inputs have std ~ 1
    x = torch.randn(4096, d_model)
    projection = model.encoder.blocks[0].self_attn.sublayer.qkv_proj
    q, k, _ = projection(x).split([inner] * 3, dim=-1)
    scores = (q * k.roll(1, 0)).unflatten(-1, (n_heads, d_head)).sum(-1)
    assert abs(scores.std().item() - 1) < 0.1
    assert init_t5_weights(model) is model
    with pytest.raises(TypeError, match="T5"):
        init_t5_weights(GPT(CONFIGS["gpt2"]))


def test_parameter_counts_and_tying():
    tied, untied = (
        GPT(CONFIGS["gpt2"]),
        GPT(replace_cfg(CONFIGS["gpt2"], tie_embeddings=False)),
    )
    assert tied.head.weight is tied.embed.tokens.weight
    assert count_parameters(untied) - count_parameters(tied) == 97 * 32
    parts = parameter_breakdown(untied)
    assert parts["head"] == 97 * 32 and sum(parts.values()) == count_parameters(untied)


def replace_cfg(cfg, **changes):
    from dataclasses import replace

    return replace(cfg, **changes)


def test_kv_cache_bytes_per_token():
    cfg = CONFIGS["llama"]  # 2 layers, 2 kv heads of 8
    assert kv_cache_bytes_per_token(cfg) == 2 * 2 * 2 * 8 * 2
    assert kv_cache_bytes_per_token(T5_CFG, bytes_per_value=4) == 2 * 3 * 4 * 8 * 4


def test_encoder_takes_embedded_input():
    cfg = TransformerConfig(**SMALL, positions="none")
    encoder = Encoder(cfg).eval()
    x = torch.randn(2, 5, 32)
    assert encoder(x).shape == (2, 5, 32)
    with pytest.raises(ValueError, match="takes embedded input"):
        encoder(_ids())
    with pytest.raises(ValueError, match="needs context"):
        Decoder(cfg, cross_attention=True)(x)


def test_a_decoder_given_a_cache_needs_use_cache():
    """Without use_cache the decoder would ignore the cache: refused, not silently
    wrong."""
    decoder = Decoder(TransformerConfig(**SMALL)).eval()
    x = torch.randn(2, 5, 32)
    _, cache = decoder(x[:, :4], use_cache=True)
    stepped, _ = decoder(x[:, 4:], cache=cache, use_cache=True)
    assert torch.allclose(stepped, decoder(x)[:, 4:], atol=1e-5)
    with pytest.raises(ValueError, match="a cache needs use_cache=True"):
        decoder(x[:, 4:], cache=cache)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(positions="rotary"), "positions must be one of 'learned'"),
        (dict(norm="batchnorm"), "norm must be one of"),
        (dict(activation="tanh"), "activation must be one of"),
        (dict(norm_position="middle"), "norm_position must be one of"),
        (dict(attn_backend="flashy"), "attn_backend must be one of"),
        (dict(n_heads=5), "n_heads=5 does not divide d_model=32"),
        (dict(n_kv_heads=3), "n_kv_heads=3 does not divide n_heads=4"),
        (dict(d_model=0), "d_model must be an int >= 1"),
        (dict(n_layers=2.0), "n_layers must be an int, got float"),
        (dict(dropout=1.0), "dropout must be a probability"),
        (dict(n_token_types=-1), "n_token_types must be an int >= 0"),
        (dict(positions="rope", d_head=7), "RoPE needs an even d_head"),
        (dict(bias=1), "bias must be True or False"),
        (dict(attn_scale=float("nan")), "attn_scale must be a finite"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(qk_norm="yes"), "qk_norm must be True or False"),
        (dict(n_experts=-1), "n_experts must be an int >= 0"),
        (dict(n_experts=2.0), "n_experts must be an int, got float"),
        (dict(n_experts=4, experts_top_k=0), "experts_top_k must be an int >= 1"),
        (dict(n_experts=1), "experts_top_k=2 exceeds n_experts=1"),
        (dict(logit_softcap=0.0), "logit_softcap must be a finite number > 0"),
        (dict(logit_softcap=-30.0), "logit_softcap must be a finite number > 0"),
        (dict(logit_softcap=float("inf")), "logit_softcap must be a finite"),
        (dict(logit_softcap="30"), "logit_softcap must be a number"),
    ],
)
def test_bad_configuration_is_a_clear_error(changes, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TransformerConfig(**{**SMALL, **changes})


def test_bad_model_input_is_a_clear_error():
    model = GPT(CONFIGS["gpt2"]).eval()
    with pytest.raises(ValueError, match="exceed max_len=40"):
        model(_ids(seq=41))
    _, cache = model.step(_ids(seq=39))
    with pytest.raises(ValueError, match="exceed max_len=40"):
        model.step(_ids(seq=2), cache)
    with pytest.raises(ValueError, match=r"ids must be in 0\.\.96, got 0\.\.97"):
        model(torch.tensor([[0, 97]]))
    with pytest.raises(TypeError, match="int64 or int32"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"must be \(batch, seq\)"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"mask must be \(batch, k_pos\)"):
        model(_ids(), mask=torch.ones(2, 5, dtype=torch.bool))
    t5 = T5(T5_CFG)
    with pytest.raises(ValueError, match="T5 needs encoder input"):
        t5.encode(None)
    with pytest.raises(ValueError, match="needs decoder input"):
        t5(_ids())
    bert = BERT(TransformerConfig(**SMALL))
    with pytest.raises(
        ValueError, match="token_types given, but the config has n_token_types=0"
    ):
        bert(_ids(), token_types=torch.zeros(2, 12, dtype=torch.long))


def test_model_cache_select_checks_indices():
    model = GPT(CONFIGS["gpt2"]).eval()
    _, cache = model.step(_ids())
    assert isinstance(cache, ModelCache) and cache.batch_size == 2
    with pytest.raises(IndexError, match="out of range for a batch of 2"):
        cache.select(torch.tensor([2]))
    assert cache.select(torch.tensor([0, 0, 1])).batch_size == 3


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decoding_equals_the_full_forward(name):
    """GPT.step with a cache against one forward pass over all the ids (one implementation
    of each layer serves both): the prompt, one token, several tokens after a cache."""
    model = GPT(CONFIGS[name]).eval()
    ids = _ids(seq=14)
    with torch.no_grad():
        fast, cache = model.step(ids[:, :6])
        for new in (ids[:, 6:7], ids[:, 7:11], ids[:, 11:14]):
            logits, cache = model.step(new, cache)
            fast = torch.cat([fast, logits], dim=1)
        slow = model(ids)
    assert (fast - slow).abs().max() < 1e-5 and cache.seq_len == 14


def test_decoding_in_training_mode_uses_the_modules():
    model = GPT(replace_cfg(CONFIGS["gpt2"], dropout=0.5)).train()
    torch.manual_seed(1)
    a, _ = model.step(_ids())
    torch.manual_seed(1)
    b = model(_ids())  # the same draws of dropout: the same path
    assert torch.equal(a, b)  # the same dropout draws: the module path
    assert not torch.equal(a, model.eval()(_ids()))


# -- issue 19: no silent wrong answer -------------------------------------------------


def test_gpt_refuses_a_left_padded_mask():
    model = GPT(CONFIGS["gpt2"]).eval()
    ids = _ids()
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, :3] = False  # row 1: three pads, then the text
    with pytest.raises(ValueError, match="mask row 1 is left-padded"):
        model(ids, mask=mask)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 9:] = False  # right padding: fine, and equal to the row alone
    with torch.no_grad():
        padded, alone = model(ids, mask=mask)[1, :9], model(ids[1:, :9])[0]
    assert (padded - alone).abs().max() < 1e-5


def test_kv_cache_bytes_counts_the_blocks_a_model_builds():
    t5 = T5(T5_CFG)  # 3 decoder blocks
    assert (
        kv_cache_bytes_per_token(t5)
        == kv_cache_bytes_per_token(T5_CFG)
        == 2 * 3 * 4 * 8 * 2
    )
    gpt = GPT(CONFIGS["llama"])
    assert kv_cache_bytes_per_token(gpt) == 2 * 2 * 2 * 8 * 2
    with pytest.raises(ValueError, match="GPT builds n_layers=2 blocks"):
        GPT(replace_cfg(CONFIGS["gpt2"], n_decoder_layers=3))
    with pytest.raises(TypeError, match="model_or_cfg must be"):
        kv_cache_bytes_per_token("gpt2")


def _model_calls():
    gpt, bert = (
        GPT(CONFIGS["gpt2"]).eval(),
        BERT(TransformerConfig(**SMALL, n_token_types=2)),
    )
    t5 = T5(T5_CFG).eval()
    ids = _ids()
    _, cache = gpt.step(ids)
    return [
        (lambda: GPT({"vocab_size": 97}), TypeError, "cfg must be a TransformerConfig"),
        (lambda: T5(T5_CFG, start_id=97), ValueError, "start_id must be an int in 0..96"),
        (lambda: gpt(ids[:, :0]), ValueError, r"ids must be \(batch, seq\)"),
        (lambda: gpt(ids.to(torch.int16)), TypeError, "int64 or int32"),
        (lambda: gpt(ids, mask=torch.ones(2, 12)), TypeError, "mask must be a boolean"),
        (lambda: gpt.step(ids, cache="cache"), TypeError, "cache must be a ModelCache"),
        (lambda: gpt.step(ids[:1], cache), ValueError, "cache must fit the ids"),
        (lambda: cache.crop(13), ValueError, r"length must be an int in 0..12"),
        (lambda: cache.select([0.5]), TypeError, "indices must be an integer tensor"),
        (lambda: bert(ids, token_types=torch.zeros(2, 5, dtype=torch.long)), ValueError,
         "token_types must have shape"),
        (lambda: bert(ids, token_types=torch.full((2, 12), 2)), ValueError,
         r"token_types must be in 0..1"),
        # issue 32: a Python list is not a tensor, whatever its ids
        (lambda: gpt([[1, 2, 3]]), TypeError, "ids must be a tensor, got list"),
        (lambda: t5.bind(ids).step(ids[:1, :1]), ValueError, "ids must have shape"),
        (lambda: t5.decode(ids, torch.zeros(3, 4, 32)), ValueError, "context must have"),
        (lambda: init_weights(gpt, std=0.0), ValueError, "std must be a finite number > 0"),
        (lambda: count_parameters("gpt"), TypeError, "model must be a Module"),
        (lambda: Decoder(CONFIGS["gpt2"])(torch.zeros(2, 3, 32), use_cache=1), TypeError,
         "use_cache must be True or False"),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(17))
def test_every_model_entry_names_the_bad_argument(index):
    call, error, match = _model_calls()[index]
    with pytest.raises(error, match=match):
        call()


def test_positions_beyond_the_rope_table_are_refused():
    model = GPT(CONFIGS["llama"]).eval()  # max_len 40
    with pytest.raises(
        ValueError, match="exceed max_len=40 of its rope position table"
    ):
        model(_ids(seq=41))


def test_sequence_classifier_gives_one_logit_per_class_and_checks_ids_like_bert():
    bert = BERT(TransformerConfig(**SMALL)).eval()
    classifier = SequenceClassifier(bert, n_classes=3).eval()
    assert classifier.encoder is bert.encoder and classifier.embed is bert.embed
    ids, mask = _ids(), torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False  # the second row's padding does not count in its mean
    logits = classifier(ids, mask)
    assert logits.shape == (2, 3)
    torch.testing.assert_close(logits[1], classifier(ids[1:, :7])[0])
    with pytest.raises(ValueError, match=r"ids must be in 0\.\.96, got 0\.\.97"):
        classifier(torch.tensor([[0, 97]]))
    with pytest.raises(ValueError, match=r"mask must be \(batch, k_pos\)"):
        classifier(ids, torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="takes a BERT"):
        SequenceClassifier(GPT(CONFIGS["gpt2"]), 3)


def test_lazily_loaded_backends_are_valid_config_names_in_a_fresh_process():
    """lib.flash registers flash_torch when imported; the config must know the name
    before that (it failed in a process that had not imported lib.flash)."""
    code = (
        "import sys; from lib.models import TransformerConfig; "
        "cfg = TransformerConfig(vocab_size=8, d_model=8, n_heads=2, n_layers=1, "
        "max_len=8, attn_backend='flash_torch'); "
        "assert 'lib.flash' not in sys.modules; print(cfg.attn_backend)"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "flash_torch"


def test_max_positions_bounds_only_tables_indexed_by_position():
    """Learned, sinusoidal and RoPE tables hold max_len positions; ALiBi, T5's
    buckets and no positions at all have no such bound."""
    from lib.models import POSITION_KINDS

    limits = {
        kind: TransformerConfig(
            vocab_size=10, d_model=8, n_heads=2, n_layers=1, positions=kind, max_len=12
        ).max_positions
        for kind in POSITION_KINDS
    }
    assert limits == {
        "learned": 12,
        "sinusoidal": 12,
        "rope": 12,
        "alibi": None,
        "t5": None,
        "none": None,
    }


# -- issue 32: bad input, one behaviour ------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt", "bert"])
def test_a_list_of_ids_is_refused_as_not_a_tensor(kind):
    model = GPT(CONFIGS["gpt2"]) if kind == "gpt" else BERT(TransformerConfig(**SMALL))
    as_list = r"ids must be a tensor, got list: torch\.tensor"
    with pytest.raises(TypeError, match=as_list):
        model([[1, 2, 3]])
    as_floats = "ids must be int64 or int32 token ids, got torch.float32"
    with pytest.raises(TypeError, match=as_floats):
        model(torch.zeros(1, 3))


def test_t5_source_row_with_no_real_token_reads_nothing_on_every_device():
    # it was refused on a CPU (the check read the mask) and computed silently on a GPU; now
    # it is computed everywhere, with no read of the mask: cross-attention over a row with
    # no key gives zeros, so that row's logits do not depend on its source at all
    t5 = T5(T5_CFG).eval()
    src, tgt = _ids(), _ids(seq=5)
    src_mask = torch.ones(2, 12, dtype=torch.bool)
    src_mask[1] = False
    logits = t5(src, tgt, src_mask=src_mask)
    assert torch.isfinite(logits).all()
    other = src.clone()
    other[1] = (other[1] + 7) % T5_CFG.vocab_size
    again = t5(other, tgt, src_mask=src_mask)
    assert torch.equal(again[1], logits[1]) and torch.equal(again[0], logits[0])
    # the decoder's cross-attention over that row is exactly zero
    block = t5.decoder.blocks[0]
    context = t5.encode(src, src_mask)
    h = torch.randn(2, 5, T5_CFG.d_model)
    out = block.cross_attn.sublayer(h, context, mask=src_mask[:, None, None, :])
    bias = block.cross_attn.sublayer.out_proj.bias
    expected = torch.zeros(5, T5_CFG.d_model) if bias is None else bias.expand(5, -1)
    assert torch.allclose(out[1], expected) and not torch.allclose(out[0], expected)


def test_a_checked_model_call_checks_once_and_not_inside(monkeypatch):
    import lib._checks as checks
    import lib.models as models

    counts = {"ids": 0, "layers": 0}
    real_ids, real_input = models._check_ids, checks.layer_input

    def count_ids(*args, **kwargs):
        counts["ids"] += 1
        return real_ids(*args, **kwargs)

    def count_layers(*args, **kwargs):
        counts["layers"] += 1
        return real_input(*args, **kwargs)

    monkeypatch.setattr(models, "_check_ids", count_ids)
    monkeypatch.setattr(checks, "layer_input", count_layers)
    model = GPT(CONFIGS["llama"]).eval()
    model(_ids())
    assert counts == {"ids": 1, "layers": 0}  # the layers trust the model's door
    with checks.trusting():
        model.step(_ids())  # a loop's own ids: not checked at all
    assert counts == {"ids": 1, "layers": 0}
    model.decoder.blocks[0].ffn.sublayer(torch.randn(2, 3, CONFIGS["llama"].d_model))
    assert counts["layers"] == 1  # a layer called directly checks its input
    assert not checks.trusted()


# ------------------------------------------------------------- the modern switches (issue 41)

SWITCHES = {
    "baseline": {},
    "qk_norm": dict(qk_norm=True),
    "relu2": dict(activation="relu2"),
    "moe": dict(n_experts=4, experts_top_k=2),
    "softcap": dict(logit_softcap=5.0),
    "untied": dict(tie_embeddings=False),
}


def _char_gpt(**switches):
    cfg = TransformerConfig(
        vocab_size=65, d_model=32, n_heads=4, n_layers=2, max_len=64, positions="rope",
        **switches,
    )  # fmt: skip
    return GPT(cfg)


@pytest.mark.parametrize("name", list(SWITCHES))
def test_a_gpt_with_each_switch_trains_with_falling_loss(name):
    from lib.ffn import moe_balance_loss

    model = _char_gpt(**SWITCHES[name])
    # a learnable sequence: each token is the previous one plus 1 (mod 65)
    start = torch.randint(0, 65, (8, 1))
    ids = (start + torch.arange(33)) % 65
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), ids[:, 1:].flatten()
        )
        total = loss + 0.01 * moe_balance_loss(model)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    if name == "moe":
        assert moe_balance_loss(model).item() >= 1.0 - 1e-6  # set by the last forward
    else:
        assert moe_balance_loss(model).item() == 0.0


@pytest.mark.parametrize("name", ["qk_norm", "softcap", "moe", "relu2"])
def test_cached_decoding_equals_the_full_forward_with_each_switch(name):
    model = _char_gpt(**SWITCHES[name]).eval()
    ids = _ids(seq=14, vocab=65)
    with torch.no_grad():
        full = model(ids)
        logits, cache = model.step(ids[:, :5])
        pieces = [logits]
        for t in range(5, 14):
            logits, cache = model.step(ids[:, t : t + 1], cache)
            pieces.append(logits)
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5)


def test_generation_with_qk_norm_and_softcap_equals_greedy_argmax_of_the_full_forward():
    from lib.generation import generate

    model = _char_gpt(qk_norm=True, logit_softcap=3.0).eval()
    prompt = _ids(batch=1, seq=4, vocab=65)
    tokens = generate(model, prompt, max_new_tokens=6, temperature=0)
    assert tokens.shape == (1, 10)
    with torch.no_grad():
        for t in range(4, tokens.shape[1]):
            assert tokens[0, t] == model(tokens[:, :t])[0, -1].argmax()


def test_logit_softcap_is_the_formula_and_bounds_the_logits():
    uncapped = _char_gpt()
    with torch.no_grad():
        uncapped.head.weight.mul_(30)  # logits far beyond the cap
    for cap in (1.0, 5.0):
        capped = _char_gpt(logit_softcap=cap)
        capped.load_state_dict(uncapped.state_dict())
        ids = _ids(seq=10, vocab=65)
        with torch.no_grad():
            z, z_capped = uncapped(ids), capped(ids)
        assert z.abs().max() > 3 * cap
        assert torch.allclose(z_capped, cap * torch.tanh(z / cap), atol=1e-5)
        # inside (-cap, cap) in exact arithmetic; fp32's tanh rounds to ±1 beyond ~9
        assert z_capped.abs().max() <= cap
        moderate = z.abs() < 3 * cap
        assert (z_capped[moderate].abs() < cap).all()


def test_logit_softcap_applies_to_bert_and_t5_too():
    bert_cfg = TransformerConfig(**SMALL, norm_position="post", embedding_norm=True)
    bert = BERT(bert_cfg).eval()
    capped = BERT(replace_cfg(bert_cfg, logit_softcap=0.5)).eval()
    capped.load_state_dict(bert.state_dict())
    ids = _ids()
    with torch.no_grad():
        assert torch.allclose(capped(ids), 0.5 * torch.tanh(bert(ids) / 0.5), atol=1e-5)
    t5 = T5(T5_CFG).eval()
    t5_capped = T5(replace_cfg(T5_CFG, logit_softcap=0.5)).eval()
    t5_capped.load_state_dict(t5.state_dict())
    src, tgt = _ids(seq=7), _ids(seq=5)
    with torch.no_grad():
        want = 0.5 * torch.tanh(t5(src, tgt) / 0.5)
        assert torch.allclose(t5_capped(src, tgt), want, atol=1e-5)
        bound = t5_capped.bind(src)
        logits, cache = bound.step(tgt[:, :1])
        pieces = [logits]
        for t in range(1, 5):
            logits, cache = bound.step(tgt[:, t : t + 1], cache)
            pieces.append(logits)
        assert torch.allclose(torch.cat(pieces, 1), want, atol=1e-5)


def test_the_switches_build_the_layers_they_name():
    from lib.ffn import MoEFeedForward

    model = _char_gpt(qk_norm=True, n_experts=3, experts_top_k=1, activation="relu2")
    block = model.decoder.blocks[0]
    assert block.self_attn.sublayer.qk_norm
    moe = block.ffn.sublayer
    assert isinstance(moe, MoEFeedForward)
    assert (moe.n_experts, moe.top_k, moe.d_ff, moe.activation) == (3, 1, 128, "relu2")
    # every expert's output projection gets the residual scaling of init_weights
    expected = 0.02 / math.sqrt(2 * 2)
    w_out = torch.cat([e.w_out.weight.flatten() for e in moe.experts])
    assert abs(w_out.std().item() - expected) < 0.002
    parts = parameter_breakdown(model)
    assert parts["ffn"] == 2 * (3 * (2 * 32 * 128 + 128 + 32) + 3 * 32)
    assert sum(parts.values()) == count_parameters(model)
    gated = _char_gpt(n_experts=2, activation="swiglu")
    assert type(gated.decoder.blocks[0].ffn.sublayer.experts[0]).__name__ == (
        "GatedFeedForward"
    )


def test_untied_gpt_has_its_own_head_that_trains_apart_from_the_embedding():
    model = _char_gpt(tie_embeddings=False)
    assert model.head.weight is not model.embed.tokens.weight
    assert count_parameters(model) - count_parameters(_char_gpt()) == 65 * 32
    before = model.head.weight.detach().clone()
    ids = torch.randint(0, 30, (4, 12))  # tokens 30..64 never appear
    logits = model(ids)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
    assert (model.embed.tokens.weight.grad[30:] == 0).all()
    assert (model.head.weight.grad.abs().sum(-1) > 0).all()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(model.head.weight, before)
