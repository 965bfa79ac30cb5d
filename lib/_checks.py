"""Argument checks shared by the modules of ``lib``: one place, one style of message.

Configs, constructors of public modules and public functions call these at their front
door, once, so that bad input fails at once with a message that names the argument, says
what was expected and shows what arrived; inner layers called by a checked caller do not
call them again. Every check returns the value (converted where it says so) or raises
``TypeError`` (the wrong kind of thing) or ``ValueError`` (the right kind, a wrong value).

What they read: the tensor checks read only types, shapes, dtypes and devices, never a
tensor's values, so they cost no device sync and ``torch.compile`` traces through them
without a graph break. Three exceptions read values: :func:`integer` (and the int checks
built on it) given a 0-d tensor, :func:`ids_in_range`, whose job is to read them, and
:func:`token_ids`, which turns a tensor of ids into a list (a tokenizer's decode). A
check that reads values runs only at a public function's front door, on CPU tensors or
once per call (a prompt), never once per decoded token: on a GPU each read waits for the
device.

Scalars:

* :func:`integer` ``(name, value)`` -> ``int``: any int (Python, NumPy, 0-d integer tensor), not a bool;
* :func:`int_at_least` ``(name, value, minimum)`` -> ``int``: an int ``>= minimum``;
* :func:`positive_int` ``(name, value)`` -> ``int``: an int ``>= 1``;
* :func:`int_in_range` ``(name, value, low, high)`` -> ``int``: an int in ``low..high`` (both included);
* :func:`even` ``(name, value, *, positive=False)`` -> ``int``: an even int (sin/cos or
  rotation pairs), ``>= 2`` with ``positive=True``;
* :func:`finite_float` ``(name, value, *, low=None, high=None, low_open=False, high_open=False)``
  -> ``float``: a finite real number, optionally in a range;
* :func:`probability` ``(name, p)`` -> ``float``: a dropout probability in ``[0, 1)``;
* :func:`boolean` ``(name, value)`` -> ``bool``: ``True`` or ``False`` itself (not 0, 1 or a string);
* :func:`booleans` ``(**values)``: :func:`boolean` on each keyword (several flags in one line);
* :func:`positive_ints` ``(**values)`` -> ``tuple[int, ...]``: :func:`positive_int` on each
  keyword, the ints in the keywords' order (several sizes in one line);
* :func:`nonnegative_ints` ``(**values)`` -> ``tuple[int, ...]``: the same with ``>= 0``
  (offsets, lengths, counts that may be zero);
* :func:`string` ``(name, value, *, nonempty=False, utf8=False)`` -> ``str`` (``utf8``:
  one that UTF-8 can encode, with no lone surrogate);
* :func:`strings` ``(name, values, *, nonempty=False, distinct=False, utf8=False)`` ->
  ``list[str]``: a list of str (one str is refused: it is not a list of them);
* :func:`text_lines` ``(name, lines)`` -> an iterator of ``str``: an iterable of lines
  (an open text file), not one str; each line is checked as it is read;
* :func:`token_ids` ``(name, ids, vocab_size=None)`` -> ``list[int]``: a 1-D sequence,
  array or tensor of int ids (in ``0..vocab_size - 1`` when a size is given);
* :func:`divisible` ``(**pair)``: of two keywords (ints), the first is a multiple of the
  second, such as ``divisible(d_model=d_model, n_heads=n_heads)``;
* :func:`causal_fits` ``(q_len, k_len)``: a causal mask aligned to the last key (the
  queries are the last positions), with no offset given, has at least as many keys as
  queries.
* :func:`function` ``(name, value)`` -> the value, which must be callable;
* :func:`float_dtype` ``(name, dtype)`` -> ``dtype``, a floating-point ``torch.dtype``;
* :func:`instance` ``(name, value, cls, *, what=None)`` -> the value, which must be an
  instance of ``cls`` (the message says ``what``, default ``"a <cls name>"``);
* :func:`one_of` ``(name, value, choices)`` -> the value, which must equal one of ``choices``
  (and have its type: ``True`` is not ``1``).

Tensors:

* :func:`tensor` ``(name, x, axes=None, *, floating=False, integer=False, boolean=False, **sizes)``
  -> ``x``: a ``torch.Tensor`` with the named axes (``"batch heads seq d_head"``;
  ``"... seq d_model"`` allows any leading axes), the sizes given by keyword (``d_model=512``)
  and a floating-point, integer or boolean dtype;
* :func:`broadcastable` ``(name, x, axes, *, floating=False, boolean=False, **sizes)`` -> ``x``:
  a tensor that broadcasts to the shape the named axes and their sizes give (a mask
  ``(q_pos k_pos)`` or ``(batch 1 1 k_pos)`` against ``(batch heads q_pos k_pos)``), of a
  floating-point or boolean dtype when asked;
* :func:`layer_input` ``(name, x, axes, weight, **sizes)`` -> ``x``: a layer's input, a
  floating-point :func:`tensor` with those axes and sizes, on the device of the layer's
  ``weight`` and of its dtype (autocast allowed, as :func:`same_dtype_and_device` does);
* :func:`ids_in_range` ``(name, ids, size)`` -> ``ids``: every value of an integer tensor in
  ``0..size - 1`` (token ids against a vocabulary, labels; ``>= 0`` with ``size=None``),
  lib's one check of a range of ids; it **reads the values**;
* :func:`same_device` ``(**tensors)``: the named tensors are on one device (``ValueError``);
  a ``None`` among them is an optional tensor not given, and is skipped;
* :func:`layer_forward` ``(axes, weight, *, name="x", casts=False)`` -> a checker for
  :func:`front_door`: a layer's ``forward(x)`` or ``forward(x, offset=0)``, ``x`` a
  floating-point tensor with those axes (the last one's size read from the layer's
  attribute of that name), on the device of the layer's ``weight`` (an attribute path)
  and of its dtype (as :func:`layer_input`), unless the layer ``casts`` the weight to
  ``x``'s dtype itself; ``offset`` an int ``>= 0``;
* :func:`attention_inputs` ``(q, k, v)``: queries ``(batch heads q_pos d_head)``, keys
  ``(batch kv_heads k_pos d_head)`` and values ``(batch kv_heads k_pos d_v)`` of one
  floating dtype on one device, ``heads`` a multiple of ``kv_heads``, ``d_head >= 1``;
* :func:`same_dtype_and_device` ``(*, autocast=False, **tensors)``: the named tensors are on
  one device and share a dtype (``TypeError``); with ``autocast=True`` the dtypes may differ
  inside an autocast region, which casts them itself.

Modules composed (a position module handed to attention):

* :func:`built_for` ``(name, value, **sizes)`` -> the value, a callable (a function, a
  module) which, where it carries an attribute named after one of the sizes (a rotary
  module's ``d_head``, a bias module's ``n_heads``), was built for that size;
* :func:`score_bias` ``(name, bias, scores, offset=0)`` -> a tensor or ``None``: an
  additive score bias given as a tensor (returned as it is, for the caller's
  :func:`broadcastable`), or as a callable ``bias(q_len, k_len, offset)`` (ALiBi, T5's
  buckets), which is **called** here, once and without gradients, and whose result must
  be a floating-point tensor that broadcasts to ``scores``, the sizes ``(batch heads q_pos
  k_pos)``.

Every check also takes the keywords ``owner`` (the public function or class, such as
``"FeedForward"``, put in front of the message) and ``hint`` (a sentence put after it).

Trust (check at the front door, trust inside):

* :func:`front_door` ``(checker)``: a decorator for a public function or method. Called
  from outside, it runs ``checker`` on the arguments, then the body with trust on, so
  that every layer the body calls skips its own checks; called while trust is on (by a
  checked caller), it runs the body alone, at the cost of reading one flag;
* :func:`trusted` ``()`` -> ``bool``: whether trust is on (a layer's cheap test);
* :func:`trusting` ``()``: a context manager that turns trust on for a block (a decoding
  loop that feeds back the tokens it chose itself, after the prompt's checked step).

Trust is per thread, and it is off again once the outermost checked call returns (or
raises), so a layer called by the user directly always checks its arguments.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

import torch

Say = str | None  # the type of ``owner`` and ``hint``, which every check takes


# -- trust: checks once, at the front door --------------------------------------------------
class _Trust(threading.local):
    def __init__(self) -> None:
        self.on = False  # per thread: a checked caller's call is running


_TRUST = _Trust()


def trusted() -> bool:
    """Whether a checked caller is running: then a layer skips its checks."""
    return _TRUST.on


class trusting:
    """``with trusting():`` the calls inside skip their checks (the caller made them)."""

    def __enter__(self) -> None:
        self.before, _TRUST.on = _TRUST.on, True

    def __exit__(self, *exc: object) -> None:
        _TRUST.on = self.before


def front_door(checker: Callable[..., Any]) -> Callable:
    """Decorate a public function or method: from outside, ``checker(*args, **kwargs)``
    runs first (it raises on bad input), then the body with trust on; inside a checked
    call, the body alone."""

    def decorate(body: Callable) -> Callable:
        @functools.wraps(body)
        def door(*args: Any, **kwargs: Any) -> Any:
            if _TRUST.on:
                return body(*args, **kwargs)
            checker(*args, **kwargs)
            _TRUST.on = True  # (a plain flag, not trusting(): torch.compile traces it)
            try:
                return body(*args, **kwargs)
            finally:
                _TRUST.on = False

        return door

    return decorate


def _fail(
    error: type[Exception], text: str, owner: Say = None, hint: Say = None
) -> NoReturn:
    """Raise ``error`` with ``text``, the owner in front of it and the hint after it."""
    raise error((f"{owner}: " if owner else "") + text + (f"; {hint}" if hint else ""))


def _describe(value: Any) -> str:
    """A short description of what arrived: its type and value (or a tensor's shape and dtype)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _names(names: Iterable[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    *rest, last = names
    return f"{', '.join(rest)} and {last}" if rest else last


# -- scalars ------------------------------------------------------------------------------------
def integer(name: str, value: Any, *, owner: Say = None, hint: Say = None) -> int:
    """``value`` as a Python int: an int, a NumPy integer or a 0-d integer tensor, never a bool.

    (A 0-d tensor is read, which syncs with a GPU and which ``torch.compile`` cannot trace;
    pass Python ints where speed matters.)
    """
    is_bool = isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool
    try:
        if not is_bool:
            return operator.index(value)
    except TypeError:
        pass
    _fail(TypeError, f"{name} must be an int, got {_describe(value)}", owner, hint)


def int_at_least(name: str, value: Any, minimum: int, **say: Say) -> int:
    """``value`` as an int ``>= minimum``."""
    if (value := integer(name, value, **say)) < minimum:
        _fail(ValueError, f"{name} must be an int >= {minimum}, got {value}", **say)
    return value


def positive_int(name: str, value: Any, **say: Say) -> int:
    """``value`` as an int ``>= 1`` (a size: ``d_model``, ``n_heads``, ``vocab_size``...)."""
    return int_at_least(name, value, 1, **say)


def int_in_range(name: str, value: Any, low: int, high: int, **say: Say) -> int:
    """``value`` as an int in ``low..high``, both ends included (an index: ``0..size - 1``)."""
    if not low <= (value := integer(name, value, **say)) <= high:
        _fail(ValueError, f"{name} must be an int in {low}..{high}, got {value}", **say)
    return value


def even(name: str, value: Any, *, positive: bool = False, **say: Say) -> int:
    """``value`` as an even int (``>= 2`` too with ``positive=True``: a size)."""
    value = (
        int_at_least(name, value, 1, **say) if positive else integer(name, value, **say)
    )
    if value % 2:
        _fail(ValueError, f"{name} must be even, got {value}", **say)
    return value


def _real(name: str, value: Any, owner: Say, hint: Say) -> float:
    """``value`` as a float: any real number (int, float, NumPy scalar), not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(
            TypeError, f"{name} must be a number, got {_describe(value)}", owner, hint
        )
    return float(value)


def finite_float(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    owner: Say = None,
    hint: Say = None,
) -> float:
    """``value`` as a finite float, optionally within ``low``/``high`` (open ends excluded).

    A real number of any kind is accepted (int, float, NumPy scalar); a bool, a string, a
    tensor, NaN and ±inf are not.
    """
    value = _real(name, value, owner, hint)
    above = low is None or (value > low if low_open else value >= low)
    below = high is None or (value < high if high_open else value <= high)
    if not (math.isfinite(value) and above and below):
        ends = [f"{'>' if low_open else '>='} {low:g}" if low is not None else ""]
        ends += [f"{'<' if high_open else '<='} {high:g}" if high is not None else ""]
        if all(ends):  # both ends: an interval
            ends = [
                f"in {'(' if low_open else '['}{low:g}, {high:g}{')]'[not high_open]}"
            ]
        text = f"{name} must be a finite number{''.join(' ' + e for e in ends if e)}"
        _fail(ValueError, f"{text}, got {value!r}", owner, hint)
    return value


def probability(name: str, p: Any, *, owner: Say = None, hint: Say = None) -> float:
    """``p`` as a float in ``[0, 1)``: a dropout probability (1 would drop everything)."""
    if not 0.0 <= (p := _real(name, p, owner, hint)) < 1.0:  # False for NaN too
        _fail(
            ValueError,
            f"{name} must be a probability in [0, 1), got {p!r}",
            owner,
            hint,
        )
    return p


def boolean(name: str, value: Any, *, owner: Say = None, hint: Say = None) -> bool:
    """``value`` itself, which must be ``True`` or ``False`` (``1`` or ``"no"`` are refused)."""
    if not isinstance(value, bool):
        _fail(
            TypeError,
            f"{name} must be True or False, got {_describe(value)}",
            owner,
            hint,
        )
    return value


def booleans(*, owner: Say = None, hint: Say = None, **values: Any) -> None:
    """Every keyword's value is ``True`` or ``False`` (:func:`boolean` on each, in order)."""
    for name, value in values.items():
        boolean(name, value, owner=owner, hint=hint)


def positive_ints(
    *, owner: Say = None, hint: Say = None, **values: Any
) -> tuple[int, ...]:
    """The keywords' values as ints ``>= 1`` (:func:`positive_int` on each), in order."""
    return tuple(
        int_at_least(n, v, 1, owner=owner, hint=hint) for n, v in values.items()
    )


def nonnegative_ints(
    *, owner: Say = None, hint: Say = None, **values: Any
) -> tuple[int, ...]:
    """The keywords' values as ints ``>= 0`` (:func:`int_at_least` on each), in order."""
    return tuple(
        int_at_least(n, v, 0, owner=owner, hint=hint) for n, v in values.items()
    )


def divisible(*, owner: Say = None, hint: Say = None, **pair: int) -> None:
    """Of two keywords (ints, checked already), the first is a multiple of the second:
    ``divisible(d_model=30, n_heads=4)`` raises ``d_model=30 is not divisible by
    n_heads=4``. Zero divides nothing."""
    if len(pair) != 2:
        raise TypeError(
            f"divisible() takes a value and its divisor, got {sorted(pair)}"
        )
    (name, value), (by_name, by) = pair.items()
    if by == 0 or value % by:
        _fail(
            ValueError,
            f"{name}={value} is not divisible by {by_name}={by}",
            owner,
            hint,
        )


def function(name: str, value: Any, *, owner: Say = None, hint: Say = None) -> Any:
    """``value``, which must be callable (a function, a module, a class)."""
    if not callable(value):
        _fail(
            TypeError, f"{name} must be callable, got {_describe(value)}", owner, hint
        )
    return value


def float_dtype(
    name: str, dtype: Any, *, owner: Say = None, hint: Say = None
) -> torch.dtype:
    """``dtype``, which must be a floating-point ``torch.dtype`` (``torch.float32``...)."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        _fail(
            TypeError,
            f"{name} must be a floating torch.dtype, got {dtype!r}",
            owner,
            hint,
        )
    return dtype


def string(
    name: str,
    value: Any,
    *,
    nonempty: bool = False,
    utf8: bool = False,
    owner: Say = None,
    hint: Say = None,
) -> str:
    """``value``, which must be a ``str`` (and not empty, with ``nonempty=True``).

    With ``utf8=True`` it must also be encodable as UTF-8: a Python str may hold a lone
    surrogate (``"\\udc80"``, from bytes decoded with ``errors="surrogateescape"``),
    which no encoder accepts.
    """
    if not isinstance(value, str):
        _fail(TypeError, f"{name} must be a str, got {_describe(value)}", owner, hint)
    if nonempty and not value:
        _fail(ValueError, f"{name} must be a non-empty str, got ''", owner, hint)
    try:
        if utf8:
            value.encode("utf-8")
    except UnicodeEncodeError as err:
        text = (
            f"{name} contains {value[err.start]!r} at position {err.start}, a lone "
            "surrogate that UTF-8 cannot encode; it usually comes from decoding "
            "bytes with errors='surrogateescape'"
        )
        _fail(ValueError, text, owner, hint)
    return value


def _not_one(name: str, values: Any, what: str, owner: Say, hint: Say) -> None:
    """A ``TypeError`` unless ``values`` is an iterable other than one str or bytes."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        _fail(
            TypeError,
            f"{name} must be {what}, got {type(values).__name__}",
            owner,
            hint,
        )


def strings(
    name: str,
    values: Any,
    *,
    nonempty: bool = False,
    distinct: bool = False,
    utf8: bool = False,
    owner: Say = None,
    hint: Say = None,
) -> list[str]:
    """``values`` (any iterable of str, not one str) as a list, each item checked as
    :func:`string` does (``name[i]``); ``distinct=True`` refuses a repeated item."""
    if isinstance(values, str):  # a common slip: one token where a list was meant
        hint = f"write [{values!r}] for a list of one" + (f"; {hint}" if hint else "")
    _not_one(name, values, "a list of str", owner, hint)
    items, say = (
        list(values),
        dict(nonempty=nonempty, utf8=utf8, owner=owner, hint=hint),
    )
    for i, item in enumerate(items):
        string(f"{name}[{i}]", item, **say)
    if distinct and len(set(items)) != len(items):
        _fail(ValueError, f"{name} must be distinct, got {items}", owner, hint)
    return items


def text_lines(
    name: str, lines: Any, *, owner: Say = None, hint: Say = None
) -> Iterator[str]:
    """``lines``, an iterable of str (an open text file, a list of lines), not one str.

    The iterable is checked now; each line is checked as it is read (``line n must be a
    str``), so that a file too large for memory is never read twice.
    """
    _not_one(
        name,
        lines,
        "an iterable of str (an open text file, a list of lines)",
        owner,
        hint,
    )
    mode = "open files in text mode"
    return (
        string(f"line {n}", line, owner=owner, hint=mode)
        for n, line in enumerate(lines)
    )


def token_ids(
    name: str,
    ids: Any,
    vocab_size: int | None = None,
    *,
    owner: Say = None,
    hint: Say = None,
) -> list[int]:
    """``ids`` (a list, tuple, NumPy array or 1-D tensor of ints) as a list of ints.

    Items are checked as :func:`integer` does (``name[i]``); with ``vocab_size``, each
    must lie in ``0..vocab_size - 1`` (the message gives the first one that does not
    and its position). A str is refused: it is text, not ids (encode it first).
    """
    if hasattr(ids, "tolist"):  # torch tensors and NumPy arrays
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        text = " (text is not a sequence of ids: encode it first)" * isinstance(
            ids, (str, bytes)
        )
        got = f"{_describe(ids)}{text}"
        _fail(
            TypeError,
            f"{name} must be a sequence of integer ids, got {got}",
            owner,
            hint,
        )
    ids, one_d = list(ids), hint or f"{name} must be ints in a 1-D sequence"
    for k, token_id in enumerate(ids):
        if type(token_id) is not int:  # NumPy ints are converted; bools, lists refused
            ids[k] = integer(f"{name}[{k}]", token_id, owner=owner, hint=one_d)
    for position, token_id in enumerate(ids if vocab_size is not None else ()):
        if not 0 <= token_id < vocab_size:  # the first id outside the vocabulary
            text = (
                f"id {token_id} at position {position} is out of range for a vocabulary "
                f"of {vocab_size} tokens (valid ids are 0..{vocab_size - 1})"
            )
            _fail(ValueError, text, owner, hint)
    return ids


def instance(
    name: str, value: Any, cls: type | tuple[type, ...], *, what: Say = None, **say: Say
) -> Any:
    """``value``, which must be an instance of ``cls`` (``TypeError`` naming ``what``)."""
    if not isinstance(value, cls):
        names = [c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,))]
        what = what or "a " + " or a ".join(names)
        _fail(TypeError, f"{name} must be {what}, got {_describe(value)}", **say)
    return value


def one_of(name: str, value: Any, choices: Iterable[Any], **say: Say) -> Any:
    """``value``, which must equal one of ``choices`` and have its type."""
    choices = list(choices)
    if any(type(value) is type(choice) and value == choice for choice in choices):
        return value
    listed = ", ".join(repr(choice) for choice in choices)
    _fail(ValueError, f"{name} must be one of {listed}, got {_describe(value)}", **say)


# -- tensors ------------------------------------------------------------------------------------
_PARSED_AXES: dict[str, tuple[bool, tuple[str, ...]]] = {}


def _parse_axes(axes: str) -> tuple[bool, tuple[str, ...]]:
    """``"... seq d_model"`` -> ``(True, ("seq", "d_model"))``, parsed once per pattern
    (decoding calls these checks for every token; ``torch.compile`` traces it once)."""
    if (parsed := _PARSED_AXES.get(axes)) is None:
        names = axes.split()
        parsed = (leading := names[:1] == ["..."]), tuple(names[leading:])
        if not torch.compiler.is_compiling():
            _PARSED_AXES[axes] = parsed
    return parsed


def tensor(
    name: str,
    x: Any,
    axes: str | None = None,
    *,
    floating: bool = False,
    integer: bool = False,
    boolean: bool = False,
    owner: Say = None,
    hint: Say = None,
    **sizes: int,
) -> torch.Tensor:
    """``x``, which must be a tensor with the named ``axes`` and a dtype of the kind asked for.

    ``axes`` names the axes as the docstrings do, such as ``"batch heads seq d_head"`` (exactly
    four axes) or ``"... seq d_model"`` (at least two; ``...`` stands for any leading axes).
    Keywords give the sizes some axes must have: ``d_model=512``. ``floating`` asks for a
    floating-point dtype, ``integer`` for an integer one (bools excluded), ``boolean`` for
    ``torch.bool`` (a mask).
    """
    if not isinstance(x, torch.Tensor):
        _fail(
            TypeError, f"{name} must be a torch.Tensor, got {_describe(x)}", owner, hint
        )
    if axes is None and sizes:
        raise TypeError(
            f"tensor(): the sizes {sorted(sizes)} need the axes they belong to"
        )
    leading, named = _parse_axes(axes) if axes is not None else (True, ())
    if "..." in named or not set(sizes) <= set(named):
        raise TypeError(f"tensor(): bad axes {axes!r} for the sizes {sorted(sizes)}")
    shape, offset = tuple(x.shape), x.dim() - len(named)
    fits = offset >= 0 if leading else offset == 0
    if not (
        fits
        and all(
            shape[offset + i] == sizes.get(a, shape[offset + i])
            for i, a in enumerate(named)
        )
    ):
        given = ", ".join(f"{axis}={size}" for axis, size in sizes.items())
        text = f"{name} must have shape ({axes}){' with ' * bool(given)}{given}, got shape {shape}"
        _fail(ValueError, text, owner, hint)
    kind = x.dtype == torch.bool or x.is_complex()
    if floating and not x.is_floating_point():
        ids = "" if kind else " (ids? embed them first)"
        _fail(
            TypeError,
            f"{name} must be a floating-point tensor, got dtype {x.dtype}{ids}",
            owner,
            hint,
        )
    if integer and (x.is_floating_point() or kind):
        _fail(
            TypeError,
            f"{name} must be an integer tensor, got dtype {x.dtype}",
            owner,
            hint,
        )
    if boolean and x.dtype != torch.bool:
        _fail(
            TypeError,
            f"{name} must be a boolean tensor, got dtype {x.dtype}",
            owner,
            hint,
        )
    return x


def broadcastable(
    name: str,
    x: Any,
    axes: str,
    *,
    floating: bool = False,
    boolean: bool = False,
    owner: Say = None,
    hint: Say = None,
    **sizes: int,
) -> torch.Tensor:
    """``x``, which must be a tensor that broadcasts to the shape of the named ``axes``
    (and has a floating-point or boolean dtype, when ``floating`` or ``boolean`` says so).

    Every axis gets its size by keyword: ``broadcastable("mask", mask, "batch heads q_pos k_pos",
    batch=2, heads=4, q_pos=5, k_pos=7)`` accepts ``(5, 7)``, ``(2, 1, 1, 7)`` and
    ``(2, 4, 5, 7)``: no more axes than named, each (counted from the right, as broadcasting
    aligns them) of the size asked for or 1. Only the shape is read.
    """
    names = axes.split()
    if "..." in names or len(set(names)) != len(names) or set(names) != set(sizes):
        raise TypeError(
            f"broadcastable(): every axis of {axes!r} needs a size, got {sorted(sizes)}"
        )
    tensor(name, x, floating=floating, boolean=boolean, owner=owner, hint=hint)
    target, shape = tuple(sizes[axis] for axis in names), tuple(x.shape)
    pairs = zip(reversed(shape), reversed(target))
    if len(shape) > len(target) or any(
        size not in (1, wanted) for size, wanted in pairs
    ):
        text = f"{name} must broadcast to ({axes}) = {target}, got shape {shape}"
        _fail(ValueError, text, owner, hint)
    return x


def same_device(
    *, owner: Say = None, hint: Say = None, **tensors: torch.Tensor
) -> None:
    """The named tensors (at least two) are on one device (``ValueError`` if not).

    A ``None`` is an optional tensor that was not given (``mask=None``): it is skipped.
    """
    if len(tensors) < 2:
        raise TypeError("same_device() compares at least two named tensors")
    tensors = {
        name: tensor(name, x, owner=owner)
        for name, x in tensors.items()
        if x is not None
    }
    if len({x.device for x in tensors.values()}) > 1:
        listed = ", ".join(f"{name} on {x.device}" for name, x in tensors.items())
        _fail(
            ValueError,
            f"{_names(tensors)} must be on one device, got {listed}",
            owner,
            hint,
        )


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type without autocast, such as "meta"
        return False


def same_dtype_and_device(
    *,
    autocast: bool = False,
    owner: Say = None,
    hint: Say = None,
    **tensors: torch.Tensor,
) -> None:
    """The named tensors (at least two) share one dtype and one device.

    A dtype mismatch is a ``TypeError``; a device mismatch a ``ValueError``. With
    ``autocast=True`` the dtypes may differ while autocast is on for the tensors'
    device, since autocast casts them itself (an fp32 weight meets bf16 activations).
    """
    if len(tensors) < 2:
        raise TypeError("same_dtype_and_device() compares at least two named tensors")
    same_device(owner=owner, hint=hint, **tensors)
    if autocast and _autocast_enabled(next(iter(tensors.values())).device.type):
        return
    if len({x.dtype for x in tensors.values()}) > 1:
        listed = ", ".join(f"{name} {x.dtype}" for name, x in tensors.items())
        _fail(
            TypeError,
            f"{_names(tensors)} must share a dtype, got {listed}",
            owner,
            hint,
        )


def layer_input(
    name: str,
    x: Any,
    axes: str,
    weight: torch.Tensor,
    *,
    owner: Say = None,
    hint: Say = None,
    **sizes: int,
) -> torch.Tensor:
    """``x``, the input of a layer whose parameter is ``weight``: a floating-point tensor
    with the named ``axes`` and ``sizes`` (as :func:`tensor`), on ``weight``'s device and of
    its dtype, unless autocast is on (as ``same_dtype_and_device(autocast=True)``)."""
    tensor(name, x, axes, floating=True, owner=owner, hint=hint, **sizes)
    same_dtype_and_device(autocast=True, owner=owner, **{name: x, "weight": weight})
    return x


def layer_forward(
    axes: str, weight: str, *, name: str = "x", casts: bool = False, rows: Say = None
) -> Callable[..., None]:
    """The front-door checker of a layer's ``forward(x)`` or ``forward(x, offset=0)``.

    ``x`` (the argument ``name``) must be a floating-point tensor with the named ``axes``,
    the last of them of the size the layer keeps under that name (``"... d_model"`` reads
    ``layer.d_model``), on the device of the layer's ``weight``, an attribute path such as
    ``"embedding.weight"`` (a layer without it, or with ``None`` there, is not compared),
    and of that weight's dtype too, as :func:`layer_input` says, unless the layer ``casts``
    the weight to ``x``'s dtype itself (a norm, a table of positions). ``offset`` must be
    an int ``>= 0``; with ``rows``, the name of the layer's attribute that says how many
    positions its table holds (``"max_len"``), ``offset`` plus the ``seq`` axis (the one
    before the last) must not pass it. Messages are owned by the layer's class name.
    """
    size, path = axes.split()[-1], weight.split(".")

    def checker(layer: Any, x: Any = None, offset: Any = 0, **named: Any) -> None:
        x, owner = named.get(name, x), type(layer).__name__
        held = functools.reduce(lambda obj, attr: getattr(obj, attr, None), path, layer)
        sizes = {size: getattr(layer, size)}
        if casts:
            tensor(name, x, axes, floating=True, owner=owner, **sizes)
            same_device(owner=owner, **{name: x, path[-1]: held})
        else:
            layer_input(name, x, axes, held, owner=owner, **sizes)
        int_at_least("offset", offset, 0, owner=owner)
        if rows is not None and offset + x.shape[-2] > (limit := getattr(layer, rows)):
            asked = (
                f"positions {offset}..{offset + x.shape[-2] - 1} go past {rows}={limit}"
            )
            _fail(ValueError, f"{asked}: the table ends at row {limit - 1}", owner)

    return checker


def attention_inputs(
    q: Any, k: Any, v: Any, *, owner: Say = None, hint: Say = None
) -> None:
    """Attention's inputs: ``q`` ``(batch heads q_pos d_head)``, ``k`` ``(batch kv_heads
    k_pos d_head)`` and ``v`` ``(batch kv_heads k_pos d_v)``, floating point, of one
    dtype on one device, with ``heads`` a multiple of ``kv_heads`` (grouped queries) and
    ``d_head >= 1`` (a score of zero dimensions means nothing, and ``1/sqrt(d_head)``
    divides by zero).

    Each message names the tensor at fault and the tensor whose sizes it must match.
    """
    same = dict(floating=True, owner=owner)
    tensor("q", q, "batch heads q_pos d_head", hint=hint, **same)
    (batch, heads, _, d_head), like_q = (
        q.shape,
        f"batch and d_head as in q {tuple(q.shape)}",
    )
    if d_head == 0:
        text = f"q {tuple(q.shape)} has d_head=0: a head needs at least one dimension"
        _fail(ValueError, f"{text} (is d_model < n_heads?)", owner, hint)
    k_axes = "batch kv_heads k_pos d_head"
    tensor("k", k, k_axes, batch=batch, d_head=d_head, hint=hint or like_q, **same)
    (_, kv_heads, k_len, _), like_k = (
        k.shape,
        f"batch, kv_heads and k_pos as in k {tuple(k.shape)}",
    )
    sizes = dict(batch=batch, kv_heads=kv_heads, k_pos=k_len)
    tensor("v", v, "batch kv_heads k_pos d_v", hint=hint or like_k, **sizes, **same)
    same_dtype_and_device(q=q, k=k, v=v, owner=owner, hint=hint)
    if kv_heads == 0 or heads % kv_heads:
        text = f"q has {heads} heads, not a multiple of the {kv_heads} key/value heads"
        _fail(
            ValueError, f"{text}: q {tuple(q.shape)}, k {tuple(k.shape)}", owner, hint
        )


def causal_fits(q_len: int, k_len: int, *, owner: Say = None, hint: Say = None) -> None:
    """A causal mask aligned bottom-right by default (the queries are the last ``q_len``
    of ``k_len`` positions, as with a key/value cache) needs ``q_len <= k_len``: with
    more queries, the first ones would sit before every key and see nothing. (The
    attention functions give such rows zeros, a defined result; a mask asked for
    without an offset is more likely a slip.)"""
    if q_len > k_len:
        text = (
            f"a causal mask with more queries than keys (q_pos={q_len} > "
            f"k_pos={k_len}): aligned to the last key, the first {q_len - k_len} "
            "queries would come before every key and see nothing"
        )
        _fail(ValueError, text, owner, hint)


def built_for(
    name: str, value: Any, *, owner: Say = None, hint: Say = None, **sizes: int
) -> Any:
    """``value``, a callable (a function, a module) which, where it carries an attribute
    named after one of the ``sizes`` (an int), was built for that size:
    ``built_for("rope", rope, d_head=8)`` refuses a ``RotaryEmbedding(16)``. A plain
    function has no such attribute, and only its being callable is checked."""
    function(name, value, owner=owner, hint=hint)
    for size, wanted in sizes.items():
        built = getattr(value, size, None)
        if isinstance(built, int) and not isinstance(built, bool) and built != wanted:
            text = f"{name} ({type(value).__name__}) was built for {size}={built}"
            text += f", but is used with {size}={wanted}"
            _fail(ValueError, text, owner, hint)
    return value


def score_bias(
    name: str,
    bias: Any,
    scores: tuple[int, int, int, int],
    offset: int = 0,
    *,
    owner: Say = None,
    hint: Say = None,
) -> torch.Tensor | None:
    """An additive score bias: ``None``, a tensor (returned as it is: the caller checks
    that it broadcasts), or a callable ``bias(q_len, k_len, offset)`` such as ALiBi or
    T5's buckets, whose ``n_heads`` (where it has one) must be ``scores``' heads.

    A callable is **called** here, once, without gradients, with the lengths of
    ``scores`` ``(batch heads q_pos k_pos)``: its result must be a floating-point tensor
    that broadcasts to them, and it is returned, for the caller's other checks (its
    device). The layer then calls it again in its body: the price of checking a result
    before the arithmetic that would fail on it, paid at a front door only.
    """
    if bias is None or isinstance(bias, torch.Tensor):
        return bias
    if not callable(bias):
        kinds = f"a tensor or a module called as {name}(q_len, k_len, offset)"
        _fail(TypeError, f"{name} must be {kinds}, got {_describe(bias)}", owner, hint)
    batch, heads, q_len, k_len = scores
    built_for(name, bias, owner=owner, hint=hint, n_heads=heads)
    with torch.no_grad():
        result = bias(q_len, k_len, offset)
    call, axes = f"{name}({q_len}, {k_len}, {offset})", "batch heads q_pos k_pos"
    sizes = dict(batch=batch, heads=heads, q_pos=q_len, k_pos=k_len)
    return broadcastable(
        call, result, axes, floating=True, owner=owner, hint=hint, **sizes
    )


def ids_in_range(
    name: str,
    ids: torch.Tensor,
    size: int | None,
    *,
    owner: Say = None,
    hint: Say = None,
) -> torch.Tensor:
    """``ids``, an integer tensor whose values are all in ``0..size - 1`` (token ids,
    labels, rows; with ``size=None``, any id ``>= 0``): the one check of a range of ids.

    The one tensor check that reads values (a reduction, and a wait for the device on a
    GPU): call it at a front door, on CPU ids or once per call, never per decoded token.
    """
    low, high = map(int, torch.aminmax(ids)) if ids.numel() else (0, 0)
    if low < 0 or (size is not None and high >= size):
        valid = ">= 0" if size is None else f"in 0..{size - 1}"
        _fail(ValueError, f"{name} must be {valid}, got {low}..{high}", owner, hint)
    return ids
