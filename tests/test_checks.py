"""Unit tests of lib._checks (the shared argument checks) and of the package surface of lib."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import lib
from lib import _checks as check

# -- integers -----------------------------------------------------------------------------------


def test_integer_accepts_python_numpy_and_0d_tensor_ints():
    assert check.integer("n", 3) == 3
    assert check.integer("n", -3) == -3
    value = check.integer("n", np.int64(7))
    assert value == 7 and type(value) is int
    assert check.integer("n", torch.tensor(5)) == 5


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (True, "n must be an int, got bool True"),
        (2.0, "n must be an int, got float 2.0"),
        ("3", "n must be an int, got str '3'"),
        (None, "n must be an int, got NoneType None"),
        (torch.tensor(2.0), "n must be an int, got a tensor of shape"),
        (torch.tensor([1, 2]), r"n must be an int, got a tensor of shape \(2,\)"),
        (torch.tensor(True), "n must be an int, got a tensor of shape .* torch.bool"),
    ],
)
def test_integer_rejects_everything_else(value, match):
    with pytest.raises(TypeError, match=match):
        check.integer("n", value)


def test_int_ranges():
    assert check.int_at_least("offset", 0, 0) == 0
    assert check.positive_int("d_model", 64) == 64
    assert check.int_in_range("padding_idx", 9, 0, 9) == 9
    with pytest.raises(ValueError, match="offset must be an int >= 0, got -1"):
        check.int_at_least("offset", -1, 0)
    with pytest.raises(ValueError, match="d_model must be an int >= 1, got 0"):
        check.positive_int("d_model", 0)
    with pytest.raises(TypeError, match="d_model must be an int, got float 64.0"):
        check.positive_int("d_model", 64.0)
    with pytest.raises(
        ValueError, match=r"padding_idx must be an int in 0\.\.9, got 10"
    ):
        check.int_in_range("padding_idx", 10, 0, 9)
    with pytest.raises(
        ValueError, match=r"padding_idx must be an int in 0\.\.9, got -1"
    ):
        check.int_in_range("padding_idx", -1, 0, 9)


def test_even():
    assert check.even("d_head", 8) == 8
    assert check.even("k", -2) == -2
    with pytest.raises(
        ValueError, match="d_head must be even, got 7; RoPE rotates pairs"
    ):
        check.even("d_head", 7, hint="RoPE rotates pairs")
    with pytest.raises(TypeError, match="d_head must be an int, got float 8.0"):
        check.even("d_head", 8.0)
    assert check.even("d_head", 2, positive=True) == 2
    for bad in (0, -2):
        with pytest.raises(ValueError, match=f"d_head must be an int >= 1, got {bad}"):
            check.even("d_head", bad, positive=True)
    with pytest.raises(ValueError, match="d_head must be even, got 3"):
        check.even("d_head", 3, positive=True)


# -- real numbers, probabilities, booleans, strings, choices ---------------------------------------


def test_finite_float_accepts_real_numbers_and_returns_a_float():
    assert (
        check.finite_float("x", 3) == 3.0 and type(check.finite_float("x", 3)) is float
    )
    assert check.finite_float("x", np.float32(0.5)) == 0.5
    assert check.finite_float("base", 10000, low=1, low_open=True) == 10000.0
    assert check.finite_float("eps", 0.0, low=0) == 0.0
    assert check.finite_float("p", 1.0, low=0, high=1) == 1.0


@pytest.mark.parametrize(
    ("value", "kwargs", "error", "match"),
    [
        (float("nan"), {}, ValueError, "x must be a finite number, got nan"),
        (float("inf"), {}, ValueError, "x must be a finite number, got inf"),
        (
            -float("inf"),
            {"low": 0},
            ValueError,
            "x must be a finite number >= 0, got -inf",
        ),
        (
            1.0,
            {"low": 1, "low_open": True},
            ValueError,
            "x must be a finite number > 1, got 1.0",
        ),
        (-0.5, {"low": 0}, ValueError, "x must be a finite number >= 0, got -0.5"),
        (2.0, {"high": 1}, ValueError, "x must be a finite number <= 1, got 2.0"),
        (
            1.0,
            {"high": 1, "high_open": True},
            ValueError,
            "x must be a finite number < 1",
        ),
        (
            1.0,
            {"low": 0, "high": 1, "high_open": True},
            ValueError,
            r"in \[0, 1\), got 1.0",
        ),
        (
            0.0,
            {"low": 0, "high": 1, "low_open": True},
            ValueError,
            r"in \(0, 1\], got 0.0",
        ),
        (True, {}, TypeError, "x must be a number, got bool True"),
        ("1.0", {}, TypeError, "x must be a number, got str '1.0'"),
        (torch.tensor(1.0), {}, TypeError, "x must be a number, got a tensor"),
        (1j, {}, TypeError, "x must be a number, got complex"),
    ],
)
def test_finite_float_rejects(value, kwargs, error, match):
    with pytest.raises(error, match=match):
        check.finite_float("x", value, **kwargs)


def test_probability():
    assert check.probability("dropout", 0) == 0.0
    assert check.probability("dropout", 0.999) == 0.999
    for bad in (1.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(
            ValueError, match=r"dropout must be a probability in \[0, 1\), got"
        ):
            check.probability("dropout", bad)
    with pytest.raises(TypeError, match="dropout must be a number, got bool False"):
        check.probability("dropout", False)
    with pytest.raises(TypeError, match="dropout must be a number, got str"):
        check.probability("dropout", "0.1")


def test_boolean():
    assert check.boolean("bias", True) is True and check.boolean("bias", False) is False
    for bad in (1, 0, "no", None, np.bool_(True)):
        with pytest.raises(TypeError, match="bias must be True or False, got"):
            check.boolean("bias", bad)


def test_booleans_checks_each_flag_in_order():
    assert check.booleans(a=True, b=False) is None
    with pytest.raises(TypeError, match="M: b must be True or False, got int 1"):
        check.booleans(a=True, b=1, c="no", owner="M")


def test_positive_ints_returns_the_ints_in_order():
    sizes = check.positive_ints(d_model=np.int64(8), n_heads=2)
    assert sizes == (8, 2) and all(type(size) is int for size in sizes)
    with pytest.raises(ValueError, match="M: n_heads must be an int >= 1, got 0"):
        check.positive_ints(d_model=8, n_heads=0, owner="M")
    with pytest.raises(TypeError, match="d_model must be an int, got float 8.0"):
        check.positive_ints(d_model=8.0)


def test_string():
    assert check.string("text", "") == ""
    with pytest.raises(ValueError, match="text must be a non-empty str, got ''"):
        check.string("text", "", nonempty=True)
    with pytest.raises(TypeError, match="text must be a str, got bytes b'abc'"):
        check.string("text", b"abc")


def test_instance():
    marker = object()
    assert check.instance("x", marker, object) is marker
    with pytest.raises(TypeError, match="M: past must be a dict, got tuple"):
        check.instance("past", (1,), dict, owner="M")
    with pytest.raises(TypeError, match="model must be an nn.Module, got str 'a'"):
        check.instance("model", "a", torch.nn.Module, what="an nn.Module")
    with pytest.raises(TypeError, match="n must be a int or a float, got str"):
        check.instance("n", "1", (int, float))


def test_one_of():
    assert check.one_of("kind", "pre", ("pre", "post")) == "pre"
    assert check.one_of("activation", "relu", {"relu": None, "gelu": None}) == "relu"
    with pytest.raises(
        ValueError, match="kind must be one of 'pre', 'post', got str 'mid'"
    ):
        check.one_of("kind", "mid", ("pre", "post"))
    with pytest.raises(
        ValueError, match=r"got list \['pre'\]"
    ):  # unhashable: no TypeError
        check.one_of("kind", ["pre"], ("pre", "post"))
    with pytest.raises(ValueError, match="got bool True"):  # True == 1, but it is not 1
        check.one_of("n", True, (1, 2))


def test_owner_and_hint_frame_the_message():
    with pytest.raises(
        ValueError, match=r"^FeedForward: d_ff must be an int >= 1, got 0; try 4$"
    ):
        check.positive_int("d_ff", 0, owner="FeedForward", hint="try 4")


def test_long_values_are_shortened_in_messages():
    with pytest.raises(TypeError) as info:
        check.string("text", list(range(1000)))
    assert len(str(info.value)) < 120 and str(info.value).endswith("...")


# -- tensors ------------------------------------------------------------------------------------


def test_tensor_passes_good_input_through():
    x = torch.randn(2, 3, 8)
    assert check.tensor("x", x) is x
    assert check.tensor("x", x, "batch seq d_model", d_model=8, floating=True) is x
    assert check.tensor("x", x, "... d_model", d_model=8) is x
    assert (
        check.tensor("x", x, "... batch seq d_model", batch=2) is x
    )  # "..." may be empty
    assert (
        check.tensor("ids", torch.zeros(4, dtype=torch.uint8), "seq", integer=True)
        is not None
    )


@pytest.mark.parametrize(
    ("x", "axes", "kwargs", "error", "match"),
    [
        ([1.0], None, {}, TypeError, r"x must be a torch.Tensor, got list \[1.0\]"),
        (np.ones(3), None, {}, TypeError, "x must be a torch.Tensor, got ndarray"),
        (torch.ones(3), "vocab d_model", {}, ValueError,
         r"x must have shape \(vocab d_model\), got shape \(3,\)"),
        (torch.ones(2, 3, 4), "vocab d_model", {}, ValueError, r"got shape \(2, 3, 4\)"),
        (torch.ones(3), "... seq d_head", {}, ValueError,
         r"x must have shape \(\.\.\. seq d_head\), got shape \(3,\)"),
        (torch.ones(2, 5), "... d_model", {"d_model": 4}, ValueError,
         r"x must have shape \(\.\.\. d_model\) with d_model=4, got shape \(2, 5\)"),
        (torch.ones(2, 5), "batch seq", {"batch": 3, "seq": 5}, ValueError,
         r"with batch=3, seq=5, got shape \(2, 5\)"),
        (torch.tensor(1.0), "... d_model", {"d_model": 1}, ValueError, r"got shape \(\)"),
        (torch.ones(2, dtype=torch.long), None, {"floating": True}, TypeError,
         r"x must be a floating-point tensor, got dtype torch.int64 \(ids\? embed them first\)"),
        (torch.ones(2, dtype=torch.bool), None, {"floating": True}, TypeError,
         "x must be a floating-point tensor, got dtype torch.bool$"),
        (torch.ones(2), None, {"integer": True}, TypeError,
         "x must be an integer tensor, got dtype torch.float32"),
        (torch.ones(2, dtype=torch.bool), None, {"integer": True}, TypeError, "got dtype torch.bool"),
        (torch.ones(2), None, {"boolean": True}, TypeError,
         "x must be a boolean tensor, got dtype torch.float32"),
        (torch.ones(2, dtype=torch.uint8), None, {"boolean": True}, TypeError, "got dtype torch.uint8"),
    ],
)  # fmt: skip
def test_tensor_rejects(x, axes, kwargs, error, match):
    with pytest.raises(error, match=match):
        check.tensor("x", x, axes, **kwargs)


def test_tensor_boolean_accepts_a_mask():
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert check.tensor("mask", mask, "q_pos k_pos", boolean=True) is mask


def test_broadcastable_accepts_every_shape_that_broadcasts():
    sizes = dict(batch=2, heads=4, q_pos=5, k_pos=7)
    for shape in [
        (),
        (7,),
        (5, 7),
        (1, 7),
        (2, 1, 1, 7),
        (4, 5, 7),
        (2, 4, 5, 7),
        (1, 1, 1, 1),
    ]:
        x = torch.zeros(shape)
        assert check.broadcastable("mask", x, "batch heads q_pos k_pos", **sizes) is x


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((5, 6), r"mask must broadcast to \(batch heads q_pos k_pos\) = \(2, 4, 5, 7\), got shape \(5, 6\)"),
        ((3, 5, 7), r"got shape \(3, 5, 7\)"),  # 3 heads against 4
        ((2, 5, 7), r"got shape \(2, 5, 7\)"),  # a batch axis where the heads go
        ((1, 1, 1, 5, 7), r"got shape \(1, 1, 1, 5, 7\)"),  # one axis too many
    ],
)  # fmt: skip
def test_broadcastable_rejects(shape, match):
    sizes = dict(batch=2, heads=4, q_pos=5, k_pos=7)
    with pytest.raises(ValueError, match=match):
        check.broadcastable(
            "mask", torch.zeros(shape), "batch heads q_pos k_pos", **sizes
        )


def test_broadcastable_needs_a_tensor_and_every_size():
    with pytest.raises(TypeError, match="^sdpa: mask must be a torch.Tensor, got list"):
        check.broadcastable(
            "mask", [[True]], "q_pos k_pos", q_pos=1, k_pos=1, owner="sdpa"
        )
    with pytest.raises(TypeError, match="every axis of 'q_pos k_pos' needs a size"):
        check.broadcastable("mask", torch.ones(1), "q_pos k_pos", q_pos=1)
    with pytest.raises(TypeError, match="needs a size"):
        check.broadcastable("mask", torch.ones(1), "... k_pos", k_pos=1)


def test_broadcastable_checks_the_dtype_kind_too():
    sizes = dict(batch=2, heads=4, q_pos=5, k_pos=7)
    mask = torch.ones(5, 7, dtype=torch.bool)
    assert (
        check.broadcastable("m", mask, "batch heads q_pos k_pos", boolean=True, **sizes)
        is mask
    )
    with pytest.raises(
        TypeError, match="m must be a boolean tensor, got dtype torch.float32"
    ):
        check.broadcastable(
            "m", mask.float(), "batch heads q_pos k_pos", boolean=True, **sizes
        )
    with pytest.raises(TypeError, match="b must be a floating-point tensor"):
        check.broadcastable(
            "b", mask, "batch heads q_pos k_pos", floating=True, **sizes
        )


def test_tensor_sizes_must_name_an_axis():
    with pytest.raises(TypeError, match="bad axes"):
        check.tensor("x", torch.ones(2), "seq", d_model=2)
    with pytest.raises(TypeError, match="need the axes"):
        check.tensor("x", torch.ones(2), d_model=2)
    with pytest.raises(TypeError, match="bad axes"):
        check.tensor("x", torch.ones(2), "seq ...")


def test_same_dtype_and_device():
    q, k = torch.randn(2, 3), torch.randn(2, 3)
    check.same_dtype_and_device(q=q, k=k, v=torch.randn(1))
    with pytest.raises(
        TypeError,
        match="q, k and v must share a dtype, got q torch.float64, k torch.float32, v torch.float32",
    ):
        check.same_dtype_and_device(q=q.double(), k=k, v=k)
    with pytest.raises(
        ValueError,
        match="x and weight must be on one device, got x on meta, weight on cpu",
    ):
        check.same_dtype_and_device(x=q.to("meta"), weight=k)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        check.same_dtype_and_device(q=q, k=[1.0])
    with pytest.raises(TypeError, match="at least two"):
        check.same_dtype_and_device(q=q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        check.same_dtype_and_device(x=q.bfloat16(), weight=k, autocast=True)
        with pytest.raises(TypeError, match="must share a dtype"):
            check.same_dtype_and_device(x=q.bfloat16(), weight=k)
    with pytest.raises(TypeError, match="must share a dtype"):  # autocast is off again
        check.same_dtype_and_device(x=q.bfloat16(), weight=k, autocast=True)


def test_same_device():
    check.same_device(ids=torch.zeros(2, dtype=torch.long), weight=torch.randn(3, 2))
    with pytest.raises(ValueError, match="ids and weight must be on one device"):
        check.same_device(
            ids=torch.zeros(2, dtype=torch.long, device="meta"), weight=torch.ones(1)
        )


def test_layer_input_checks_axes_dtype_and_device_against_the_weight():
    weight, x = torch.zeros(4, 8), torch.zeros(2, 3, 8)
    assert check.layer_input("x", x, "... d_model", weight, d_model=8) is x
    with pytest.raises(ValueError, match=r"L: x must have shape \(\.\.\. d_model\)"):
        check.layer_input("x", x, "... d_model", weight, d_model=4, owner="L")
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        check.layer_input("x", x.long(), "... d_model", weight)
    with pytest.raises(TypeError, match="x and weight must share a dtype"):
        check.layer_input("x", x.double(), "... d_model", weight)
    with pytest.raises(ValueError, match="x and weight must be on one device"):
        check.layer_input("x", x.to("meta"), "... d_model", weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (
            check.layer_input("x", x.bfloat16(), "... d_model", weight).shape == x.shape
        )


def test_layer_forward_checks_a_layers_input_against_its_weight():
    class Layer(torch.nn.Module):
        def __init__(self, affine: bool = True) -> None:
            super().__init__()
            self.d_model, self.inner = 8, torch.nn.Linear(8, 4) if affine else None

    plain = check.layer_forward("... d_model", "inner.weight")
    casts = check.layer_forward("... seq d_model", "inner.weight", casts=True)
    x = torch.zeros(2, 3, 8)
    plain(Layer(), x)
    casts(Layer(), x.double(), 2)
    casts(Layer(affine=False), x.to("meta"))  # no weight: nothing to compare
    with pytest.raises(ValueError, match=r"Layer: x must have shape .* with d_model=8"):
        plain(Layer(), torch.zeros(2, 4))
    with pytest.raises(TypeError, match="x and weight must share a dtype"):
        plain(Layer(), x.double())
    with pytest.raises(ValueError, match="x and weight must be on one device"):
        casts(Layer(), x.to("meta"))
    with pytest.raises(ValueError, match="Layer: offset must be an int >= 0, got -1"):
        casts(Layer(), x, -1)
    hidden = check.layer_forward("... d_model", "inner.weight", name="hidden")
    with pytest.raises(TypeError, match="hidden must be a floating-point tensor"):
        hidden(Layer(), hidden=x.long())


def test_ids_in_range_reads_the_values():
    ids = torch.tensor([[0, 9], [3, 4]])
    assert check.ids_in_range("token id", ids, 10) is ids
    assert (
        check.ids_in_range("token id", torch.zeros(0, dtype=torch.long), 1).numel() == 0
    )
    with pytest.raises(
        ValueError,
        match=r"^E: token id must be in 0\.\.9, got 1\.\.10$",
    ):
        check.ids_in_range("token id", ids + 1, 10, owner="E")
    with pytest.raises(
        ValueError, match=r"^token id must be in 0\.\.9, got -1\.\.8; h$"
    ):
        check.ids_in_range("token id", ids - 1, 10, hint="h")
    # without a size: any id >= 0 (a length, a prefix)
    assert check.ids_in_range("lengths", ids, None) is ids
    with pytest.raises(ValueError, match=r"^lengths must be >= 0, got -1\.\.8$"):
        check.ids_in_range("lengths", ids - 1, None)


def test_same_device_skips_optional_tensors_not_given():
    q = torch.randn(2, 3)
    check.same_device(q=q, mask=None, bias=None)  # nothing to compare q with
    with pytest.raises(
        ValueError, match="q and bias must be on one device, got q on cpu, bias on meta"
    ):
        check.same_device(q=q, mask=None, bias=torch.zeros(1, device="meta"))
    with pytest.raises(TypeError, match="at least two"):
        check.same_device(q=q)


def test_attention_inputs_name_the_tensor_at_fault():
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 6)
    check.attention_inputs(q, k, v)  # grouped queries, d_v != d_head: fine
    with pytest.raises(
        ValueError, match=r"A: k must have shape .* d_head=8, got shape \(2, 2, 7, 4\)"
    ):
        check.attention_inputs(q, k[..., :4], v, owner="A")
    with pytest.raises(ValueError, match=r"v must have shape .* k_pos=7, got"):
        check.attention_inputs(q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="q has 4 heads, not a multiple of the 3"):
        check.attention_inputs(q, torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8))
    with pytest.raises(TypeError, match="q, k and v must share a dtype"):
        check.attention_inputs(q.double(), k, v)
    with pytest.raises(TypeError, match="k must be a floating-point tensor"):
        check.attention_inputs(q, k.long(), v)


def test_nonnegative_ints_divisible_function_and_float_dtype():
    assert check.nonnegative_ints(a=0, b=np.int64(3)) == (0, 3)
    with pytest.raises(ValueError, match="b must be an int >= 0, got -1"):
        check.nonnegative_ints(a=0, b=-1)
    check.divisible(d_model=32, n_heads=4)
    with pytest.raises(
        ValueError, match="^M: d_model=30 is not divisible by n_heads=4; why$"
    ):
        check.divisible(d_model=30, n_heads=4, owner="M", hint="why")
    with pytest.raises(ValueError, match="n_heads=4 is not divisible by n_kv=0"):
        check.divisible(n_heads=4, n_kv=0)
    with pytest.raises(TypeError, match="a value and its divisor"):
        check.divisible(d_model=32)
    assert check.function("fn", len) is len
    with pytest.raises(TypeError, match="fn must be callable, got str 'x'"):
        check.function("fn", "x")
    assert check.float_dtype("dtype", torch.bfloat16) is torch.bfloat16
    for bad in (torch.int64, "float32", float):
        with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
            check.float_dtype("dtype", bad)


def test_string_utf8_names_the_lone_surrogate():
    assert check.string("text", "héllo", utf8=True) == "héllo"
    check.string("text", "a\udc80")  # a str all the same, when UTF-8 is not asked
    with pytest.raises(
        ValueError, match=r"T: text contains '\\udc80' at position 1, a lone surrogate"
    ):
        check.string("text", "a\udc80", utf8=True, owner="T")


def test_strings_is_a_list_of_str_not_one_str():
    assert check.strings("tokens", ("<a>", "<b>")) == ["<a>", "<b>"]
    assert check.strings("tokens", []) == []
    with pytest.raises(
        TypeError, match=r"tokens must be a list of str, got str; write"
    ):
        check.strings("tokens", "<eos>")
    with pytest.raises(TypeError, match="tokens must be a list of str, got int"):
        check.strings("tokens", 3)
    with pytest.raises(TypeError, match=r"tokens\[1\] must be a str, got bytes"):
        check.strings("tokens", ["a", b"b"])
    with pytest.raises(ValueError, match=r"tokens\[0\] must be a non-empty str"):
        check.strings("tokens", [""], nonempty=True)
    with pytest.raises(ValueError, match=r"tokens must be distinct, got \['a', 'a'\]"):
        check.strings("tokens", ["a", "a"], distinct=True)
    check.strings("tokens", ["a", "a"])  # repeats are refused only when asked
    with pytest.raises(ValueError, match=r"tokens\[0\] contains .* lone surrogate"):
        check.strings("tokens", ["\ud800"], utf8=True)


def test_text_lines_checks_the_iterable_now_and_each_line_when_read():
    assert list(check.text_lines("lines", iter(["a\n", "b"]))) == ["a\n", "b"]
    with pytest.raises(TypeError, match="lines must be an iterable of str .* got str"):
        check.text_lines("lines", "one string")
    with pytest.raises(TypeError, match="got int"):
        check.text_lines("lines", 3)
    lazy = check.text_lines("lines", ["ok\n", b"bytes\n"], owner="E")
    assert next(lazy) == "ok\n"  # nothing is read before it is asked for
    with pytest.raises(
        TypeError, match="E: line 1 must be a str, got bytes .*text mode"
    ):
        next(lazy)


def test_token_ids_converts_and_checks_each_id():
    assert check.token_ids("ids", [1, np.int64(2)]) == [1, 2]
    assert check.token_ids("ids", torch.tensor([3, 0]), 4) == [3, 0]
    assert check.token_ids("ids", np.array([5]), 6) == [5]
    assert check.token_ids("ids", (), 1) == []
    with pytest.raises(
        TypeError, match=r"ids must be a sequence of integer ids, got str 'ab' \(text"
    ):
        check.token_ids("ids", "ab")
    with pytest.raises(TypeError, match="sequence of integer ids, got int 7"):
        check.token_ids("ids", torch.tensor(7))  # one id, not a sequence
    with pytest.raises(TypeError, match=r"ids\[1\] must be an int, got float 1.5"):
        check.token_ids("ids", [0, 1.5])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got list .* 1-D"):
        check.token_ids("ids", torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got bool True"):
        check.token_ids("ids", [True])
    with pytest.raises(
        ValueError,
        match=r"^D: id 9 at position 2 is out of range for a vocabulary of 4 tokens "
        r"\(valid ids are 0\.\.3\)$",
    ):
        check.token_ids("ids", [0, 3, 9, -1], 4, owner="D")
    with pytest.raises(ValueError, match="id -1 at position 1"):
        check.token_ids("ids", [0, -1], 4)
    assert check.token_ids("ids", [0, -1]) == [0, -1]  # no range without a vocabulary


def test_docstring_lists_every_check():
    public = [
        name
        for name, value in vars(check).items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == check.__name__
    ]
    assert len(public) >= 30  # the checks, front_door, trusted, trusting
    for name in public:
        assert f":func:`{name}`" in check.__doc__, name


# -- torch.compile: the checks in a forward cause no graph break ------------------------------------


def test_forward_checks_cause_no_graph_break():
    from lib.attention import MultiHeadAttention, padding_mask
    from lib.embeddings import TokenEmbedding, Unembedding
    from lib.ffn import FeedForward, GatedFeedForward
    from lib.norms import LayerNorm, ResidualSublayer, RMSNorm
    from lib.positions import (
        LearnedPositionalEmbedding,
        RotaryEmbedding,
        SinusoidalPositionalEncoding,
    )

    x = torch.randn(2, 3, 8)
    attention = MultiHeadAttention(8, 2, backend="sdpa")
    cases = [
        (FeedForward(8), (x,), {}),
        (GatedFeedForward(8), (x,), {}),
        (RotaryEmbedding(8), (torch.randn(2, 2, 3, 8), 4), {}),
        (SinusoidalPositionalEncoding(8), (x, 2), {}),
        (LearnedPositionalEmbedding(16, 8), (x, 1), {}),
        (TokenEmbedding(10, 8, check_ids=False), (torch.randint(0, 10, (2, 3)),), {}),
        (Unembedding(8, 10), (x,), {}),
        (attention, (x,), {}),
        (attention, (x,), {"mask": padding_mask([3, 2]), "causal": True}),
        (
            MultiHeadAttention(8, 2, 1, backend="math", scale=0.5),
            (x,),
            {"causal": True},
        ),
        (LayerNorm(8), (x,), {}),
        (RMSNorm(8), (x,), {}),
        (LayerNorm(8, fused=False), (x,), {}),
        (ResidualSublayer(FeedForward(8), 8), (x,), {}),
        (ResidualSublayer(attention, 8, "post", "rmsnorm"), (x,), {"causal": True}),
    ]
    for module, args, kwargs in cases:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(module)(*args, **kwargs)
        assert explained.graph_break_count == 0, (
            type(module).__name__,
            explained.break_reasons,
        )
    torch._dynamo.reset()


# -- the package surface ------------------------------------------------------------------------


def test_import_lib_is_lazy_and_submodules_load_on_first_use():
    code = (
        "import sys, lib; "
        "assert 'lib.tokenizer' not in sys.modules and 'torch' not in sys.modules; "
        "tok = lib.tokenizer.BPETokenizer(); "
        "assert 'lib.tokenizer' in sys.modules and lib.positions.RotaryEmbedding; "
        "print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_lib_lists_the_modules_that_exist():
    for name in ("tokenizer", "embeddings", "positions", "attention", "ffn", "norms", "utils",
                 "datasets", "exercises"):  # fmt: skip
        assert name in lib.__all__ and name in dir(lib)
        assert getattr(lib, name).__name__ == f"lib.{name}"
    assert "_checks" not in lib.__all__


def test_a_module_not_written_yet_is_a_clear_attribute_error(tmp_path, monkeypatch):
    future = [name for name in lib._SUBMODULES if name not in lib.__all__]
    for name in future:
        with pytest.raises(AttributeError, match=f"lib/{name}.py does not exist yet"):
            getattr(lib, name)
        assert not hasattr(lib, name)
    # the same path for a planned module whose file is missing, whatever exists today
    monkeypatch.setattr(lib, "_exists", lambda name: False)
    monkeypatch.delattr(lib, "flash", raising=False)
    with pytest.raises(
        AttributeError, match=r"module 'lib' has no attribute 'flash': lib/flash.py"
    ):
        lib.__getattr__("flash")


def test_an_unknown_name_is_an_attribute_error_listing_the_modules():
    with pytest.raises(
        AttributeError, match="no attribute 'tokeniser'; its modules are tokenizer"
    ):
        lib.tokeniser  # noqa: B018
    with pytest.raises(ImportError):
        from lib import tokeniser  # noqa: F401


def test_forward_methods_state_their_shapes():
    import inspect

    from torch import nn

    for module in (lib.embeddings, lib.positions, lib.attention, lib.ffn, lib.norms):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, nn.Module):
                doc = obj.forward.__doc__ or ""
                assert "Shapes:" in doc, (
                    f"{module.__name__}.{name}.forward has no shapes"
                )


# -- trust: checks once, at the front door (issue 30) ----------------------------------------------


def test_front_door_checks_from_outside_and_trusts_inside():
    calls = []

    def checker(x, *, n=1):
        calls.append(("checked", x, n))
        if x < 0:
            raise ValueError(f"x must be >= 0, got {x}")

    @check.front_door(checker)
    def outer(x, *, n=1):
        assert check.trusted()  # the body runs with trust on
        return inner(x) + n

    @check.front_door(checker)
    def inner(x, *, n=1):
        return x

    assert outer(2, n=3) == 5
    # inner, called by a checked caller, did not check
    assert calls == [("checked", 2, 3)]
    assert not check.trusted()
    assert inner(4) == 4 and calls[-1] == ("checked", 4, 1)  # called directly: checked
    with pytest.raises(ValueError, match="x must be >= 0, got -1"):
        outer(-1)
    assert not check.trusted()
    with check.trusting():
        assert outer(-1) == 0  # trusted by the caller: no check runs at all
        assert check.trusted()
    assert not check.trusted() and outer.__name__ == "outer"


def test_trust_is_per_thread_and_ends_with_an_error_in_the_body():
    seen = []

    @check.front_door(lambda: None)
    def boom():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        boom()
    assert not check.trusted()
    with check.trusting():
        worker = threading.Thread(target=lambda: seen.append(check.trusted()))
        worker.start()
        worker.join()
    assert seen == [False]  # another thread's calls still check


def test_layer_forward_keeps_positions_inside_a_table():
    class Table(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.d_model, self.max_len = 4, 6
            self.weight = torch.nn.Parameter(torch.zeros(6, 4))

    checker = check.layer_forward(
        "... seq d_model", "weight", casts=True, rows="max_len"
    )
    table = Table()
    checker(table, torch.zeros(2, 6, 4))  # rows 0..5: all there
    checker(table, torch.zeros(2, 2, 4), offset=4)
    with pytest.raises(
        ValueError,
        match=r"^Table: positions 4\.\.6 go past max_len=6: the table ends at row 5$",
    ):
        checker(table, torch.zeros(2, 3, 4), offset=4)


# -- modules composed (issue 40, item 7) --------------------------------------------------------


def test_attention_inputs_refuse_heads_of_zero_width():
    empty = torch.randn(2, 4, 5, 0)
    with pytest.raises(
        ValueError, match=r"q \(2, 4, 5, 0\) has d_head=0: a head needs"
    ):
        check.attention_inputs(empty, empty, empty)


def test_causal_fits_names_the_queries_that_would_see_nothing():
    check.causal_fits(3, 3)
    check.causal_fits(1, 9)
    with pytest.raises(
        ValueError, match="f: a causal mask with more .* the first 2 queries .*; hint"
    ):
        check.causal_fits(5, 3, owner="f", hint="hint")


class _Sized:
    def __init__(self, **sizes):
        self.__dict__.update(sizes)

    def __call__(self, q_len, k_len, offset=0):
        return torch.zeros(getattr(self, "n_heads", 1), q_len, k_len)


def test_built_for_compares_the_sizes_a_module_carries():
    rope = _Sized(d_head=16)
    assert check.built_for("rope", rope, d_head=16) is rope
    with pytest.raises(
        ValueError,
        match=r"M: rope \(_Sized\) was built for d_head=16, but is used with d_head=8",
    ):
        check.built_for("rope", rope, d_head=8, owner="M")
    check.built_for("rope", lambda x, offset=0: x, d_head=8)  # nothing to compare
    check.built_for("rope", _Sized(d_head=True), d_head=8)  # not a size: not compared
    with pytest.raises(TypeError, match="rope must be callable, got int 3"):
        check.built_for("rope", 3, d_head=8)


def test_score_bias_calls_a_module_once_and_checks_what_it_returns():
    scores = (2, 4, 5, 7)
    assert check.score_bias("b", None, scores) is None
    table = torch.zeros(3, 5, 7)  # a tensor is returned for the caller to check
    assert check.score_bias("b", table, scores) is table
    calls = []

    def bias(q_len, k_len, offset):
        calls.append((q_len, k_len, offset, torch.is_grad_enabled()))
        return torch.zeros(4, q_len, k_len)

    assert check.score_bias("b", bias, scores, 2).shape == (4, 5, 7)
    assert calls == [(5, 7, 2, False)]  # once, without gradients
    with pytest.raises(ValueError, match=r"b \(_Sized\) was built for n_heads=8"):
        check.score_bias("b", _Sized(n_heads=8), scores)
    with pytest.raises(
        ValueError,
        match=r"M: b\(5, 7, 0\) must broadcast to \(batch heads q_pos k_pos\) = "
        r"\(2, 4, 5, 7\), got shape \(5, 8\)",
    ):
        check.score_bias("b", lambda q, k, o: torch.zeros(q, k + 1), scores, owner="M")
    with pytest.raises(
        TypeError, match=r"b\(5, 7, 0\) must be a torch.Tensor, got list"
    ):
        check.score_bias("b", lambda q, k, o: [0.0], scores)
    with pytest.raises(
        TypeError, match="must be a floating-point tensor, got dtype torch.bool"
    ):
        check.score_bias(
            "b", lambda q, k, o: torch.ones(q, k, dtype=torch.bool), scores
        )
    with pytest.raises(
        TypeError,
        match=r"b must be a tensor or a module called as b\(q_len, k_len, offset\)",
    ):
        check.score_bias("b", "alibi", scores)
