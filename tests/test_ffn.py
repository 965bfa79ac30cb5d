"""Unit tests of lib.ffn: activations, the plain and gated FFNs, and parameter counts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.ffn import (
    FFN_ACTIVATIONS,
    GATED_FFN_ACTIVATIONS,
    FeedForward,
    GatedFeedForward,
    MoEFeedForward,
    TransformerParamConfig,
    ffn_param_count,
    gated_ffn_hidden_size,
    gelu_erf,
    gelu_tanh,
    moe_balance_loss,
    swish,
    transformer_param_breakdown,
)


def n_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- activations -------------------------------------------------------------------------


def test_gelu_forms_match_torch_and_each_other():
    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    assert torch.allclose(gelu_erf(x), F.gelu(x), atol=1e-12)
    assert torch.allclose(gelu_tanh(x), F.gelu(x, approximate="tanh"), atol=1e-12)
    gap = (gelu_erf(x) - gelu_tanh(x)).abs().max().item()
    assert 4.6e-4 < gap < 4.8e-4


def test_gelu_known_values():
    # GELU(x) = x Φ(x): Φ(0) = 1/2, Φ(1) ≈ 0.841345, and GELU(x) - GELU(-x) = x.
    x = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64)
    assert torch.allclose(
        gelu_erf(x), torch.tensor([0.0, 0.841345, -0.158655], dtype=x.dtype), atol=1e-6
    )
    t = torch.linspace(-5, 5, 101, dtype=torch.float64)
    for fn in (gelu_erf, gelu_tanh):
        assert torch.allclose(fn(t) - fn(-t), t, atol=1e-12)


def test_swish_special_cases():
    x = torch.linspace(-10, 10, 2001, dtype=torch.float64)
    assert torch.allclose(swish(x), F.silu(x), atol=1e-12)
    assert torch.allclose(swish(x, beta=0.0), x / 2)
    # Large beta approaches ReLU, with the largest gap ≈ 0.2785 / beta.
    assert (swish(x, beta=100.0) - torch.relu(x)).abs().max() < 0.003


@pytest.mark.parametrize("fn", [gelu_erf, gelu_tanh, swish])
def test_activations_reject_non_float(fn):
    with pytest.raises(TypeError, match="floating-point"):
        fn(torch.arange(3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fn([1.0, 2.0])


def test_swish_rejects_bad_beta():
    with pytest.raises(ValueError, match="beta must be a finite number, got nan"):
        swish(torch.ones(2), beta=float("nan"))
    with pytest.raises(ValueError, match="beta must be a finite number, got inf"):
        swish(torch.ones(2), beta=float("inf"))
    with pytest.raises(TypeError, match="beta must be a number, got str"):
        swish(torch.ones(2), beta="1")


def test_swish_dip_and_gap_to_relu_are_c_over_beta():
    # c = u* - 1 with u* = 1 + exp(-u*): both the negative dip and the largest gap to ReLU.
    u = 1.0
    for _ in range(60):
        u = 1 + math.exp(-u)
    x = torch.linspace(-40, 40, 800_001, dtype=torch.float64)
    for beta in (0.5, 1.0, 3.0):
        assert abs(swish(x, beta).min().item() + (u - 1) / beta) < 1e-6
        assert (
            abs((swish(x, beta) - torch.relu(x)).abs().max().item() - (u - 1) / beta)
            < 1e-6
        )


# --- FeedForward -------------------------------------------------------------------------


@pytest.mark.parametrize("activation", list(FFN_ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_feedforward_shape_and_param_count(activation, bias):
    ffn = FeedForward(12, activation=activation, bias=bias)
    assert ffn.d_ff == 48
    x = torch.randn(2, 3, 4, 12)
    assert ffn(x).shape == x.shape
    assert n_parameters(ffn) == ffn_param_count(12, 48, bias=bias)
    assert (ffn.w_in.bias is None) == (not bias)


def test_feedforward_matches_the_equation():
    ffn = FeedForward(6, d_ff=10, activation="relu")
    x = torch.randn(4, 6)
    want = (
        torch.relu(x @ ffn.w_in.weight.T + ffn.w_in.bias) @ ffn.w_out.weight.T
        + ffn.w_out.bias
    )
    assert torch.allclose(ffn(x), want, atol=1e-6)
    ffn_gelu = FeedForward(6, d_ff=10, activation="gelu_tanh")
    want = gelu_tanh(ffn_gelu.w_in(x)) @ ffn_gelu.w_out.weight.T + ffn_gelu.w_out.bias
    assert torch.allclose(ffn_gelu(x), want, atol=1e-6)


def test_feedforward_is_position_wise():
    ffn = FeedForward(8, activation="gelu")
    x = torch.randn(5, 8)
    jac = torch.autograd.functional.jacobian(ffn, x)  # (t_out d_out t_in d_in)
    for t in range(5):
        for s in range(5):
            block = jac[t, :, s, :]
            assert (block == 0).all() if s != t else block.abs().sum() > 0
    perm = torch.randperm(5)
    assert torch.allclose(ffn(x[perm]), ffn(x)[perm], atol=1e-6)


def test_feedforward_dropout_only_in_training():
    ffn = FeedForward(8, dropout=0.5)
    x = torch.randn(3, 8)
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))
    ffn.train()
    torch.manual_seed(0)
    a = ffn(x)
    torch.manual_seed(1)
    assert not torch.allclose(a, ffn(x))


def test_feedforward_errors_name_the_problem():
    ffn = FeedForward(8)
    with pytest.raises(ValueError, match=r"d_model=8.*\(2, 7\)"):
        ffn(torch.randn(2, 7))
    with pytest.raises(ValueError, match="d_model=8"):
        ffn(torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        ffn(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="'relu', 'gelu', 'gelu_tanh'"):
        FeedForward(8, activation="tanh")
    with pytest.raises(ValueError, match="GatedFeedForward"):
        FeedForward(8, activation="swiglu")
    with pytest.raises(
        ValueError, match="FeedForward: d_ff must be an int >= 1, got 0"
    ):
        FeedForward(8, d_ff=0)
    with pytest.raises(ValueError, match="d_model must be an int >= 1"):
        FeedForward(0)
    with pytest.raises(TypeError, match="d_model must be an int"):
        FeedForward(8.0)
    with pytest.raises(
        ValueError, match=r"dropout must be a probability in \[0, 1\), got 1.0"
    ):
        FeedForward(8, dropout=1.0)
    with pytest.raises(TypeError, match="dropout must be a number, got str"):
        FeedForward(8, dropout="0.1")
    with pytest.raises(TypeError, match="bias must be True or False, got str 'no'"):
        FeedForward(8, bias="no")
    # before: -0.1 was refused here, but an unhashable activation raised "unhashable type"
    with pytest.raises(ValueError, match="dropout must be a probability"):
        FeedForward(8, dropout=-0.1)
    with pytest.raises(
        ValueError, match=r"activation must be one of .*, got list \['relu'\]"
    ):
        FeedForward(8, activation=["relu"])
    with pytest.raises(TypeError, match="dropout must be a number, got bool True"):
        FeedForward(8, dropout=True)


@pytest.mark.parametrize(
    "layer", [FeedForward(8), GatedFeedForward(8)], ids=lambda m: type(m).__name__
)
def test_ffn_input_must_match_the_weights(layer):
    # before: "mat1 and mat2 must have the same dtype" from inside the linear layer
    with pytest.raises(
        TypeError,
        match="x and weight must share a dtype, got x torch.float64, weight torch.float32",
    ):
        layer(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(
        ValueError, match="x and weight must be on one device, got x on meta"
    ):
        layer(torch.randn(2, 8, device="meta"))
    assert layer.double()(torch.randn(2, 8, dtype=torch.float64)).dtype == torch.float64
    layer.float()
    with torch.autocast(
        "cpu", dtype=torch.bfloat16
    ):  # autocast casts the weights itself
        assert layer(torch.randn(2, 8, dtype=torch.bfloat16)).shape == (2, 8)


# --- gated FFN and the 8/3 rule ----------------------------------------------------------


def test_gated_hidden_size_known_models():
    # LLaMA's 7B, 13B, 33B and 65B hidden sizes (multiple_of = 256).
    assert gated_ffn_hidden_size(4096, 256) == 11008
    assert gated_ffn_hidden_size(5120, 256) == 13824
    assert gated_ffn_hidden_size(6656, 256) == 17920
    assert gated_ffn_hidden_size(8192, 256) == 22016
    assert gated_ffn_hidden_size(96, 64) == 256  # already a multiple: unchanged
    assert gated_ffn_hidden_size(4096, 1) == 10922


@settings(max_examples=200, deadline=None)
@given(d_model=st.integers(1, 20_000), multiple_of=st.integers(1, 512))
def test_gated_hidden_size_is_the_smallest_multiple_above_the_rule(
    d_model, multiple_of
):
    hidden = gated_ffn_hidden_size(d_model, multiple_of)
    assert hidden % multiple_of == 0
    assert hidden >= 8 * d_model // 3 > hidden - multiple_of
    # Parameter parity with a plain 4·d_model FFN, within the rounding.
    plain = ffn_param_count(d_model, 4 * d_model, bias=False)
    gated = ffn_param_count(d_model, hidden, gated=True, bias=False)
    assert -2 * d_model <= gated - plain <= 3 * d_model * (multiple_of - 1)


def test_gated_hidden_size_errors():
    with pytest.raises(ValueError, match="multiple_of must be an int >= 1"):
        gated_ffn_hidden_size(64, 0)
    with pytest.raises(TypeError, match="d_model must be an int"):
        gated_ffn_hidden_size(64.0)


@pytest.mark.parametrize("activation", list(GATED_FFN_ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
def test_gated_feedforward_matches_the_equation(activation, bias):
    layer = GatedFeedForward(10, d_ff=6, activation=activation, bias=bias)
    assert n_parameters(layer) == ffn_param_count(10, 6, gated=True, bias=bias)
    x = torch.randn(2, 3, 10)
    h = layer.w_in(x)
    gate, value = h[..., :6], h[..., 6:]  # gate first, then value
    act = {
        "glu": torch.sigmoid,
        "reglu": torch.relu,
        "geglu": gelu_erf,
        "swiglu": swish,
    }[activation]
    want = layer.w_out(act(gate) * value)
    assert torch.allclose(layer(x), want, atol=1e-6)


def test_gated_feedforward_defaults():
    layer = GatedFeedForward(64)
    assert layer.d_ff == 192 and layer.activation == "swiglu"  # 170 rounded up to 192
    assert layer.w_in.bias is None and layer.w_out.bias is None
    assert GatedFeedForward(64, multiple_of=1).d_ff == 170
    assert GatedFeedForward(64, d_ff=100).d_ff == 100  # an explicit d_ff is not rounded


def test_gated_feedforward_errors():
    with pytest.raises(ValueError, match="'glu', 'reglu', 'geglu', 'swiglu'"):
        GatedFeedForward(8, activation="swish")
    with pytest.raises(ValueError, match="FeedForward"):
        GatedFeedForward(8, activation="gelu")
    with pytest.raises(ValueError, match=r"d_model=8.*\(4, 9\)"):
        GatedFeedForward(8)(torch.randn(4, 9))
    with pytest.raises(ValueError, match="multiple_of"):
        GatedFeedForward(8, multiple_of=0)
    with pytest.raises(ValueError, match="d_ff must be an int >= 1"):
        GatedFeedForward(8, d_ff=-3)
    with pytest.raises(
        ValueError, match=r"dropout must be a probability in \[0, 1\), got -0.5"
    ):
        GatedFeedForward(8, dropout=-0.5)
    with pytest.raises(TypeError, match="bias must be True or False, got int 1"):
        GatedFeedForward(8, bias=1)


# --- parameter counts --------------------------------------------------------------------


def test_ffn_param_count_formula():
    assert ffn_param_count(512, 2048) == 2 * 512 * 2048 + 2048 + 512
    assert ffn_param_count(512, 2048, bias=False) == 2 * 512 * 2048
    assert ffn_param_count(4096, 11008, gated=True, bias=False) == 3 * 4096 * 11008
    assert ffn_param_count(4, 3, gated=True) == 3 * 4 * 3 + 2 * 3 + 4
    with pytest.raises(ValueError, match="d_ff"):
        ffn_param_count(4, 0)
    # before: any truthy value counted as True ("no" biases counted as biases)
    with pytest.raises(TypeError, match="bias must be True or False, got str 'no'"):
        ffn_param_count(4, 3, bias="no")
    with pytest.raises(TypeError, match="gated must be True or False, got int 1"):
        ffn_param_count(4, 3, gated=1)


def _config(name: str) -> TransformerParamConfig:
    return {
        "bert": TransformerParamConfig(
            "BERT-base", d_model=768, vocab_size=30_522, n_encoder_layers=12,
            n_positions=512, n_token_types=2, n_extra_norms=1, pooler=True,
        ),
        "gpt2": TransformerParamConfig(
            "GPT-2 small", d_model=768, vocab_size=50_257, n_decoder_layers=12,
            n_positions=1024, n_extra_norms=1,
        ),
        "llama": TransformerParamConfig(
            "LLaMA-7B", d_model=4096, vocab_size=32_000, n_decoder_layers=32, d_ff=11_008,
            gated_ffn=True, bias=False, norm_bias=False, n_extra_norms=1, tied_output=False,
        ),
    }[name]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "total"),
    [("bert", 109_482_240), ("gpt2", 124_439_808), ("llama", 6_738_415_616)],
)
def test_breakdown_matches_released_checkpoints(name, total):
    parts = transformer_param_breakdown(_config(name))
    assert set(parts) == {"embeddings", "attention", "ffn", "norms", "head"}
    assert sum(parts.values()) == total


def test_breakdown_of_gpt2_by_component():
    parts = transformer_param_breakdown(_config("gpt2"))
    assert parts["embeddings"] == (50_257 + 1024) * 768
    assert parts["attention"] == 12 * (4 * 768 * 768 + 4 * 768)
    assert parts["ffn"] == 12 * ffn_param_count(768, 3072)
    assert parts["norms"] == (2 * 12 + 1) * 2 * 768
    assert parts["head"] == 0  # tied to the token embedding


def test_breakdown_of_an_encoder_decoder_counts_cross_attention():
    enc_dec = TransformerParamConfig(
        "t", d_model=8, vocab_size=10, n_encoder_layers=1, n_decoder_layers=1
    )
    dec_only = TransformerParamConfig("t", d_model=8, vocab_size=10, n_decoder_layers=2)
    a, b = transformer_param_breakdown(enc_dec), transformer_param_breakdown(dec_only)
    attention_layer = 4 * 8 * 8 + 4 * 8
    assert (
        a["attention"] == 3 * attention_layer and b["attention"] == 2 * attention_layer
    )
    assert a["norms"] == 5 * 16 and b["norms"] == 4 * 16
    assert a["ffn"] == b["ffn"]


def test_breakdown_errors():
    with pytest.raises(ValueError, match="at least one"):
        TransformerParamConfig("empty", d_model=8, vocab_size=10)
    with pytest.raises(
        ValueError,
        match=r"TransformerParamConfig\('bad'\): d_model must be an int >= 1",
    ):
        TransformerParamConfig("bad", d_model=0, vocab_size=10, n_decoder_layers=1)
    with pytest.raises(ValueError, match="n_positions must be an int >= 0"):
        TransformerParamConfig(
            "bad", d_model=8, vocab_size=10, n_decoder_layers=1, n_positions=-1
        )
    with pytest.raises(TypeError, match="TransformerParamConfig"):
        transformer_param_breakdown({"d_model": 8})
    with pytest.raises(TypeError, match="gated_ffn must be True or False"):
        TransformerParamConfig(
            "bad", d_model=8, vocab_size=10, n_decoder_layers=1, gated_ffn=1
        )
    with pytest.raises(TypeError, match="tied_output must be True or False"):
        TransformerParamConfig(
            "bad", d_model=8, vocab_size=10, n_decoder_layers=1, tied_output="no"
        )
    # before: accepted, and compared against as if it were a parameter count
    with pytest.raises(
        ValueError, match="published must be a finite number > 0, got nan"
    ):
        TransformerParamConfig("bad", 8, 10, n_decoder_layers=1, published=float("nan"))
    with pytest.raises(TypeError, match="name must be a str, got int 3"):
        TransformerParamConfig(3, 8, 10, n_decoder_layers=1)


def test_module_param_counts_agree_with_breakdown_for_a_block():
    # One plain block's FFN, counted by module and by formula, within the breakdown.
    cfg = TransformerParamConfig(
        "tiny", d_model=16, vocab_size=50, n_decoder_layers=1, d_ff=40
    )
    assert transformer_param_breakdown(cfg)["ffn"] == n_parameters(
        FeedForward(16, d_ff=40)
    )
    gated_cfg = TransformerParamConfig(
        "tiny",
        d_model=16,
        vocab_size=50,
        n_decoder_layers=1,
        d_ff=40,
        gated_ffn=True,
        bias=False,
    )
    assert transformer_param_breakdown(gated_cfg)["ffn"] == n_parameters(
        GatedFeedForward(16, d_ff=40)
    )
    assert math.isclose(n_parameters(GatedFeedForward(16, d_ff=40)), 3 * 16 * 40)


# --- squared ReLU ------------------------------------------------------------------------


def test_relu2_is_relu_squared_with_a_continuous_derivative():
    relu2 = FFN_ACTIVATIONS["relu2"]
    x = torch.linspace(-4, 4, 801, dtype=torch.float64, requires_grad=True)
    y = relu2(x)
    assert torch.equal(y, torch.clamp(x, min=0) ** 2)
    (slope,) = torch.autograd.grad(y.sum(), x)
    assert torch.allclose(slope, 2 * torch.clamp(x.detach(), min=0))
    ffn = FeedForward(6, d_ff=10, activation="relu2")
    h = torch.randn(4, 6)
    want = (ffn.w_in(h).clamp(min=0) ** 2) @ ffn.w_out.weight.T + ffn.w_out.bias
    assert torch.allclose(ffn(h), want, atol=1e-6)


# --- mixture of experts ------------------------------------------------------------------


def _dense_moe(moe, x):
    """Every expert on every token, weighted by its renormalised top-k probability
    (zero outside the top k): what the routed module must equal."""
    probs = moe.router(x).softmax(dim=-1)
    top_probs, top_experts = probs.topk(moe.top_k, dim=-1)
    kept = top_probs / top_probs.sum(-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(-1, top_experts, kept)
    outputs = torch.stack([expert(x) for expert in moe.experts], dim=-2)
    return (weights.unsqueeze(-1) * outputs).sum(-2)


@pytest.mark.parametrize("bias", [True, False])
def test_one_expert_kept_always_is_that_feedforward(bias):
    moe = MoEFeedForward(8, 20, n_experts=1, top_k=1, activation="relu2", bias=bias)
    plain = FeedForward(8, 20, activation="relu2", bias=bias)
    plain.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(2, 5, 8)
    assert torch.allclose(moe(x), plain(x), atol=1e-6)


@pytest.mark.parametrize(
    ("n_experts", "top_k", "activation"),
    [(4, 1, "gelu"), (4, 2, "gelu"), (8, 3, "relu"), (5, 5, "gelu"), (4, 2, "swiglu")],
)
def test_moe_equals_the_dense_reference(n_experts, top_k, activation):
    moe = MoEFeedForward(12, 16, n_experts, top_k, activation=activation)
    if activation == "swiglu":
        assert isinstance(moe.experts[0], GatedFeedForward)
    x = torch.randn(3, 7, 12)
    assert torch.allclose(moe(x), _dense_moe(moe, x), atol=1e-5)
    assert moe(x[0, 0]).shape == (12,)  # any leading axes


def test_moe_parameters_are_the_experts_and_a_bias_free_router():
    moe = MoEFeedForward(12, 16, n_experts=4, top_k=2, bias=False)
    assert moe.router.bias is None and moe.router.weight.shape == (4, 12)
    want = 4 * ffn_param_count(12, 16, bias=False) + 4 * 12
    assert n_parameters(moe) == want
    assert moe.d_ff == 16 and MoEFeedForward(12, None, 2, 1).d_ff == 48


def test_balance_loss_is_one_when_routing_is_uniform_and_n_over_k_when_collapsed():
    moe = MoEFeedForward(8, 16, n_experts=4, top_k=2)
    x = torch.randn(64, 8)
    with torch.no_grad():
        moe.router.weight.zero_()  # P uniform: the loss is 1 whatever f is
        moe(x)
        assert moe.balance_loss.item() == 1.0
        # every token to expert 0 with certainty, its second slot to another
        direction = F.normalize(torch.randn(8), dim=0)
        moe.router.weight[0] = 50 * direction
        moe(x + 10 * direction)
        assert abs(moe.balance_loss.item() - 4 / 2) < 1e-3


def test_balance_loss_follows_the_switch_formula():
    moe = MoEFeedForward(8, 16, n_experts=5, top_k=2)
    x = torch.randn(3, 11, 8)
    moe(x)
    probs = moe.router(x.reshape(-1, 8)).softmax(-1)
    chosen = probs.topk(2, dim=-1).indices
    f = torch.stack([(chosen == i).float().sum() for i in range(5)]) / chosen.numel()
    want = 5 * (f * probs.mean(0)).sum()
    assert torch.allclose(moe.balance_loss, want, atol=1e-6)
    # f with every expert the same share: the loss is 1 whatever P is
    assert torch.allclose(
        5 * (torch.full((5,), 0.2) * probs.mean(0)).sum(), torch.tensor(1.0)
    )


def test_gradients_reach_the_router_and_every_used_expert():
    moe = MoEFeedForward(8, 16, n_experts=4, top_k=2)
    x = torch.randn(4, 10, 8)
    loss = moe(x).square().mean() + 0.01 * moe_balance_loss(moe)
    loss.backward()
    assert moe.router.weight.grad.abs().max() > 0
    used = moe.router(x).topk(2, dim=-1).indices.unique().tolist()
    for e in used:
        assert moe.experts[e].w_in.weight.grad.abs().max() > 0
    # with top_k=1 the kept weight is p/p = 1: only the balance loss trains the router
    single = MoEFeedForward(8, 16, n_experts=4, top_k=1)
    single(x).square().mean().backward()
    assert single.router.weight.grad.abs().max() < 1e-6


def test_moe_balance_loss_sums_every_layer_and_is_zero_without_any():
    model = torch.nn.Sequential(
        MoEFeedForward(8, 16, 4, 2), torch.nn.Linear(8, 8), MoEFeedForward(8, 16, 3, 1)
    )
    model(torch.randn(2, 5, 8))
    want = model[0].balance_loss + model[2].balance_loss
    assert torch.equal(moe_balance_loss(model), want)
    none = moe_balance_loss(FeedForward(8))
    assert none.shape == () and none.item() == 0.0
    with pytest.raises(TypeError, match="moe_balance_loss"):
        moe_balance_loss("model")


def test_moe_runs_under_autocast():
    moe = MoEFeedForward(8, 16, 4, 2)
    x = torch.randn(2, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = moe(x)
    assert (out.float() - moe(x)).abs().max() < 0.05


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(top_k=5), ValueError, "top_k=5 exceeds n_experts=4"),
        (dict(top_k=0), ValueError, "top_k must be an int >= 1, got 0"),
        (dict(n_experts=0, top_k=1), ValueError, "n_experts must be an int >= 1"),
        (dict(n_experts=2.0), TypeError, "n_experts must be an int, got float"),
        (dict(d_ff=0), ValueError, "d_ff must be an int >= 1, got 0"),
        (dict(activation="tanh"), ValueError, "activation must be one of"),
        (dict(bias="no"), TypeError, "bias must be True or False"),
    ],
)
def test_moe_bad_arguments_are_clear_errors(kwargs, error, match):
    arguments = dict(d_model=8, d_ff=16, n_experts=4, top_k=2) | kwargs
    with pytest.raises(error, match=f"MoEFeedForward: {match}"):
        MoEFeedForward(**arguments)


def test_moe_input_must_fit_the_router():
    moe = MoEFeedForward(8, 16, 4, 2)
    with pytest.raises(ValueError, match="d_model=8"):
        moe(torch.randn(2, 7))
    with pytest.raises(TypeError, match="share a dtype"):
        moe(torch.randn(2, 8, dtype=torch.float64))
