# This file is generated from chapters/04-attention.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/04-attention.md, section "Masks: who may look at whom".
"""Attention (chapter 4 of the course): masks, scaled dot-product attention,
multi-head attention.

Axis convention: ``q``, ``k``, ``v`` are ``(batch, heads, seq, d_head)``.
Masks are boolean and broadcast to ``(batch, heads, q_len, k_len)``;
``True`` means "may attend". Additive score biases (ALiBi, T5 buckets) are
float tensors that broadcast to the same shape.

Two backends share one interface: ``"math"``
(:func:`scaled_dot_product_attention`, written with einops on named axes,
able to return the attention weights) and ``"sdpa"``
(:func:`sdpa_attention`, PyTorch's fused kernel). Both return zeros for a
query whose keys are all masked.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from einops import einsum, rearrange, repeat
from torch import nn

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "padding_mask",
    "causal_mask",
    "combine_masks",
    "additive_mask",
    "repeat_kv_heads",
    "scaled_dot_product_attention",
    "sdpa_attention",
    "ATTENTION_BACKENDS",
    "register_attention_backend",
    "attention_backend_names",
    "set_attention_backend",
    "KVCache",
    "MultiHeadAttention",
    "kv_cache_bytes",
    "attention_layer_flops",
    "attention_crossover_length",
]


# From chapters/04-attention.md, section "Masks: who may look at whom".
# the course's convention, recalled in errors
_MASK_HINT = "True = may attend"


def _check_lengths(lengths, max_len) -> tuple[torch.Tensor, int]:
    """:func:`padding_mask`'s ``lengths`` as a tensor of ints ``>= 0``, and
    ``max_len`` (default: the largest length) an int none exceeds."""
    owner = "padding_mask()"
    if not isinstance(lengths, torch.Tensor):
        try:
            lengths = torch.as_tensor(lengths)
        except (TypeError, ValueError, RuntimeError):
            got = type(lengths).__name__
            what = "lengths must be a tensor or a list of ints"
            raise TypeError(f"{owner}: {what}, got {got}") from None
    check.tensor("lengths", lengths, "batch", integer=True, owner=owner)
    check.ids_in_range("lengths", lengths, None, owner=owner)  # >= 0
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    max_len = check.int_at_least("max_len", max_len, 0, owner=owner)
    hint = f"a length exceeds max_len={max_len}"
    check.ids_in_range("lengths", lengths, max_len + 1, owner=owner, hint=hint)
    return lengths, max_len


# From chapters/04-attention.md, section "Masks: who may look at whom".
def padding_mask(
    lengths: torch.Tensor | Sequence[int], max_len: int | None = None
) -> torch.Tensor:
    """Boolean key mask from sequence lengths: ``True`` where the key is a
    real token.

    Shapes: ``lengths`` is ``(batch,)`` (integers); the result is
    ``(batch 1 1 k_pos)`` with ``k_pos = max_len`` (default: the largest
    length), ready to broadcast over heads and queries.
    """
    lengths, max_len = _check_lengths(lengths, max_len)
    key_positions = torch.arange(max_len, device=lengths.device)
    mask = key_positions < rearrange(lengths, "batch -> batch 1")
    return rearrange(mask, "batch k_pos -> batch 1 1 k_pos")


# From chapters/04-attention.md, section "Masks: who may look at whom".
def _check_causal_mask(q_len, k_len=None, offset=None, *, device=None):
    """:func:`causal_mask`'s checks: sizes ``>= 1``, an int ``offset``;
    without one, no more queries than keys."""
    owner = "causal_mask()"
    q_len = check.positive_int("q_len", q_len, owner=owner)
    k_len = q_len if k_len is None else k_len
    k_len = check.positive_int("k_len", k_len, owner=owner)
    if offset is None:
        hint = "pass offset= to place the queries"
        check.causal_fits(q_len, k_len, owner=owner, hint=hint)
    else:
        check.integer("offset", offset, owner=owner)


# From chapters/04-attention.md, section "Masks: who may look at whom".
@check.front_door(_check_causal_mask)
def causal_mask(
    q_len: int,
    k_len: int | None = None,
    offset: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean causal mask ``(q_pos k_pos)``: query ``i`` may see key ``j``
    iff ``j <= offset + i``.

    The queries sit at absolute positions ``offset .. offset + q_len - 1``
    and the keys at ``0 .. k_len - 1``. Defaults: ``k_len = q_len`` and
    ``offset = k_len - q_len`` (the queries are the last ``q_len``
    positions, as when decoding with a key/value cache).
    """
    k_len = q_len if k_len is None else k_len
    offset = k_len - q_len if offset is None else offset
    query_positions = torch.arange(q_len, device=device) + offset
    key_positions = torch.arange(k_len, device=device)
    query_positions = rearrange(query_positions, "q_pos -> q_pos 1")
    return rearrange(key_positions, "k_pos -> 1 k_pos") <= query_positions


# From chapters/04-attention.md, section "Masks: who may look at whom".
def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical *and* of boolean masks (``None`` entries are skipped), with
    broadcasting.

    Returns ``None`` when every mask is ``None`` (nothing is masked).
    """
    owner, hint = "combine_masks()", _MASK_HINT
    combined = None
    for index, mask in enumerate(masks):
        if mask is None:
            continue
        name = f"masks[{index}]"
        check.tensor(name, mask, boolean=True, owner=owner, hint=hint)
        if combined is None:
            combined, first = mask, name
            continue
        check.same_device(owner=owner, **{first: combined, name: mask})
        try:
            combined = combined & mask
        except RuntimeError:
            # the devices agree: only the shapes can be at fault
            shapes = f"{tuple(combined.shape)} and {tuple(mask.shape)}"
            message = f"{owner}: masks of shapes {shapes} do not broadcast"
            raise ValueError(message) from None
    return combined


# From chapters/04-attention.md, section "Masks: who may look at whom".
def additive_mask(mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """The additive form of a boolean mask: ``0.0`` where ``True`` (may
    attend), ``-inf`` elsewhere.

    Shapes: the result has the shape of ``mask``.
    """
    owner = "additive_mask()"
    check.tensor("mask", mask, boolean=True, owner=owner, hint=_MASK_HINT)
    check.float_dtype("dtype", dtype, owner=owner)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


# From chapters/04-attention.md, section "The attention function".
# the axes a mask or a bias broadcasts to
_SCORES = "batch heads q_pos k_pos"
# a score scale: a finite number > 0
_POSITIVE = dict(low=0, low_open=True)


def _check_args(owner):
    """The checker of the backend ``owner``: its arguments, as the backends
    take them.

    Shapes: ``q`` ``(batch heads q_pos d_head)``, ``k``
    ``(batch kv_heads k_pos d_head)``, ``v`` ``(batch kv_heads k_pos d_v)``,
    in one floating dtype on one device; ``heads`` a multiple of
    ``kv_heads``; ``mask`` and ``bias`` as :func:`_check_mask_and_bias`
    says.
    """

    def checker(q, k, v, mask=None, bias=None, dropout_p=0.0, **options):
        check.attention_inputs(q, k, v, owner=owner)
        scores = (*q.shape[:3], k.shape[2])
        _check_mask_and_bias(owner, scores, q, mask, bias)
        check.probability("dropout_p", dropout_p, owner=owner)
        if options.get("scale") is not None:
            scale = options["scale"]
            check.finite_float("scale", scale, **_POSITIVE, owner=owner)
        flags = {n: options.get(n, False) for n in _FLAGS}
        check.booleans(**flags, owner=owner)

    return checker


_FLAGS = ("causal", "return_weights")


def _check_mask_and_bias(owner, scores, like, mask, bias) -> None:
    """``mask`` (bool, True = may attend) and ``bias`` (any float dtype: it
    is cast to the queries') broadcast to ``scores``, the sizes
    ``(batch heads q_pos k_pos)``, and sit on the device of ``like``.
    """
    scores = dict(zip(_SCORES.split(), scores, strict=True), owner=owner)
    if mask is not None:
        instead = "pass an additive float tensor as bias= instead"
        hint = f"{_MASK_HINT}; {instead}"
        check.broadcastable("mask", mask, _SCORES, boolean=True, hint=hint, **scores)
    if bias is not None:
        check.broadcastable("bias", bias, _SCORES, floating=True, **scores)
    check.same_device(q=like, mask=mask, bias=bias, owner=owner)


# From chapters/04-attention.md, section "The attention function".
def _prepare(q, k, v, mask, bias, causal):
    """Add the causal mask, cast the bias, repeat key/value heads (after the
    checks).

    The bias is cast to the queries' dtype: an fp32 ALiBi or T5 table then
    works with bf16 queries on every backend.
    """
    q_len, k_len = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = repeat_kv_heads(k, group), repeat_kv_heads(v, group)
    if mask is not None:
        # keys no query may see: zeros, so that they add 0, never NaN
        seen = mask.any(dim=-2) if mask.dim() > 1 else mask
        hidden = rearrange(~seen, "... k_pos -> ... k_pos 1")
        k, v = k.masked_fill(hidden, 0.0), v.masked_fill(hidden, 0.0)
    # one query, at the last position, sees every key: no mask needed
    if causal and q_len > 1:
        causal = causal_mask(q_len, k_len, device=q.device)
        mask = causal if mask is None else mask & causal
    if bias is not None:
        bias = bias.to(q.dtype)
    return k, v, mask, bias


# From chapters/04-attention.md, section "The attention function".
def _check_repeat_kv(x, n_rep) -> None:
    """:func:`repeat_kv_heads`'s checks (folded)."""
    owner = "repeat_kv_heads()"
    check.positive_int("n_rep", n_rep, owner=owner)
    check.tensor("x", x, "batch kv_heads seq d_head", owner=owner)


# From chapters/04-attention.md, section "The attention function".
@check.front_door(_check_repeat_kv)
def repeat_kv_heads(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat each key/value head ``n_rep`` times, so query head ``h`` meets
    kv head ``h // n_rep``.

    Shapes: ``x`` is ``(batch kv_heads seq d_head)``, the result
    ``(batch (kv_heads n_rep) seq d_head)``.
    """
    if n_rep == 1:
        return x
    each_n_rep_times = "batch kv_heads seq d_head -> batch (kv_heads group) seq d_head"
    return repeat(x, each_n_rep_times, group=n_rep)


# From chapters/04-attention.md, section "The attention function".
@check.front_door(_check_args("scaled_dot_product_attention()"))
def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    *,
    scale: float | None = None,
    causal: bool = False,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention written out on named axes:
    ``softmax(q kᵀ · scale + bias, masked) v``.

    Shapes: ``q`` is ``(batch heads q_pos d_head)``; ``k``
    ``(batch kv_heads k_pos d_head)`` and ``v``
    ``(batch kv_heads k_pos d_v)`` with ``heads`` a multiple of
    ``kv_heads``; ``mask`` (boolean, True = may attend) and ``bias``
    (additive, float) broadcast to ``(batch heads q_pos k_pos)``.
    ``causal=True`` adds :func:`causal_mask` (bottom-right aligned).
    ``scale`` defaults to ``1/sqrt(d_head)``; ``dropout_p`` drops weights
    (pass 0 in eval).

    Returns ``(batch heads q_pos d_v)``, and the weights
    ``(batch heads q_pos k_pos)`` too when ``return_weights``. A query whose
    keys are all masked gets zero weights and a zero output, and a key
    that ``mask`` alone hides from every query adds nothing, whatever it
    holds; a key hidden only by a ``-inf`` in ``bias`` must
    hold finite values.
    """
    k, v, mask, bias = _prepare(q, k, v, mask, bias, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = einsum(
        q,
        k,
        "batch heads q_pos d_head, batch heads k_pos d_head -> batch heads q_pos k_pos",
    )
    scores = scores * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if mask is not None or bias is not None:
        # rows with nothing to attend to: zero weights, not NaN
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
        weights = weights.masked_fill(dead, 0.0)
    else:
        weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = einsum(
        weights,
        v,
        "batch heads q_pos k_pos, batch heads k_pos d_v -> batch heads q_pos d_v",
    )
    return (out, weights) if return_weights else out


# From chapters/04-attention.md, section "A second backend: PyTorch's fused kernel".
@check.front_door(_check_args("sdpa_attention()"))
def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    *,
    scale: float | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """The same attention as :func:`scaled_dot_product_attention`, by
    PyTorch's fused kernel.

    Shapes and arguments as there (no weights are returned). Fully masked
    query rows give zeros, not NaN; ``causal`` is bottom-right aligned,
    unlike PyTorch's ``is_causal`` when ``q_len != k_len``.
    """
    no_mask = mask is None and bias is None
    square_causal = causal and no_mask and q.shape[2] == k.shape[2]
    masked_causal = causal and not square_causal
    k, v, mask, bias = _prepare(q, k, v, mask, bias, masked_causal)
    if mask is None and bias is None:
        # the fast path: no mask tensor at all
        options = dict(dropout_p=dropout_p, scale=scale)
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=square_causal, **options
        )
    if bias is None:
        dead = ~mask.any(dim=-1, keepdim=True)
        attn_mask = mask | dead
    else:
        attn_mask = bias
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
        dead = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)
        attn_mask = attn_mask.masked_fill(dead, 0.0)
    # PyTorch's kernel wants (q_pos k_pos) at least
    if attn_mask.dim() < 2:
        attn_mask = attn_mask.reshape(1, -1)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale
    )
    # no data-dependent branch: no device sync
    return out.masked_fill(dead, 0.0)


ATTENTION_BACKENDS: dict[str, Callable[..., torch.Tensor]] = {
    "math": scaled_dot_product_attention,
    "sdpa": sdpa_attention,
}


# From chapters/04-attention.md, section "A second backend: PyTorch's fused kernel".
def _check_register(name, fn, *, replace=False) -> None:
    """:func:`register_attention_backend`'s checks: a name, a function, and
    no other function under that name unless ``replace``."""
    owner = "register_attention_backend()"
    check.string("name", name, nonempty=True, owner=owner)
    check.boolean("replace", replace, owner=owner)
    check.function("fn", fn, owner=owner)
    existing = ATTENTION_BACKENDS.get(name)
    taken = existing is not None and existing is not fn
    if taken and not replace:
        exists = f"attention backend {name!r} exists"
        raise ValueError(f"{exists}; pass replace=True to replace it")


# From chapters/04-attention.md, section "A second backend: PyTorch's fused kernel".
@check.front_door(_check_register)
def register_attention_backend(
    name: str, fn: Callable[..., torch.Tensor], *, replace: bool = False
) -> None:
    """Make ``fn`` available as the attention backend ``name``.

    ``fn(q, k, v, mask=None, bias=None, dropout_p=0.0, *, scale=None,
    causal=False)``
    receives ``q`` ``(batch heads q_pos d_head)``, ``k`` ``(batch kv_heads
    k_pos d_head)`` and ``v`` ``(batch kv_heads k_pos d_v)`` (``heads`` a
    multiple of ``kv_heads``), a boolean ``mask`` (True = may attend)
    and/or an additive float ``bias``, both broadcasting to ``(batch heads
    q_pos k_pos)``, the score ``scale`` (None: ``1/sqrt(d_head)``),
    ``causal`` (bottom-right aligned) and the dropout probability on the
    weights. It returns ``(batch heads q_pos d_v)``, with zeros for a query
    whose keys are all masked.
    """
    ATTENTION_BACKENDS[name] = fn


# Backends that a module registers when it is imported: name -> that module.
_LAZY_BACKENDS = {"flash_torch": "lib.flash", "flash_triton": "lib.flash_triton"}


def attention_backend_names() -> list[str]:
    """The names a backend may have: those registered, and those whose
    module registers them on first use (chapter 9's ``"flash_torch"`` and
    ``"flash_triton"``).
    """
    return sorted(set(ATTENTION_BACKENDS) | set(_LAZY_BACKENDS))


def _load_backend(name: object, owner: str) -> str:
    """``name``, which must name a backend (the message lists them),
    registered: a lazy backend's module is imported the first time, which
    registers it.
    """
    known = attention_backend_names()
    hint = "register_attention_backend(name, fn) adds one"
    name = check.one_of("backend", name, known, owner=owner, hint=hint)
    if name not in ATTENTION_BACKENDS:
        importlib.import_module(_LAZY_BACKENDS[name])
    return name


def set_attention_backend(model: nn.Module, name: str) -> nn.Module:
    """Switch every :class:`MultiHeadAttention` inside ``model`` to the
    backend ``name``.

    Returns ``model``. Raises ``ValueError`` listing the known names for an
    unknown one, and when ``model`` holds no attention module at all.
    """
    owner = "set_attention_backend()"
    what = "an nn.Module"
    check.instance("model", model, nn.Module, what=what, owner=owner)
    _load_backend(name, owner)
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not modules:
        kind = type(model).__name__
        raise ValueError(f"{kind} has no MultiHeadAttention to switch")
    for module in modules:
        module.backend = name
    return model


# From chapters/04-attention.md, section "The key/value cache".
def _check_cache(keys, values, owner, like=None, layer=None) -> None:
    """Keys ``(batch kv_heads seq d_head)`` and values ``(batch kv_heads
    seq d_v)`` of one floating dtype on one device. With ``like``, the
    cache they are appended to: its batch, heads, widths, dtype and device
    too (torch.cat would silently promote a bf16 cache to fp32). With
    ``layer``, an attention module and the batch it is called with: the
    cache ``past`` must fit that layer and its weight's device and dtype.
    """
    names, seq, fit, hint = ("keys", "values"), "seq", {}, None
    first, last, d_v = {}, {}, None  # tensors to compare, the values' width
    if like is not None:
        batch, kv_heads, _, d_head = like.keys.shape
        seq, first, d_v = "new", dict(cache=like.keys), like.values.shape[3]
        hint = f"cannot append to a cache of keys {tuple(like.keys.shape)}"
        fit = dict(batch=batch, kv_heads=kv_heads, d_head=d_head)
    if layer is not None:  # the layer projects values to d_head too
        (mha, batch), names = layer, ("past.keys", "past.values")
        last, hint = dict(weight=mha.qkv_proj.weight), "a cache fits only"
        hint, d_v = hint + " the layer that made it", mha.d_head
        fit = dict(batch=batch, kv_heads=mha.n_kv_heads, d_head=d_v)
    say = dict(floating=True, owner=owner, hint=hint)
    axes = f"batch kv_heads {seq} d_head"
    check.tensor(names[0], keys, axes, **fit, **say)
    batch, kv_heads, length, _ = keys.shape
    sizes = {"batch": batch, "kv_heads": kv_heads, seq: length}
    sizes |= {} if d_v is None else dict(d_v=d_v)
    like_keys = f"batch, kv_heads and seq as in keys {tuple(keys.shape)}"
    say["hint"] = hint or like_keys
    axes = f"batch kv_heads {seq} d_v"
    check.tensor(names[1], values, axes, **sizes, **say)
    tensors = dict(**first, **dict(zip(names, (keys, values))), **last)
    # autocast: a layer's fp32 weight may meet a bf16 cache under autocast
    autocast = layer is not None
    check.same_dtype_and_device(autocast=autocast, owner=owner, **tensors)


def _check_indices(indices, batch: int) -> torch.Tensor:
    """:meth:`KVCache.select`'s ``indices`` as a tensor of ints, and in
    ``0 .. batch - 1`` when on the CPU (unless trusted)."""
    owner = "KVCache.select()"
    if not isinstance(indices, torch.Tensor):
        try:
            indices = torch.as_tensor(indices)
        except (TypeError, ValueError, RuntimeError):
            what = "indices must be a tensor or a list of ints"
            got = type(indices).__name__
            raise TypeError(f"{owner}: {what}, got {got}") from None
    if check.trusted():  # a beam search's own indices are trusted
        return indices
    check.tensor("indices", indices, "new_batch", integer=True, owner=owner)
    # read only indices on the CPU: no device sync
    if indices.device.type == "cpu" and indices.numel():
        low, high = (int(i) for i in torch.aminmax(indices))
        if low < 0 or high >= batch:
            rows = f"a batch of {batch} (rows 0..{batch - 1})"
            got = f"indices {indices.tolist()}"
            raise IndexError(f"{owner}: {got} out of range for {rows}")
    return indices


# From chapters/04-attention.md, section "The key/value cache".
# the positions a cache's buffer grows by
_CACHE_BLOCK = 256


def _grown(cached: torch.Tensor, size: int) -> torch.Tensor:
    """A buffer of ``size`` positions whose first ones hold ``cached``."""
    batch, heads, n, width = cached.shape
    buffer = cached.new_empty(batch, heads, size, width)
    buffer.narrow(2, 0, n).copy_(cached)
    return buffer


@dataclass(frozen=True)
class KVCache:
    """The keys and values of the tokens seen so far, for one attention
    layer.

    Shapes: ``keys`` is ``(batch kv_heads seq d_head)``, ``values``
    ``(batch kv_heads seq d_v)``. For self-attention the keys are stored
    after any rotary embedding (at their absolute positions ``0 .. seq-1``);
    for cross-attention the cache holds the context's keys and values.
    """

    keys: torch.Tensor
    values: torch.Tensor
    # (key buffer, value buffer, [positions written]): shared by the caches
    # cut from one buffer; None for a cache made from tensors
    _room: tuple | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a cache the attention module makes from checked inputs is trusted
        if not check.trusted():
            _check_cache(self.keys, self.values, "KVCache")

    @property
    def seq_len(self) -> int:
        """How many positions the cache holds."""
        return self.keys.shape[2]

    def extend(self, keys: torch.Tensor, values: torch.Tensor) -> KVCache:
        """A new cache with ``keys`` and ``values``
        ``(batch kv_heads new d_head)`` appended, in place where it may be
        (see above), else into a new buffer (concatenated under autograd).
        """
        if not check.trusted():
            _check_cache(keys, values, "KVCache.extend()", like=self)
        n, new = self.seq_len, keys.shape[2]
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            return KVCache(
                torch.cat([self.keys, keys], dim=2),
                torch.cat([self.values, values], dim=2),
            )
        room = self._room
        if room is None or room[2][0] != n or n + new > room[0].shape[2]:
            # the first extension, an older cache of the buffer, or a full
            # one: a new buffer (a multiple of 256 positions) holding ours
            size = -(-(n + new) // _CACHE_BLOCK) * _CACHE_BLOCK
            buffers = [_grown(t, size) for t in (self.keys, self.values)]
            room = (*buffers, [n])
        key_buffer, value_buffer, filled = room
        # positions n .. n+new-1 of the seq axis (2), then the view 0 .. end
        key_buffer.narrow(2, n, new).copy_(keys)
        value_buffer.narrow(2, n, new).copy_(values)
        filled[0] = end = n + new  # older caches of it may not write now
        kept = (b.narrow(2, 0, end) for b in (key_buffer, value_buffer))
        return KVCache(*kept, room)

    def select(self, indices: torch.Tensor) -> KVCache:
        """The cache with its batch rows gathered by ``indices``
        ``(new_batch,)``.

        Beam search reorders (and duplicates) the rows this way when beams
        are re-ranked. Indices on the CPU are checked to be in range;
        indices on a GPU are not read (that would wait for the GPU at every
        decoding step).
        """
        indices = _check_indices(indices, self.keys.shape[0])
        indices = indices.to(self.keys.device)
        return KVCache(
            self.keys.index_select(0, indices), self.values.index_select(0, indices)
        )

    def crop(self, length: int) -> KVCache:
        """The cache of the first ``length`` positions (to roll back
        rejected draft tokens).
        """
        owner, seq_len = "KVCache.crop()", self.seq_len
        length = check.int_in_range("length", length, 0, seq_len, owner=owner)
        return KVCache(self.keys[:, :, :length], self.values[:, :, :length])


# From chapters/04-attention.md, section "The module".
_ROPE_NOT_CROSS = (
    "rope rotates positions of one sequence; it does not apply to cross-attention"
)
_CROSS_NEEDS_KV = (
    "cross_attention=True needs the encoder's keys and values: pass "
    "context (the encoder output) or past (a KVCache made from it)"
)
_MHA_FLAGS = ("use_cache", "causal", "need_weights", "cross_attention")


def _check_mha_sizes(d_model, n_heads, n_kv_heads, d_head) -> tuple:
    """:class:`MultiHeadAttention`'s sizes as ints (``n_kv_heads`` defaults
    to ``n_heads``): heads of ``d_head`` or ``d_model / n_heads``
    dimensions, each key/value head serving a whole group of query heads.
    """
    owner = "MultiHeadAttention"
    d_model = check.positive_int("d_model", d_model, owner=owner)
    n_heads = check.positive_int("n_heads", n_heads, owner=owner)
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    n_kv_heads = check.positive_int("n_kv_heads", n_kv_heads, owner=owner)
    if d_head is not None:
        d_head = check.positive_int("d_head", d_head, owner=owner)
    else:
        why = "each head needs d_model / n_heads dimensions"
        why += " (or pass d_head)"
        check.divisible(d_model=d_model, n_heads=n_heads, owner=owner, hint=why)
    why = "each key/value head must serve a whole group of query heads"
    check.divisible(n_heads=n_heads, n_kv_heads=n_kv_heads, owner=owner, hint=why)
    return d_model, n_heads, n_kv_heads, d_head


def _check_mha_options(bias, dropout, backend, scale, qk_norm) -> tuple:
    """:class:`MultiHeadAttention`'s flags, a known backend, and ``dropout``
    and ``scale`` (or None) as floats."""
    owner = "MultiHeadAttention"
    check.booleans(bias=bias, qk_norm=qk_norm, owner=owner)
    dropout = check.probability("dropout", dropout, owner=owner)
    _load_backend(backend, owner)
    if scale is not None:
        scale = check.finite_float("scale", scale, **_POSITIVE, owner=owner)
    return dropout, scale


def _check_mha_call(mha, x, context=None, **options) -> None:
    """The checks of :meth:`MultiHeadAttention.forward`'s arguments (never
    their data): its front door.
    """
    owner = "MultiHeadAttention"
    flags = {name: options.get(name, False) for name in _MHA_FLAGS}
    check.booleans(**flags, owner=owner)
    cross = flags["cross_attention"] or context is not None
    bias, rope = options.get("position_bias"), options.get("rope")
    past = options.get("past")
    weight, d_model = mha.qkv_proj.weight, mha.d_model
    axes = "batch q_pos d_model"
    check.layer_input("x", x, axes, weight, d_model=d_model, owner=owner)
    if cross and context is None and past is None:
        raise ValueError(f"{owner}: {_CROSS_NEEDS_KV}")
    if rope is not None and cross:
        raise ValueError(f"{owner}: {_ROPE_NOT_CROSS}")
    if context is not None:
        axes, hint = "batch k_pos d_model", f"x is {tuple(x.shape)}"
        sizes = dict(batch=x.shape[0], d_model=d_model, hint=hint)
        check.layer_input("context", context, axes, weight, owner=owner, **sizes)
    if rope is not None:
        check.built_for("rope", rope, d_head=mha.d_head, owner=owner)
    if past is not None:
        check.instance("past", past, KVCache, owner=owner)
        # the cache is extended with trust on: its fit is checked here
        _check_cache(past.keys, past.values, owner, layer=(mha, x.shape[0]))
    # the keys attended to: the cache's (cross), or the context's, or the
    # cache's and x's
    cached = 0 if past is None else past.seq_len
    k_len = cached + x.shape[1]
    if cross:
        k_len = context.shape[1] if past is None else cached
    scores = (x.shape[0], mha.n_heads, x.shape[1], k_len)
    # a module's bias is computed once more here, to check its shape
    at = 0 if cross or past is None else cached  # the queries' offset
    bias = check.score_bias("position_bias", bias, scores, at, owner=owner)
    _check_mask_and_bias(owner, scores, x, options.get("mask"), bias)


# From chapters/04-attention.md, section "The module".
_QK_NORM_EPS = 1e-6  # OLMo 2's and Gemma 3's


def _rms_norm_heads(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """QK-norm: each head's vectors ``(batch heads seq d_head)`` divided
    by their root mean square over ``d_head``, times ``gain``."""
    return F.rms_norm(x, gain.shape, gain.to(x.dtype), _QK_NORM_EPS)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with grouped key/value heads (MHA, GQA and MQA)
    and a KV cache.

    ``n_kv_heads`` (default ``n_heads``) must divide ``n_heads``:
    ``n_kv_heads == n_heads`` is multi-head attention, ``n_kv_heads == 1``
    multi-query attention. The options after the sizes are keyword-only:
    ``bias`` (projection biases), ``dropout`` (on the weights, in training),
    ``backend`` (a name in :data:`ATTENTION_BACKENDS`: ``"sdpa"``, PyTorch's
    fused kernel, or ``"math"``, the einops path), ``scale`` (the score
    scale; default ``1/sqrt(d_head)``; T5 uses 1.0) and ``d_head`` (default
    ``d_model // n_heads``; any value lets ``n_heads · d_head`` differ from
    ``d_model``, as T5 allows). ``qk_norm=True`` RMS-normalises each head's
    queries and keys over ``d_head`` (a learned gain per entry, initialised
    to 1) before RoPE and the dot product, which bounds every score.

    ``forward(x, context=None, *, mask=None, position_bias=None,
    causal=False, rope=None, past=None, use_cache=False, need_weights=False,
    cross_attention=False)``:

    * ``x`` ``(batch q_pos d_model)`` gives the queries, and the keys and
      values too unless ``context`` ``(batch k_pos d_model)`` is given
      (cross-attention).
    * ``mask`` (boolean, True = may attend) and ``position_bias`` (a float
      tensor, or a module called as ``position_bias(q_len, k_len, offset)``)
      broadcast to ``(batch heads q_pos k_pos)``, where ``k_pos`` counts the
      cached keys too. ``causal`` adds a bottom-right causal mask.
    * ``rope`` (e.g. ``lib.positions.RotaryEmbedding``) rotates queries and
      keys by their absolute positions; the queries start at
      ``offset = past.seq_len``.
    * ``past``: a :class:`KVCache`. Self-attention appends the new keys and
      values to it; cross-attention uses it *instead of* projecting
      ``context`` again.
    * ``cross_attention=True`` says the call is cross-attention even without
      ``context``: a decoder step then reads the encoder's keys and values
      from ``past`` alone. (Passing ``context`` implies cross-attention, so
      such a call need not say it.)

    Returns ``(batch q_pos d_model)``; with ``use_cache`` and/or
    ``need_weights``, a tuple ``(output, cache)``, ``(output, weights)`` or
    ``(output, cache, weights)``, the weights being
    ``(batch heads q_pos k_pos)``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        bias: bool = True,
        dropout: float = 0.0,
        backend: str = "sdpa",
        scale: float | None = None,
        d_head: int | None = None,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        # checked (folded above); n_kv_heads defaults to n_heads
        d_model, n_heads, n_kv_heads, d_head = _check_mha_sizes(
            d_model, n_heads, n_kv_heads, d_head
        )
        dropout, scale = _check_mha_options(bias, dropout, backend, scale, qk_norm)
        self.d_model = d_model
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_head = d_model // n_heads if d_head is None else d_head
        self.backend, self.dropout, self.scale = backend, dropout, scale
        self.q_dim = n_heads * self.d_head
        self.kv_dim = n_kv_heads * self.d_head
        qkv_dim = self.q_dim + 2 * self.kv_dim
        self.qkv_proj = nn.Linear(d_model, qkv_dim, bias=bias)
        self.out_proj = nn.Linear(self.q_dim, d_model, bias=bias)
        self.qk_norm = qk_norm
        self.q_norm_gain = self.k_norm_gain = None
        if qk_norm:  # a gain per d_head entry, shared by the heads
            self.q_norm_gain = nn.Parameter(torch.ones(self.d_head))
            self.k_norm_gain = nn.Parameter(torch.ones(self.d_head))

    def extra_repr(self) -> str:
        heads = f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}"
        return (
            f"d_model={self.d_model}, {heads}, d_head={self.d_head}, "
            f"scale={self.scale}, backend={self.backend!r}"
            + (", qk_norm=True" if self.qk_norm else "")
        )

    def _project_kv(self, source: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weight, bias = self.qkv_proj.weight, self.qkv_proj.bias
        weight = weight[self.q_dim :]
        bias = None if bias is None else bias[self.q_dim :]
        kv = F.linear(source, weight, bias)
        return kv.split([self.kv_dim, self.kv_dim], dim=-1)

    @check.front_door(_check_mha_call)
    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        position_bias: torch.Tensor | Callable[..., torch.Tensor] | None = None,
        causal: bool = False,
        rope: Callable[..., torch.Tensor] | None = None,
        past: KVCache | None = None,
        use_cache: bool = False,
        need_weights: bool = False,
        cross_attention: bool = False,
    ):
        """Attend from ``x`` to itself or to ``context`` (see the class
        docstring).

        Shapes: ``x`` is ``(batch q_pos d_model)``, ``context``
        ``(batch k_pos d_model)``, in the weights' dtype (any dtype under
        autocast); ``mask`` and ``position_bias`` broadcast to
        ``(batch heads q_pos k_pos)``. Returns ``(batch q_pos d_model)``, or
        a tuple with the :class:`KVCache` and/or the weights
        ``(batch heads q_pos k_pos)`` after it.
        """
        cross = cross_attention or context is not None
        split = "batch seq (heads d_head) -> batch heads seq d_head"
        if not cross and self.q_dim == self.kv_dim:
            # self-attention, a key/value head per query head: one fused
            # projection and one rearrange give q, k and v
            fused = "batch seq (three heads d_head) -> three batch heads seq d_head"
            qkv = rearrange(self.qkv_proj(x), fused, three=3, heads=self.n_heads)
            q, k, v = qkv.unbind(0)
        elif not cross:
            # grouped keys and values: q is wider than k and v
            widths = [self.q_dim, self.kv_dim, self.kv_dim]
            q, k, v = self.qkv_proj(x).split(widths, dim=-1)
            q = rearrange(q, split, heads=self.n_heads)
            k = rearrange(k, split, heads=self.n_kv_heads)
            v = rearrange(v, split, heads=self.n_kv_heads)
        else:
            # cross-attention: query rows on x, key/value rows on the
            # context
            weight = self.qkv_proj.weight[: self.q_dim]
            bias = self.qkv_proj.bias
            bias = None if bias is None else bias[: self.q_dim]
            q = rearrange(F.linear(x, weight, bias), split, heads=self.n_heads)
            k = v = None
            if past is None:
                k, v = self._project_kv(context)
                k = rearrange(k, split, heads=self.n_kv_heads)
                v = rearrange(v, split, heads=self.n_kv_heads)
        if self.qk_norm:  # before RoPE, which keeps lengths
            q = _rms_norm_heads(q, self.q_norm_gain)
            if k is not None:  # not when a cross cache holds them
                k = _rms_norm_heads(k, self.k_norm_gain)
        offset = past.seq_len if (past is not None and not cross) else 0
        if rope is not None:
            q, k = rope(q, offset=offset), rope(k, offset=offset)
        if past is None:
            cache = KVCache(k, v) if use_cache else None
        elif not cross:
            cache = past.extend(k, v)
            k, v = cache.keys, cache.values
        else:
            cache, k, v = past, past.keys, past.values

        q_len, k_len = q.shape[2], k.shape[2]
        bias = position_bias
        if bias is not None and not isinstance(bias, torch.Tensor):
            bias = bias(q_len, k_len, offset)
        dropout_p, weights = (self.dropout if self.training else 0.0), None
        options = dict(scale=self.scale, causal=causal)
        if need_weights:
            out, weights = scaled_dot_product_attention(
                q, k, v, mask, bias, dropout_p, return_weights=True, **options
            )
        else:
            attend = ATTENTION_BACKENDS[self.backend]
            out = attend(q, k, v, mask, bias, dropout_p, **options)
        merge = "batch heads seq d_head -> batch seq (heads d_head)"
        out = self.out_proj(rearrange(out, merge))
        if not use_cache and not need_weights:
            return out
        extras = [cache] if use_cache else []
        extras += [weights] if need_weights else []
        return (out, *extras)


# From chapters/04-attention.md, section "How big is the cache?".
def kv_cache_bytes(
    n_layers: int,
    n_kv_heads: int,
    d_head: int,
    seq_len: int,
    batch_size: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """Bytes of a full key/value cache: ``2 · n_layers · n_kv_heads · d_head
    · seq_len · batch_size · bytes_per_value`` (2: keys and values;
    ``bytes_per_value`` is 2 for fp16/bf16, 4 for fp32)."""
    named = dict(n_layers=n_layers, n_kv_heads=n_kv_heads, d_head=d_head)
    named |= dict(seq_len=seq_len, batch_size=batch_size)
    named["bytes_per_value"] = bytes_per_value
    sizes = check.positive_ints(owner="kv_cache_bytes()", **named)
    return 2 * math.prod(sizes)  # 2: keys and values


# From chapters/04-attention.md, section "What attention costs".
def attention_layer_flops(
    seq_len: int, d_model: int, d_ff: int | None = None
) -> dict[str, int]:
    """Forward FLOPs of one transformer layer on one sequence, split by
    where they go.

    ``"scores"``: q·kᵀ and the weighted sum, ``4 · n² · d``;
    ``"projections"``: q, k, v and output, ``8 · n · d²``; ``"ffn"``: two
    matrices, ``4 · n · d · d_ff`` (``16 · n · d²`` for the default
    ``d_ff = 4d``).
    """
    owner = "attention_layer_flops()"
    n, d = check.positive_ints(seq_len=seq_len, d_model=d_model, owner=owner)
    d_ff = 4 * d if d_ff is None else d_ff
    d_ff = check.positive_int("d_ff", d_ff, owner=owner)
    return {
        "scores": 4 * n * n * d,
        "projections": 8 * n * d * d,
        "ffn": 4 * n * d * d_ff,
    }


def attention_crossover_length(d_model: int, d_ff: int | None = None) -> int:
    """The sequence length where the ``n²`` attention FLOPs equal all the
    layer's linear FLOPs.

    ``4n²d = 8nd² + 4nd·d_ff`` gives ``n = 2·d_model + d_ff`` (``6·d_model``
    for ``d_ff = 4d``).
    """
    owner = "attention_crossover_length()"
    d_model = check.positive_int("d_model", d_model, owner=owner)
    d_ff = 4 * d_model if d_ff is None else d_ff
    d_ff = check.positive_int("d_ff", d_ff, owner=owner)
    return 2 * d_model + d_ff
