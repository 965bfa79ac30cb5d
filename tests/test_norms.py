"""Unit tests of lib.norms (chapter 6): agreement with PyTorch, invariances, residual wiring, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lib.norms import (
    NORM_POSITIONS,
    LayerNorm,
    ResidualSublayer,
    RMSNorm,
    make_final_norm,
    make_norm,
)

TOL = {"atol": 1e-6, "rtol": 1e-6}


def _random_affine(ours: nn.Module, ref: nn.Module, seed: int = 0) -> None:
    """Give both modules the same random (non-trivial) affine parameters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for (name, p_ours), (ref_name, p_ref) in zip(
            ours.named_parameters(), ref.named_parameters()
        ):
            assert name == ref_name
            p_ours.copy_(torch.randn(p_ours.shape, generator=gen))
            p_ref.copy_(p_ours)


def _forward_backward(module: nn.Module, x: torch.Tensor, upstream: torch.Tensor):
    x = x.clone().requires_grad_(True)
    out = module(x)
    (out * upstream).sum().backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    return out.detach(), x.grad, grads


def _assert_same_as_reference(ours: nn.Module, ref: nn.Module, d_model: int) -> None:
    _random_affine(ours, ref)
    gen = torch.Generator().manual_seed(1)
    x = 3 * torch.randn(4, 7, d_model, generator=gen) + 1.5
    upstream = torch.randn(4, 7, d_model, generator=gen)
    out, x_grad, grads = _forward_backward(ours, x, upstream)
    ref_out, ref_x_grad, ref_grads = _forward_backward(ref, x, upstream)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(x_grad, ref_x_grad, **TOL)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL)


# ---------------------------------------------------------------- agreement with PyTorch


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"elementwise_affine": False}, {"bias": False}, {"eps": 1e-3}],
    ids=["affine", "no-affine", "no-bias", "eps=1e-3"],
)
def test_layernorm_matches_torch_with_gradients(kwargs):
    d_model = 48
    ours, ref = LayerNorm(d_model, **kwargs), nn.LayerNorm(d_model, **kwargs)
    assert [n for n, _ in ours.named_parameters()] == [
        n for n, _ in ref.named_parameters()
    ]
    _assert_same_as_reference(ours, ref, d_model)


@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"eps": 1e-2}])
def test_rmsnorm_matches_torch_with_gradients(kwargs):
    d_model = 48
    kwargs = {"eps": 1e-6, **kwargs}
    ours, ref = RMSNorm(d_model, **kwargs), nn.RMSNorm(d_model, **kwargs)
    _assert_same_as_reference(ours, ref, d_model)


def test_state_dict_loads_into_torch_modules():
    # The parameter names are PyTorch's, so weights move between the two.
    ours = LayerNorm(16)
    _random_affine(ours, nn.LayerNorm(16))
    ref = nn.LayerNorm(16)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 16)
    torch.testing.assert_close(ours(x), ref(x), **TOL)


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_low_precision_input_keeps_its_dtype_and_is_accurate(cls):
    norm = cls(64)
    x = 5 * torch.randn(2, 3, 64) + 2
    out = norm(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), norm(x), atol=0.05, rtol=0.02)


def test_layernorm_output_has_zero_mean_unit_variance_per_token():
    x = 10 * torch.randn(5, 9, 32) - 4
    y = LayerNorm(32, elementwise_affine=False)(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(5, 9), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        y.var(-1, unbiased=False), torch.ones(5, 9), atol=1e-4, rtol=0
    )


def test_rmsnorm_output_has_unit_root_mean_square_but_keeps_the_mean_direction():
    x = torch.randn(5, 32) + 3.0
    y = RMSNorm(32, elementwise_affine=False)(x)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(5), atol=1e-4, rtol=0)
    assert (y.mean(-1) > 0.5).all()  # no centring: the positive mean survives


def test_epsilon_is_inside_the_square_root_and_variance_is_biased():
    # One token with a tiny spread, where eps matters, and a large eps to make it visible.
    x = torch.tensor([[0.0, 0.01, 0.02, 0.03]])
    eps = 1e-3
    centred = x - x.mean()
    inside = centred / torch.sqrt(centred.pow(2).mean() + eps)
    outside = centred / (torch.sqrt(centred.pow(2).mean()) + eps)
    unbiased = centred / torch.sqrt(x.var(unbiased=True) + eps)
    y = LayerNorm(4, eps=eps, elementwise_affine=False)(x)
    torch.testing.assert_close(y, inside, **TOL)
    assert (y - outside).abs().max() > 0.1
    assert (y - unbiased).abs().max() > 1e-3


def test_constant_token_gives_zeros_not_nan():
    y = LayerNorm(8)(torch.full((2, 8), 7.0))
    assert torch.equal(y, torch.zeros(2, 8))
    assert torch.equal(RMSNorm(8)(torch.zeros(2, 8)), torch.zeros(2, 8))


def test_layernorm_invariant_to_per_token_shift_and_positive_scale():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 32, generator=gen)
    scale = torch.rand(4, 6, 1, generator=gen) * 4 + 0.5
    shift = torch.randn(4, 6, 1, generator=gen) * 10
    norm = LayerNorm(32)
    torch.testing.assert_close(norm(scale * x + shift), norm(x), atol=1e-4, rtol=0)


def test_rmsnorm_invariant_to_scale_but_not_to_shift():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, 32, generator=gen)
    scale = torch.rand(4, 6, 1, generator=gen) * 4 + 0.5
    norm = RMSNorm(32)
    torch.testing.assert_close(norm(scale * x), norm(x), atol=1e-4, rtol=0)
    assert (norm(x + 2.0) - norm(x)).abs().max() > 0.5


def test_parameters_initialised_to_identity_affine():
    ln = LayerNorm(8)
    assert torch.equal(ln.weight, torch.ones(8)) and torch.equal(
        ln.bias, torch.zeros(8)
    )
    assert LayerNorm(8, bias=False).bias is None
    assert LayerNorm(8, elementwise_affine=False).weight is None
    assert list(RMSNorm(8, elementwise_affine=False).parameters()) == []


def test_make_norm_builds_by_name():
    assert isinstance(make_norm("layernorm", 8), LayerNorm)
    rms = make_norm("rmsnorm", 8, eps=1e-3)
    assert isinstance(rms, RMSNorm) and rms.eps == 1e-3


# ---------------------------------------------------------------- residual wrapper


class _Scale(nn.Module):
    """f(x) = 3x + 1: a sublayer whose effect is easy to compute by hand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3 * x + 1


def test_pre_and_post_compute_their_formulas():
    x = torch.randn(2, 5, 16)
    pre = ResidualSublayer(_Scale(), 16, position="pre")
    post = ResidualSublayer(_Scale(), 16, position="post")
    ref_norm = nn.LayerNorm(16)
    torch.testing.assert_close(pre(x), x + 3 * ref_norm(x) + 1, **TOL)
    torch.testing.assert_close(post(x), ref_norm(x + 3 * x + 1), **TOL)


def test_final_norm_is_a_norm_for_pre_and_identity_for_post():
    assert isinstance(make_final_norm("pre", 8), LayerNorm)
    assert isinstance(make_final_norm("pre", 8, norm="rmsnorm"), RMSNorm)
    assert isinstance(make_final_norm("post", 8), nn.Identity)


def test_extra_arguments_reach_the_sublayer():
    class AddContext(nn.Module):
        def forward(self, x, context, *, weight=1.0):
            return weight * context

    block = ResidualSublayer(AddContext(), 4, position="pre")
    x, context = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    torch.testing.assert_close(block(x, context, weight=2.0), x + 2 * context)


def test_dropout_touches_only_the_branch():
    torch.manual_seed(0)
    x = torch.randn(8, 16, 32)

    class Zero(nn.Module):
        def forward(self, h):
            return torch.zeros_like(h)

    block = ResidualSublayer(Zero(), 32, position="pre", dropout=0.5).train()
    assert torch.equal(block(x), x)  # the skip path is never dropped

    class Ones(nn.Module):
        def forward(self, h):
            return torch.ones_like(h)

    block = ResidualSublayer(Ones(), 32, position="pre", dropout=0.5).train()
    branch = block(x) - x
    kept = branch != 0
    torch.testing.assert_close(branch[kept], torch.full_like(branch[kept], 2.0))
    assert 0.4 < kept.float().mean() < 0.6


def test_eval_mode_is_deterministic_and_train_mode_is_not():
    torch.manual_seed(0)
    block = ResidualSublayer(nn.Linear(16, 16), 16, position="post", dropout=0.3)
    x = torch.randn(4, 16)
    block.eval()
    assert torch.equal(block(x), block(x))
    block.train()
    assert not torch.equal(block(x), block(x))


def test_gradient_through_residual_contains_the_identity():
    # d(x + f(x))/dx = I + f'(x): with f linear, the Jacobian is I + W.
    lin = nn.Linear(6, 6, bias=False)

    def residual(x):
        return x + lin(x)

    jac = torch.autograd.functional.jacobian(residual, torch.randn(6))
    torch.testing.assert_close(jac, torch.eye(6) + lin.weight.detach())


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_wrong_last_axis_names_both_shapes(cls):
    with pytest.raises(ValueError, match=r"d_model=16.*shape \(2, 3, 8\)"):
        cls(16)(torch.randn(2, 3, 8))


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_scalar_integer_and_non_tensor_inputs_rejected(cls):
    with pytest.raises(ValueError, match=r"shape \(\)"):
        cls(4)(torch.tensor(1.0))
    with pytest.raises(TypeError, match="floating-point"):
        cls(4)(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="torch.Tensor"):
        cls(4)([1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan"), float("inf")])
def test_bad_eps_rejected(cls, eps):
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        cls(8, eps=eps)


@pytest.mark.parametrize(
    ("d_model", "error", "match"),
    [
        (0, ValueError, "d_model must be an int >= 1, got 0"),
        (-3, ValueError, "d_model must be an int >= 1, got -3"),
        (2.5, TypeError, "d_model must be an int, got float 2.5"),
        (True, TypeError, "d_model must be an int, got bool True"),
    ],
)
def test_bad_d_model_rejected(d_model, error, match):
    with pytest.raises(error, match=f"LayerNorm: {match}"):
        LayerNorm(d_model)


def test_eps_of_wrong_type_rejected():
    with pytest.raises(
        TypeError, match="RMSNorm: eps must be a number, got str 'small'"
    ):
        RMSNorm(8, eps="small")


def test_unknown_norm_position_lists_the_choices():
    for bad in ["middle", "PRE", None]:
        with pytest.raises(
            ValueError, match=r"position must be one of 'pre', 'post', got"
        ):
            ResidualSublayer(nn.Identity(), 8, position=bad)
        with pytest.raises(
            ValueError, match=r"position must be one of 'pre', 'post', got"
        ):
            make_final_norm(bad, 8)
    assert NORM_POSITIONS == ("pre", "post")


def test_unknown_norm_kind_lists_the_choices():
    with pytest.raises(
        ValueError,
        match=r"norm must be one of 'layernorm', 'rmsnorm', got str 'batchnorm'",
    ):
        ResidualSublayer(nn.Identity(), 8, norm="batchnorm")
    with pytest.raises(
        ValueError, match=r"kind must be one of 'layernorm', 'rmsnorm', got str"
    ):
        make_norm("LayerNorm", 8)


@pytest.mark.parametrize("dropout", [-0.1, 1.0, 1.5, float("nan")])
def test_bad_dropout_rejected(dropout):
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\)"):
        ResidualSublayer(nn.Identity(), 8, dropout=dropout)
    with pytest.raises(TypeError, match="dropout must be a number, got bool True"):
        ResidualSublayer(nn.Identity(), 8, dropout=True)


def test_sublayer_must_be_a_module():
    with pytest.raises(TypeError, match="nn.Module"):
        ResidualSublayer(lambda x: x, 8)


def test_sublayer_changing_the_shape_is_reported():
    with pytest.raises(ValueError, match=r"Linear must return .*\(2, 8\).*\(2, 4\)"):
        ResidualSublayer(nn.Linear(8, 4), 8)(torch.randn(2, 8))


def test_residual_input_with_wrong_width_is_reported():
    with pytest.raises(
        ValueError,
        match=r"ResidualSublayer: x must have shape \(\.\.\. d_model\) with d_model=8, got shape \(2, 5\)",
    ):
        ResidualSublayer(nn.Identity(), 8)(torch.randn(2, 5))


# --- Fused paths, float64, and extras across the residual (issue 7) ---


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fused_path_equals_the_teaching_form(cls, dtype):
    torch.manual_seed(0)
    teaching, fused = cls(48, fused=False), cls(48)
    with torch.no_grad():
        for p in teaching.parameters():
            p.copy_(torch.randn_like(p))
    fused.load_state_dict(teaching.state_dict())
    x = (3 * torch.randn(4, 7, 48) + 1).to(dtype)
    a, b = teaching(x), fused(x)
    assert a.dtype == b.dtype == dtype
    tolerance = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
    assert (a.double() - b.double()).abs().max() < tolerance


def test_fused_ops_are_the_functional_ones():
    x, w, b = torch.randn(3, 16), torch.randn(16), torch.randn(16)
    ln, rms = LayerNorm(16, eps=1e-5), RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ln.weight.copy_(w)
        ln.bias.copy_(b)
        rms.weight.copy_(w)
    assert torch.equal(ln(x), torch.nn.functional.layer_norm(x, (16,), w, b, 1e-5))
    assert torch.equal(rms(x), torch.nn.functional.rms_norm(x, (16,), w, 1e-6))


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_float64_input_is_normalised_in_float64(cls):
    x = torch.randn(2, 3, 32, dtype=torch.float64) * 1e3 + 1e6
    for fused in (False, True):
        norm = cls(32, elementwise_affine=False, fused=fused)
        out = norm(x)
        assert out.dtype == torch.float64
        reference = cls(32, elementwise_affine=False, fused=False)(x)
        assert (out - reference).abs().max() < 1e-9


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_non_bool_flags_are_rejected(cls):
    with pytest.raises(TypeError, match="fused must be True or False, got int 1"):
        cls(8, fused=1)
    with pytest.raises(
        TypeError, match="elementwise_affine must be True or False, got str 'yes'"
    ):
        cls(8, elementwise_affine="yes")


class _WithExtras(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x), "cache", x.sum()


@pytest.mark.parametrize("position", ["pre", "post"])
def test_residual_passes_extras_through(position):
    torch.manual_seed(0)
    block = ResidualSublayer(_WithExtras(), 8, position=position).eval()
    plain = ResidualSublayer(torch.nn.Linear(8, 8), 8, position=position).eval()
    plain.sublayer.load_state_dict(block.sublayer.linear.state_dict())
    plain.norm.load_state_dict(block.norm.state_dict())
    x = torch.randn(2, 5, 8)
    y, tag, total = block(x)
    assert tag == "cache" and torch.is_tensor(total)
    assert torch.allclose(y, plain(x), atol=1e-6)
    assert isinstance(plain(x), torch.Tensor)  # a plain sublayer still returns a tensor


def test_residual_shape_check_applies_to_the_first_element():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return x[..., :4], None

    with pytest.raises(ValueError, match="must return a tensor of the input's shape"):
        ResidualSublayer(Bad(), 8)(torch.randn(2, 3, 8))


def test_attention_cache_crosses_the_residual():
    from lib.attention import KVCache, MultiHeadAttention

    block = ResidualSublayer(MultiHeadAttention(16, 2), 16).eval()
    x = torch.randn(1, 4, 16)
    out, cache = block(x, causal=True, use_cache=True)
    assert out.shape == x.shape
    assert isinstance(cache, KVCache) and cache.seq_len == 4
    step, cache = block(torch.randn(1, 1, 16), causal=True, past=cache, use_cache=True)
    assert step.shape == (1, 1, 16) and cache.seq_len == 5


# --- Bad input, swept (issue 7): each case was a silent wrong answer or an unclear error ---


def test_layernorm_bias_flag_must_be_a_bool():
    # bias="no" is truthy: it built a learned bias without a word
    with pytest.raises(
        TypeError, match="LayerNorm: bias must be True or False, got str 'no'"
    ):
        LayerNorm(8, bias="no")
    assert LayerNorm(8, bias=False).bias is None


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_eps_message_names_the_reason(cls):
    with pytest.raises(
        ValueError,
        match="eps must be a finite number > 0, got -1e-05; it keeps the division",
    ):
        cls(8, eps=-1e-5)


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_numpy_scalars_are_accepted_as_numbers(cls):
    norm = cls(np.int64(8), eps=np.float32(1e-3))  # both were refused
    assert (
        type(norm.d_model) is int
        and type(norm.eps) is float
        and norm.eps == pytest.approx(1e-3)
    )
    assert norm(torch.randn(2, 8)).shape == (2, 8)


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_input_on_another_device_is_named(cls):
    # was: "Tensor on device cpu is not on the expected device meta!" from inside the kernel
    with pytest.raises(
        ValueError, match=f"{cls.__name__}: x and weight must be on one device"
    ):
        cls(8)(torch.randn(2, 8, device="meta"))
    out = cls(8, elementwise_affine=False)(
        torch.randn(2, 8, device="meta")
    )  # nothing to move
    assert out.device.type == "meta"


def test_final_norm_checks_its_arguments_for_post_too():
    # "post" returned nn.Identity() whatever norm and eps said: a typo passed unnoticed
    with pytest.raises(ValueError, match=r"make_final_norm\(\): norm must be one of"):
        make_final_norm("post", 8, norm="batchnorm")
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        make_final_norm("post", 8, eps=-1.0)
    with pytest.raises(TypeError, match="d_model must be an int, got float 8.0"):
        make_final_norm("post", 8.0)
    assert isinstance(make_final_norm("post", 8, norm="rmsnorm", eps=1e-5), nn.Identity)


def test_residual_refuses_integer_input():
    with pytest.raises(
        TypeError,
        match="ResidualSublayer: x must be a floating-point tensor, got dtype torch.int64",
    ):
        ResidualSublayer(nn.Identity(), 4)(torch.ones(2, 4, dtype=torch.long))


# --- issue 40, item 7: activations too large to square ---------------------------------


def _float64_norm(kind: str, x: torch.Tensor, weight, bias, eps: float) -> torch.Tensor:
    """The formula in float64, on ``x`` divided by a power of two (exact) that keeps
    float64's squares finite too; ``eps`` divided by its square."""
    x = x.double()
    scale = 2.0**960 if x.abs().max() > 1e150 else 1.0
    x, eps = x / scale, eps / scale / scale  # (scale**2 overflows a float)
    if kind == "layernorm":
        x = x - x.mean(-1, keepdim=True)
    y = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * weight.double()
    return y + bias.double() if kind == "layernorm" else y


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        (torch.float32, 1e30),  # was NaN (LayerNorm, fused) or 0 (the others)
        (torch.float32, 3e38),  # near float32's largest
        (torch.bfloat16, 1e38),
        (torch.float16, 6e4),  # squared in float32: never overflowed
        (torch.float64, 1e300),
    ],
)
def test_norms_of_huge_finite_activations_are_what_float64_gives(
    kind, fused, dtype, size
):
    d_model = 8
    norm = make_norm(kind, d_model)
    norm.fused = fused
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0, generator=gen)
        if kind == "layernorm":
            norm.bias.uniform_(-1.0, 1.0, generator=gen)
    bias = norm.bias if kind == "layernorm" else torch.zeros(d_model)
    rows = torch.rand(3, d_model, generator=gen, dtype=torch.float64) * 2 - 1
    rows[1] = rows[1] * 0.1 + 1  # a large common part, a smaller spread
    x = (rows / rows.abs().amax(-1, keepdim=True) * size).to(dtype)
    assert torch.isfinite(x).all()
    y = norm(x)
    want = _float64_norm(kind, x, norm.weight.detach(), bias.detach(), norm.eps)
    assert y.dtype == dtype and torch.isfinite(y).all()
    torch.testing.assert_close(y, want.to(dtype))


def test_rows_within_range_are_normalised_bit_for_bit_as_before():
    x = 4 * torch.randn(4, 16, 64) + 2
    ln, rms = LayerNorm(64), RMSNorm(64)
    assert torch.equal(ln(x), torch.nn.functional.layer_norm(x, (64,), eps=1e-5))
    assert torch.equal(rms(x), torch.nn.functional.rms_norm(x, (64,), eps=1e-6))
    # and a huge row has finite gradients
    big = torch.tensor([[1e30, -2e30, 5e29, 0.0]], requires_grad=True)
    LayerNorm(4)(big).pow(2).sum().backward()
    assert torch.isfinite(big.grad).all()


# --- issue 42: ordinary activations cost no rescaling pass on the CPU -------------------


def _ops_behind(y: torch.Tensor) -> set[str]:
    """The names of the autograd nodes between ``y`` and its leaves."""
    names, visited, todo = set(), set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        names.add(type(node).__name__)
        todo += [next_node for next_node, _ in node.next_functions]
    return names


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_ordinary_rows_are_not_rescaled_on_the_cpu(cls):
    x = (100 * torch.randn(4, 16, 64)).requires_grad_(True)
    ops = _ops_behind(cls(64)(x))
    assert not any(name.startswith(("Div", "Clamp", "Amax")) for name in ops), ops
    # a huge row still takes the division, and only then
    big = torch.tensor([[1e30, -2e30, 5e29, 0.0]], requires_grad=True)
    assert "DivBackward0" in _ops_behind(cls(4)(big))


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_empty_input_is_normalised_to_empty(cls):
    assert cls(8)(torch.empty(0, 3, 8)).shape == (0, 3, 8)
