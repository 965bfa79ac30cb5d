"""Unit tests of lib.hf_weights: our models equal the transformers reference models.

Each reference is built offline from a small configuration with random (perturbed)
weights; its state dict is converted and loaded into ours, and the logits must agree to
1e-5 in fp32.
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers

from lib.hf_weights import (
    StateDictMismatchError,
    concat,
    config_from_bert,
    config_from_gpt2,
    config_from_llama,
    config_from_t5,
    convert_state_dict,
    expand_rows,
    from_reference,
    gpt2_state_dict,
    llama_state_dict,
    load_checked,
    same,
    t5_state_dict,
    transpose,
)
from lib.models import GPT, T5, TransformerConfig

transformers.logging.set_verbosity_error()

VOCAB, D_MODEL = 67, 32
TOLERANCE = 1e-5


def perturb_(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Noise on every weight, so no norm weight stays 1 and no bias stays 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    return model.eval()


def gpt2_reference(**overrides) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=40,
        n_embd=D_MODEL,
        n_layer=2,
        n_head=4,
        **overrides,
    )
    return perturb_(transformers.GPT2LMHeadModel(config))


def bert_reference() -> transformers.BertForMaskedLM:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=80,
        max_position_embeddings=40,
        type_vocab_size=3,
    )
    return perturb_(transformers.BertForMaskedLM(config))


def t5_reference(**overrides) -> transformers.T5ForConditionalGeneration:
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=D_MODEL,
        d_kv=6,  # 4 heads of 6 = 24 features, not d_model
        d_ff=72,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=4,
        decoder_start_token_id=0,
        **overrides,
    )
    return perturb_(transformers.T5ForConditionalGeneration(config))


def llama_reference(**overrides) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=88,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=40,
        rope_theta=50000.0,
        **overrides,
    )
    return perturb_(transformers.LlamaForCausalLM(config))


@pytest.fixture(scope="module")
def batch():
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, VOCAB, (3, 13), generator=generator)
    mask = torch.arange(13) < torch.tensor([[13], [9], [4]])  # right padding
    return ids, mask


def max_difference(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    assert ours.shape == theirs.shape
    return (ours - theirs).abs().max().item()


# --- equal logits -------------------------------------------------------------------


@pytest.mark.parametrize("padded", [False, True])
def test_gpt2_logits_equal(batch, padded):
    ids, mask = batch
    reference = gpt2_reference()
    model = from_reference(reference)
    assert isinstance(model, GPT) and not model.training
    with torch.no_grad():
        if padded:  # compare the real tokens only
            theirs = reference(ids, attention_mask=mask.long()).logits[mask]
            ours = model(ids, mask=mask)[mask]
        else:
            theirs, ours = reference(ids).logits, model(ids)
    assert max_difference(ours, theirs) <= TOLERANCE


def test_gpt2_untied_and_unscaled_logits_equal(batch):
    ids, _ = batch
    # Eager attention: the SDPA path of transformers 4.57's GPT-2 ignores
    # scale_attn_weights=False (it always scales by 1/sqrt(d_head)).
    reference = gpt2_reference(
        tie_word_embeddings=False,
        scale_attn_weights=False,
        activation_function="relu",
        attn_implementation="eager",
    )
    model = from_reference(reference)
    assert not model.cfg.tie_embeddings and model.cfg.attn_scale == 1.0
    with torch.no_grad():
        assert max_difference(model(ids), reference(ids).logits) <= TOLERANCE


def test_bert_logits_equal_on_real_tokens(batch):
    ids, mask = batch
    generator = torch.Generator().manual_seed(3)
    token_types = torch.randint(0, 3, ids.shape, generator=generator)
    reference = bert_reference()
    model = from_reference(reference)
    assert model.cfg.norm_position == "post" and model.cfg.norm_eps == 1e-12
    with torch.no_grad():
        output = reference(ids, attention_mask=mask.long(), token_type_ids=token_types)
        ours = model(ids, mask=mask, token_types=token_types)
    assert max_difference(ours[mask], output.logits[mask]) <= TOLERANCE


@pytest.mark.parametrize(
    "overrides",
    [{}, {"feed_forward_proj": "gated-silu", "tie_word_embeddings": False}],
    ids=["v1.0-relu-tied", "gated-silu-untied"],
)
def test_t5_logits_equal(batch, overrides):
    ids, mask = batch
    tgt_ids = torch.cat([torch.zeros(3, 1, dtype=torch.long), ids[:, :7]], dim=1)
    reference = t5_reference(**overrides)
    model = from_reference(reference)
    assert isinstance(model, T5) and model.start_id == 0
    with torch.no_grad():
        output = reference(ids, attention_mask=mask.long(), decoder_input_ids=tgt_ids)
        ours = model(ids, tgt_ids, src_mask=mask)
    # The untied head skips T5's d_model^-0.5 rescaling, so its logits reach ~15 and fp32
    # rounding grows with them: the bound is relative to the largest logit there.
    scale = max(1.0, output.logits.abs().max().item()) if overrides else 1.0
    assert max_difference(ours, output.logits) <= TOLERANCE * scale


def test_llama_gqa_logits_equal(batch):
    ids, _ = batch
    reference = llama_reference()
    model = from_reference(reference)
    assert model.cfg.kv_heads == 2 and model.cfg.rope_base == 50000.0
    with torch.no_grad():
        assert max_difference(model(ids), reference(ids).logits) <= TOLERANCE


def test_greedy_decoding_equals_generate(batch):
    ids, _ = batch
    reference = gpt2_reference()
    model = from_reference(reference)
    prompt = ids[:2, :4]
    with torch.no_grad():
        logits, cache = model.step(prompt)
        tokens = [prompt]
        for _ in range(20):
            tokens.append(logits[:, -1].argmax(dim=-1, keepdim=True))
            logits, cache = model.step(tokens[-1], cache)
        theirs = reference.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
        )
    assert torch.equal(torch.cat(tokens, dim=1), theirs)


def test_lib_generation_greedy_equals_generate(batch):
    generation = pytest.importorskip("lib.generation")
    ids, _ = batch
    reference = gpt2_reference()
    prompt = ids[:2, :4]
    with torch.no_grad():
        ours = generation.generate(from_reference(reference), prompt, 20, temperature=0)
        theirs = reference.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=20,
            do_sample=False,
            pad_token_id=0,
        )
    assert torch.equal(ours, theirs)


# --- every key used, or a clear error -----------------------------------------------


def test_missing_extra_and_misshaped_keys_are_all_listed():
    reference = gpt2_reference()
    cfg = config_from_gpt2(reference.config)
    broken = dict(reference.state_dict())
    del broken["transformer.h.1.mlp.c_fc.bias"]
    broken["transformer.h.7.ln_1.weight"] = torch.ones(D_MODEL)
    broken["transformer.wpe.weight"] = torch.zeros(39, D_MODEL)
    with pytest.raises(StateDictMismatchError) as caught:
        gpt2_state_dict(broken, cfg)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.missing == ["transformer.h.1.mlp.c_fc.bias"]
    assert error.unexpected == ["transformer.h.7.ln_1.weight"]
    (problem,) = error.misshaped
    assert "transformer.wpe.weight (39, 32)" in problem and "(40, 32)" in problem
    for text in ("missing (1)", "unexpected (1)", "mis-shaped (1)"):
        assert text in str(error)


def test_a_config_that_disagrees_with_the_weights_is_an_error():
    reference = llama_reference()
    state, cfg = reference.state_dict(), config_from_llama(reference.config)
    with pytest.raises(StateDictMismatchError) as caught:  # one layer too many
        llama_state_dict(state, replace(cfg, n_layers=3))
    assert "model.layers.2.self_attn.q_proj.weight" in caught.value.missing
    with pytest.raises(StateDictMismatchError) as caught:  # MHA config, GQA weights
        llama_state_dict(state, replace(cfg, n_kv_heads=4))
    assert len(caught.value.misshaped) == 2  # qkv_proj of both blocks


def test_concat_of_incompatible_parts_is_reported_not_raised_raw():
    reference = llama_reference()
    broken = dict(reference.state_dict())
    broken["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, D_MODEL + 1)
    with pytest.raises(StateDictMismatchError) as caught:
        llama_state_dict(broken, config_from_llama(reference.config))
    (problem,) = caught.value.misshaped
    assert "qkv_proj" in problem and "k_proj.weight (16, 33)" in problem


def test_tied_copies_may_be_saved_once_but_must_agree():
    reference = t5_reference()
    cfg = config_from_t5(reference.config)
    state = dict(reference.state_dict())
    # A safetensors checkpoint keeps one name of a tied tensor.
    for stack in ("encoder", "decoder"):
        del state[f"{stack}.embed_tokens.weight"]
    del state["lm_head.weight"]
    ours = t5_state_dict(state, cfg)
    assert torch.equal(ours["head.weight"], state["shared.weight"])
    state["lm_head.weight"] = state["shared.weight"] + 1.0
    with pytest.raises(StateDictMismatchError, match="tied copies differ"):
        t5_state_dict(state, cfg)


def test_non_persistent_buffers_of_old_checkpoints_are_skipped():
    reference = gpt2_reference()
    state = dict(reference.state_dict())
    state["transformer.h.0.attn.bias"] = torch.ones(1, 1, 40, 40).tril()
    state["transformer.h.1.attn.masked_bias"] = torch.tensor(-1e4)
    gpt2_state_dict(state, config_from_gpt2(reference.config))  # no error
    llama = llama_reference()
    state = dict(llama.state_dict())
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    llama_state_dict(state, config_from_llama(llama.config))


def test_load_checked_lists_problems_and_guards_ties():
    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=8)
    model = GPT(cfg)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    load_checked(model, state)
    bias = "decoder.final_norm.bias"
    with pytest.raises(StateDictMismatchError, match=bias):
        load_checked(model, {k: v for k, v in state.items() if k != bias})
    with pytest.raises(StateDictMismatchError, match=r"has \(8,\), got \(9,\)"):
        load_checked(model, {**state, bias: torch.zeros(9)})
    with pytest.raises(ValueError, match="one tied tensor"):
        load_checked(model, {**state, "head.weight": state["head.weight"] + 1})


def test_table_machinery():
    rows = [("a.{i}.w", ("b.{i}.x", "b.{i}.y"), concat), ("c", "d", transpose)]
    assert [row[:2] for row in expand_rows(rows, {"i": range(2)})] == [
        (("a.0.w",), ("b.0.x", "b.0.y")),
        (("a.1.w",), ("b.1.x", "b.1.y")),
        (("c",), ("d",)),
    ]
    with pytest.raises(ValueError, match=r"placeholders \['i'\]"):
        list(expand_rows(rows, {}))
    theirs = {
        "b.0.x": torch.ones(2, 3),
        "b.0.y": torch.zeros(1, 3),
        "d": torch.ones(3, 4),
    }
    expected = {"a.0.w": torch.Size([3, 3]), "c": torch.Size([4, 3])}
    ours = convert_state_dict(theirs, rows, expected, ranges={"i": [0]})
    assert ours["a.0.w"].shape == (3, 3) and ours["c"].shape == (4, 3)
    with pytest.raises(StateDictMismatchError, match=r"e \(ours: no row fills it\)"):
        expected = {"c": torch.Size([1]), "e": torch.Size([1])}
        convert_state_dict({"d": torch.ones(1)}, [("c", "d", same)], expected)


# --- configurations -----------------------------------------------------------------


def test_configs_read_the_reference_options():
    t5_config = transformers.T5Config(d_model=64, d_kv=8, num_heads=4, num_layers=2)
    t5 = config_from_t5(t5_config)
    assert (t5.d_head, t5.attn_scale, t5.bias) == (8, 1.0, False)
    assert (t5.norm, t5.norm_eps, t5.activation) == ("rmsnorm", 1e-6, "relu")
    bert = config_from_bert(transformers.BertConfig(hidden_size=48))
    assert (bert.activation, bert.n_token_types) == ("gelu", 2)
    assert bert.embedding_norm and bert.norm_position == "post"
    gpt2 = config_from_gpt2(transformers.GPT2Config(n_embd=64, n_head=4))
    assert (gpt2.activation, gpt2.norm_eps, gpt2.d_ff) == ("gelu_tanh", 1e-5, 256)
    llama_config = transformers.LlamaConfig(hidden_size=64, num_key_value_heads=1)
    llama = config_from_llama(llama_config)
    assert (llama.activation, llama.kv_heads, llama.d_head) == ("swiglu", 1, 2)
    assert not llama.tie_embeddings


UNSUPPORTED = [
    (
        config_from_gpt2,
        transformers.GPT2Config(scale_attn_by_inverse_layer_idx=True),
        "scale_attn_by_inverse_layer_idx",
    ),
    (
        config_from_gpt2,
        transformers.GPT2Config(activation_function="tanh"),
        "activation_function",
    ),
    (
        config_from_bert,
        transformers.BertConfig(position_embedding_type="relative_key"),
        "position_embedding_type",
    ),
    (
        config_from_t5,
        transformers.T5Config(feed_forward_proj="gated-gelu"),
        "dense_act_fn",
    ),
    (
        config_from_llama,
        transformers.LlamaConfig(attention_bias=True),
        "attention_bias",
    ),
    (
        config_from_llama,
        transformers.LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        "rope_scaling",
    ),
]


@pytest.mark.parametrize(("read", "config", "field"), UNSUPPORTED)
def test_unsupported_reference_options_are_named(read, config, field):
    with pytest.raises(ValueError, match=field):
        read(config)


def test_from_reference_names_the_known_families():
    config = type("BartConfig", (), {"model_type": "bart"})()
    reference = type("Bart", (), {"config": config})()
    with pytest.raises(ValueError, match="model_type 'bart'.*gpt2, bert, t5, llama"):
        from_reference(reference)


def test_lib_does_not_import_transformers():
    source = Path(__file__).resolve().parent.parent / "lib" / "hf_weights.py"
    imported = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert "transformers" not in imported


# --- issue 19: dropout rates carried or named, bad arguments named --------------------


def test_equal_dropout_rates_are_carried_and_different_ones_named():
    same = transformers.GPT2Config(resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_from_gpt2(same).dropout == 0.2
    cases = [
        (config_from_gpt2, transformers.GPT2Config(attn_pdrop=0.3), "attn_pdrop=0.3"),
        (
            config_from_bert,
            transformers.BertConfig(attention_probs_dropout_prob=0.0),
            "attention_probs_dropout_prob=0.0",
        ),
        (
            config_from_llama,
            transformers.LlamaConfig(attention_dropout=0.1),
            "attention_dropout=0.1",
        ),
    ]
    for read, config, named in cases:
        with pytest.warns(UserWarning, match=f"{named}.*one dropout"):
            read(config)


def test_loader_functions_name_bad_arguments():
    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=8)
    with pytest.raises(TypeError, match="model must be a Module"):
        load_checked("model", {})
    with pytest.raises(TypeError, match="state_dict must be a state dict"):
        load_checked(GPT(cfg), [("a", torch.ones(1))])
    with pytest.raises(TypeError, match="their_state_dict must be a state dict"):
        convert_state_dict(None, [], {})
