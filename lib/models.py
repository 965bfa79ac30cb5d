# This file is generated from chapters/07-1-families.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/07-1-families.md, section "One configuration".
"""The model families (chapter 7 of the course): BERT, GPT and T5 from one
set of parts.

* :class:`TransformerConfig`: one configuration for every family (and ViT's
  encoder).
* :class:`Embeddings`, :class:`TransformerBlock`, :class:`Encoder`,
  :class:`Decoder`: the stack. Encoder and decoder take *embedded* input, so
  chapter 10's ViT reuses the encoder.
* :class:`BERT` (encoder + masked-LM head), :class:`GPT` (decoder + tied
  un-embedding, with a Llama-style option set) and :class:`T5`
  (encoder-decoder): each returns logits, soft-capped if asked.
* :class:`ModelCache`: the key/value caches of a whole model, reorderable
  for beam search; ``GPT.step`` and ``T5.bind(...).step`` decode with it
  (see :mod:`lib.generation`).
* :func:`init_weights` (GPT-2's recipe), :func:`init_t5_weights` (T5's),
  :func:`count_parameters`, :func:`parameter_breakdown`.
* :class:`MultiHeadLatentAttention`, :class:`LatentCache`: DeepSeek-V2's
  latent key/value compression, with the absorbed decoding form.

Axis names: ``batch``, ``seq`` (``src``/``tgt`` for T5), ``d_model``,
``vocab``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from einops import einsum, rearrange, reduce
from torch import nn

from lib import _checks as check
from lib.attention import (
    KVCache,
    MultiHeadAttention,
    attention_backend_names,
    kv_cache_bytes,
    scaled_dot_product_attention,
)
from lib.embeddings import TokenEmbedding, Unembedding
from lib.ffn import (
    FFN_ACTIVATIONS,
    GATED_FFN_ACTIVATIONS,
    FeedForward,
    GatedFeedForward,
    MoEFeedForward,
)
from lib.norms import (
    NORM_KINDS,
    NORM_POSITIONS,
    ResidualSublayer,
    make_final_norm,
    make_norm,
)
from lib.positions import (
    ALiBi,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T5RelativePositionBias,
)

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "POSITION_KINDS",
    "TransformerConfig",
    "Embeddings",
    "TransformerBlock",
    "ModelCache",
    "Encoder",
    "Decoder",
    "GPT",
    "BERT",
    "SequenceClassifier",
    "T5",
    "init_weights",
    "count_parameters",
    "parameter_breakdown",
    "kv_cache_bytes_per_token",
    "init_t5_weights",
    "LatentCache",
    "MultiHeadLatentAttention",
]


# From chapters/07-1-families.md, section "One configuration".
def _check_transformer_config(cfg: TransformerConfig) -> None:
    """Every field of a configuration: its type, its range, its choices,
    and the ones that must agree."""
    owner = "TransformerConfig"
    optional = ("n_kv_heads", "d_head", "d_ff", "t5_num_buckets", "t5_max_distance")
    sizes = (
        "vocab_size",
        "d_model",
        "n_heads",
        "n_layers",
        "max_len",
        "experts_top_k",
        *optional,
    )
    for name in sizes:
        # an optional size may be None, which means its default
        if name not in optional or getattr(cfg, name) is not None:
            check.positive_int(name, getattr(cfg, name), owner=owner)
    for name in ("n_decoder_layers", "n_token_types", "n_experts"):
        check.int_at_least(name, getattr(cfg, name), 0, owner=owner)
    flags = ("embedding_norm", "embedding_scale", "bias", "tie_embeddings", "qk_norm")
    check.booleans(owner=owner, **{name: getattr(cfg, name) for name in flags})
    choices = {
        "positions": POSITION_KINDS,
        "norm": NORM_KINDS,
        "norm_position": NORM_POSITIONS,
        "activation": (*FFN_ACTIVATIONS, *GATED_FFN_ACTIVATIONS),
        # the names include flash_* before lib.flash is loaded
        "attn_backend": attention_backend_names(),
    }
    for name, allowed in choices.items():
        check.one_of(name, getattr(cfg, name), allowed, owner=owner)
    check.probability("dropout", cfg.dropout, owner=owner)
    positive = dict(low=0.0, low_open=True, owner=owner)
    # all but the first may be None too
    for name in ("rope_base", "norm_eps", "attn_scale", "logit_softcap"):
        if name == "rope_base" or getattr(cfg, name) is not None:
            check.finite_float(name, getattr(cfg, name), **positive)
    problem = None
    heads, width, kv = cfg.n_heads, cfg.d_model, cfg.n_kv_heads
    if cfg.d_head is None and width % heads:
        problem = f"n_heads={heads} does not divide d_model={width}; "
        problem += "change one, or set d_head explicitly"
    elif heads % cfg.kv_heads:
        problem = f"n_kv_heads={kv} does not divide n_heads={heads}; "
        problem += "each key/value head serves a whole group"
    elif cfg.positions == "rope" and cfg.head_size % 2:
        problem = f"RoPE needs an even d_head, got {cfg.head_size}"
    elif 0 < cfg.n_experts < cfg.experts_top_k:
        problem = f"experts_top_k={cfg.experts_top_k} exceeds "
        problem += f"n_experts={cfg.n_experts}: a token cannot use "
        problem += "more experts than there are"
    if problem:
        raise ValueError(f"{owner}: {problem}")


# From chapters/07-1-families.md, section "One configuration".
POSITION_KINDS = ("learned", "sinusoidal", "rope", "alibi", "t5", "none")


@dataclass(frozen=True)
class TransformerConfig:
    """One configuration for BERT, GPT, T5 (and ViT's encoder).

    Sizes: ``vocab_size``, ``d_model``, ``n_heads``, ``n_layers`` (the
    encoder's, or the decoder's for GPT), ``n_decoder_layers`` (T5's
    decoder; 0 means ``n_layers``), ``n_kv_heads`` (GQA/MQA; None:
    ``n_heads``), ``d_head`` (None: ``d_model // n_heads``), ``d_ff`` (None:
    ``4·d_model``, or the 8/3 rule for a gated activation), ``max_len``.

    Choices: ``activation`` (relu, gelu, gelu_tanh, relu2; gated: glu,
    reglu, geglu, swiglu), ``norm`` (layernorm, rmsnorm) with ``norm_eps``
    (None: the norm's default) at ``norm_position`` (pre, post),
    ``positions`` (learned, sinusoidal, rope, alibi, t5, none),
    ``rope_base``, ``t5_num_buckets``/``t5_max_distance``, ``n_token_types``
    (BERT's segment embeddings), ``embedding_norm`` (BERT),
    ``embedding_scale`` (multiply embeddings by √d_model, as the original
    Transformer), ``bias`` (on every linear layer), ``attn_scale`` (None:
    1/√d_head; T5: 1.0), ``dropout``, ``tie_embeddings`` (False: an output
    layer of its own), ``attn_backend`` (a name in
    ``lib.attention.attention_backend_names()``, lazily loaded backends
    included).

    Modern switches, all off by default: ``qk_norm`` (RMS-normalise each
    head's queries and keys, chapter 4), ``n_experts`` (0: a dense FFN;
    more: a mixture of that many experts of ``d_ff`` each, chapter 5) with
    ``experts_top_k`` (the experts each token uses), ``logit_softcap``
    (None, or ``c`` > 0: output logits ``c·tanh(logits/c)``, as Gemma 2).
    """

    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    n_decoder_layers: int = 0
    n_kv_heads: int | None = None
    d_head: int | None = None
    d_ff: int | None = None
    activation: str = "gelu"
    norm: str = "layernorm"
    norm_eps: float | None = None
    norm_position: str = "pre"
    positions: str = "learned"
    max_len: int = 1024
    rope_base: float = 10000.0
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    n_token_types: int = 0
    embedding_norm: bool = False
    embedding_scale: bool = False
    bias: bool = True
    attn_scale: float | None = None
    dropout: float = 0.0
    tie_embeddings: bool = True
    attn_backend: str = "sdpa"
    qk_norm: bool = False
    n_experts: int = 0
    experts_top_k: int = 2
    logit_softcap: float | None = None

    def __post_init__(self) -> None:
        _check_transformer_config(self)

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_size(self) -> int:
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

    @property
    def gated(self) -> bool:
        return self.activation in GATED_FFN_ACTIVATIONS

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers or self.n_layers

    @property
    def max_positions(self) -> int | None:
        """The positions a table holds (learned, sinusoidal, RoPE):
        ``max_len``; None for relative schemes (ALiBi, T5) and none."""
        bounded = self.positions in ("learned", "sinusoidal", "rope")
        return self.max_len if bounded else None


# From chapters/07-1-families.md, section "The parts".
def _check_ids(ids: object, vocab_size: int, name: str = "ids") -> torch.Tensor:
    """Integer ids ``(batch seq)``, not empty; on the CPU also in
    ``0..vocab_size-1``.

    (Reading a GPU tensor's values would make the device wait, once per
    training step; there an id out of range fails inside the embedding
    lookup instead.)
    """
    if not isinstance(ids, torch.Tensor):
        got = type(ids).__name__
        make = "torch.tensor(ids) makes one from a list"
        raise TypeError(f"{name} must be a tensor, got {got}: {make}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be int64 or int32 token ids, got {ids.dtype}")
    if ids.dim() != 2 or 0 in ids.shape:
        raise ValueError(f"{name} must be (batch, seq), got shape {tuple(ids.shape)}")
    if ids.device.type == "cpu" and not torch.compiler.is_compiling():
        check.ids_in_range(name, ids, vocab_size)
    return ids


_MASK = "a key mask must be (batch, k_pos), True = real token"
_STACK = "an Encoder or a Decoder takes embedded input (ids? embed them first)"


def _check_mask(mask: object, batch: int, k_len: int, name: str = "mask") -> None:
    """A boolean key mask ``(batch k_pos)``, True = real token."""
    sizes = dict(batch=batch, k_pos=k_len, hint=_MASK)
    check.tensor(name, mask, "batch k_pos", boolean=True, **sizes)


# From chapters/07-1-families.md, section "The parts".
def _key_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """A checked ``(batch k_pos)`` key mask as ``(batch 1 1 k_pos)``: it
    broadcasts over heads and queries."""
    return None if mask is None else rearrange(mask, "batch k_pos -> batch 1 1 k_pos")


class Embeddings(nn.Module):
    """Token embedding (+ positions added at the input, + segments, + norm),
    then dropout.

    ``forward(ids, token_types=None, offset=0)``: ``ids`` ``(batch seq)`` ->
    ``(batch seq d_model)``; ``offset`` is the absolute position of the
    first token. The models check ids and lengths before they call it.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokens = TokenEmbedding(
            cfg.vocab_size, cfg.d_model, scale=cfg.embedding_scale, init_std=0.02
        )
        if cfg.positions == "learned":
            self.positions = LearnedPositionalEmbedding(cfg.max_len, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.positions = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_len)
        else:
            self.positions = None
        self.token_types = (
            nn.Embedding(cfg.n_token_types, cfg.d_model) if cfg.n_token_types else None
        )
        self.norm = None
        if cfg.embedding_norm:
            self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(
        self,
        ids: torch.Tensor,
        token_types: torch.Tensor | None = None,
        offset: int = 0,
    ) -> torch.Tensor:
        # the models check ids, token types and lengths at their door and
        # call this with trust on: chapters 2 and 3's modules do not check
        # them again
        x = self.tokens(ids)
        if self.positions is not None:
            x = self.positions(x, offset=offset)
        if self.token_types is not None:
            if token_types is None:
                token_types = torch.zeros_like(ids)
            x = x + self.token_types(token_types)
        if self.norm is not None:
            x = self.norm(x)
        # (in eval, dropout is the identity: no call)
        return self.dropout(x) if self.training else x


# From chapters/07-1-families.md, section "The parts".
def _attention(cfg: TransformerConfig) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        bias=cfg.bias,
        dropout=cfg.dropout,
        backend=cfg.attn_backend,
        scale=cfg.attn_scale,
        d_head=cfg.d_head,
        qk_norm=cfg.qk_norm,
    )


def _ffn(cfg: TransformerConfig) -> nn.Module:
    if cfg.n_experts:
        return MoEFeedForward(
            cfg.d_model,
            cfg.d_ff,
            cfg.n_experts,
            cfg.experts_top_k,
            cfg.activation,
            bias=cfg.bias,
        )
    if cfg.gated:
        return GatedFeedForward(cfg.d_model, cfg.d_ff, cfg.activation, bias=cfg.bias)
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, bias=cfg.bias)


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and an FFN, each in a
    residual sublayer.

    ``forward(x, *, mask, causal, position_bias, rope, context,
    context_mask, cache)``: ``x`` ``(batch seq d_model)``;
    ``mask``/``context_mask`` boolean, broadcasting to ``(batch heads q_pos
    k_pos)``; ``context`` ``(batch src d_model)`` for cross-attention;
    ``cache`` a pair ``(self KVCache or None, cross KVCache or None)``.
    Returns ``x``, or ``(x, (self_cache, cross_cache))`` when ``use_cache``.
    """

    def __init__(
        self, cfg: TransformerConfig, *, cross_attention: bool = False
    ) -> None:
        super().__init__()

        def wrap(sublayer: nn.Module) -> ResidualSublayer:
            return ResidualSublayer(
                sublayer,
                cfg.d_model,
                cfg.norm_position,
                cfg.norm,
                cfg.dropout,
                cfg.norm_eps,
            )

        self.self_attn = wrap(_attention(cfg))
        self.cross_attn = wrap(_attention(cfg)) if cross_attention else None
        self.ffn = wrap(_ffn(cfg))

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        position_bias: torch.Tensor | None = None,
        rope: RotaryEmbedding | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        cache: tuple[KVCache | None, KVCache | None] | None = None,
        use_cache: bool = False,
    ):
        past_self, past_cross = cache if cache is not None else (None, None)
        kwargs = dict(past=past_self, use_cache=True) if use_cache else {}
        out = self.self_attn(
            x,
            mask=mask,
            causal=causal,
            position_bias=position_bias,
            rope=rope,
            **kwargs,
        )
        x, self_cache = out if use_cache else (out, None)
        cross_cache = None
        # the decoder checked that context is there
        if self.cross_attn is not None:
            kwargs = dict(past=past_cross, use_cache=True) if use_cache else {}
            out = self.cross_attn(x, context, mask=context_mask, **kwargs)
            x, cross_cache = out if use_cache else (out, None)
        x = self.ffn(x)
        return (x, (self_cache, cross_cache)) if use_cache else x


# From chapters/07-1-families.md, section "The parts".
@dataclass(frozen=True)
class ModelCache:
    """Key/value caches of every decoder layer (and the cross-attention
    inputs, for T5).

    ``self_attn[i]`` and ``cross_attn[i]`` are layer ``i``'s
    :class:`KVCache`; ``context`` ``(batch src d_model)`` and
    ``context_mask`` ``(batch src)`` are the encoder output and its padding
    mask (T5 only).
    """

    self_attn: tuple[KVCache, ...]
    cross_attn: tuple[KVCache | None, ...] = ()
    context: torch.Tensor | None = None
    context_mask: torch.Tensor | None = None

    @property
    def seq_len(self) -> int:
        """How many positions the self-attention caches hold."""
        return self.self_attn[0].seq_len

    @property
    def batch_size(self) -> int:
        return self.self_attn[0].keys.shape[0]

    def select(self, indices: torch.Tensor) -> ModelCache:
        """The cache with its batch rows gathered by ``indices``
        ``(new_batch,)`` (beams); on the CPU the indices are checked against
        the batch."""
        # the first layer's KVCache.select checks the indices (unless
        # trusted: beam search's own)
        first = self.self_attn[0].select(indices)
        indices = torch.as_tensor(indices, device=first.keys.device)

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, indices)

        def layer(c: KVCache | None) -> KVCache | None:
            return c if c is None else KVCache(rows(c.keys), rows(c.values))

        return ModelCache(
            (first, *(layer(c) for c in self.self_attn[1:])),
            tuple(layer(c) for c in self.cross_attn),
            rows(self.context),
            rows(self.context_mask),
        )

    def crop(self, length: int) -> ModelCache:
        """The cache of the first ``length`` decoded positions,
        cross-attention kept."""
        length = check.int_in_range("length", length, 0, self.seq_len)
        layers = self.self_attn
        kept = [(c.keys[..., :length, :], c.values[..., :length, :]) for c in layers]
        caches = tuple(KVCache(*pair) for pair in kept)
        return replace(self, self_attn=caches)


# From chapters/07-1-families.md, section "The parts".
def _check_stack_input(stack, x, mask=None, name: str = "mask") -> None:
    """Embedded input ``(batch seq d_model)`` and its key mask ``(batch
    seq)``: an encoder's front door."""
    sizes = dict(d_model=stack.cfg.d_model, hint=_STACK)
    check.tensor("x", x, "batch seq d_model", **sizes)
    if mask is not None:
        _check_mask(mask, x.shape[0], x.shape[1], name)


def _check_decoder_input(decoder, x, *, mask=None, context=None, **rest):
    """A decoder's front door: its input, the mask over cached and new
    positions, the context, the cache and ``use_cache``."""
    cache, use_cache = rest.get("cache"), rest.get("use_cache", False)
    check.boolean("use_cache", use_cache, owner="Decoder")
    if cache is not None and not use_cache:  # it would be ignored
        raise ValueError("Decoder: a cache needs use_cache=True to be read")
    _check_stack_input(decoder, x)
    layers = len(decoder.blocks)
    _check_cache(cache, x.shape[0], layers, "Decoder")
    if mask is not None:
        offset = 0 if cache is None else cache.seq_len
        _check_mask(mask, x.shape[0], offset + x.shape[1])
    if decoder.cross_attention and context is None:
        raise ValueError("the decoder needs context (the encoder output)")
    if context is not None:
        mask = rest.get("context_mask")
        _check_stack_input(decoder, context, mask, "context_mask")


# From chapters/07-1-families.md, section "The parts".
class _Stack(nn.Module):
    """What encoder and decoder share: blocks, in-attention positions, the
    final norm."""

    def __init__(
        self, cfg: TransformerConfig, n_layers: int, *, causal: bool, cross: bool
    ):
        super().__init__()
        self.cfg, self.causal = cfg, causal
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg, cross_attention=cross) for _ in range(n_layers)
        )
        self.rope = (
            RotaryEmbedding(cfg.head_size, cfg.max_len, cfg.rope_base)
            if cfg.positions == "rope"
            else None
        )
        if cfg.positions == "alibi":
            self.position_bias = ALiBi(cfg.n_heads, causal=causal)
        elif cfg.positions == "t5":
            self.position_bias = T5RelativePositionBias(
                cfg.n_heads,
                cfg.t5_num_buckets,
                cfg.t5_max_distance,
                bidirectional=not causal,
            )
        else:
            self.position_bias = None
        self.final_norm = make_final_norm(
            cfg.norm_position, cfg.d_model, cfg.norm, cfg.norm_eps
        )

    def _bias(self, q_len: int, k_len: int, offset: int) -> torch.Tensor | None:
        if self.position_bias is None:
            return None
        # once for every block
        return self.position_bias(q_len, k_len, offset)


class Encoder(_Stack):
    """``n_layers`` blocks with bidirectional self-attention.

    ``forward(x, mask=None)``: ``x`` ``(batch seq d_model)`` embedded input;
    ``mask`` ``(batch seq)`` boolean, True for real tokens. Returns ``(batch
    seq d_model)``.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__(cfg, cfg.n_layers, causal=False, cross=False)

    @check.front_door(_check_stack_input)
    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        key_mask = _key_mask(mask)
        bias = self._bias(x.shape[1], x.shape[1], 0)
        for block in self.blocks:
            x = block(x, mask=key_mask, position_bias=bias, rope=self.rope)
        return self.final_norm(x)


class Decoder(_Stack):
    """``n_layers`` blocks with causal self-attention (and cross-attention
    if asked).

    ``forward(x, *, mask=None, context=None, context_mask=None, cache=None,
    use_cache=False)``: ``x`` ``(batch new d_model)``, the embedded new
    tokens; ``mask`` ``(batch k_pos)`` boolean over all positions (cached
    ones first), True for real tokens; ``context`` ``(batch src d_model)``
    and ``context_mask`` ``(batch src)`` for cross-attention. Returns
    ``(batch new d_model)``, or ``(that, ModelCache)`` when ``use_cache``.
    """

    def __init__(
        self, cfg: TransformerConfig, *, cross_attention: bool = False
    ) -> None:
        n_layers = cfg.decoder_layers if cross_attention else cfg.n_layers
        super().__init__(cfg, n_layers, causal=True, cross=cross_attention)
        self.cross_attention = cross_attention

    @check.front_door(_check_decoder_input)
    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        cache: ModelCache | None = None,
        use_cache: bool = False,
    ):
        offset = 0 if cache is None else cache.seq_len
        q_len, k_len = x.shape[1], offset + x.shape[1]
        self_mask, cross_mask = _key_mask(mask), _key_mask(context_mask)
        bias = self._bias(q_len, k_len, offset)
        new_self, new_cross = [], []
        for i, block in enumerate(self.blocks):
            past = None
            if cache is not None:
                past = (cache.self_attn[i], _at(cache.cross_attn, i))
            out = block(
                x,
                mask=self_mask,
                causal=True,
                position_bias=bias,
                rope=self.rope,
                context=context,
                context_mask=cross_mask,
                cache=past,
                use_cache=use_cache,
            )
            if use_cache:
                x, (self_cache, cross_cache) = out
                new_self.append(self_cache)
                new_cross.append(cross_cache)
            else:
                x = out
        x = self.final_norm(x)
        if not use_cache:
            return x
        return x, ModelCache(tuple(new_self), tuple(new_cross), context, context_mask)


def _at(caches: tuple, i: int):
    return caches[i] if i < len(caches) else None


# From chapters/07-1-families.md, section "Three models".
def _check_positions(cfg: TransformerConfig, end: int, owner: str) -> None:
    """Positions ``0..end-1`` fit the position table (learned, sinusoidal,
    RoPE)."""
    if cfg.max_positions is not None and end > cfg.max_positions:
        table = f"max_len={cfg.max_len} of its {cfg.positions} position table"
        raise ValueError(f"{owner}: positions up to {end - 1} exceed {table}")


def _check_gpt_forward(gpt, ids, mask=None) -> None:
    _check_ids(ids, gpt.cfg.vocab_size)
    _check_positions(gpt.cfg, ids.shape[1], "GPT")
    if mask is not None:
        _check_mask(mask, *ids.shape)
        _check_right_padded(mask)


def _check_gpt_step(gpt, ids, cache=None) -> None:
    _check_ids(ids, gpt.cfg.vocab_size)
    layers = len(gpt.decoder.blocks)
    _check_cache(cache, ids.shape[0], layers, "GPT")
    offset = 0 if cache is None else cache.seq_len
    _check_positions(gpt.cfg, offset + ids.shape[1], "GPT")


def _check_bert_input(bert, ids, mask=None, token_types=None) -> None:
    """BERT's ids, mask and segment ids (``token_types``)."""
    cfg = bert.cfg
    batch, seq = _check_ids(ids, cfg.vocab_size).shape
    _check_positions(cfg, seq, "BERT")
    if mask is not None:
        _check_mask(mask, *ids.shape)
    if token_types is not None and not cfg.n_token_types:
        raise ValueError("token_types given, but the config has n_token_types=0")
    if token_types is not None:
        _check_ids(token_types, cfg.n_token_types, "token_types")
        sizes = dict(batch=batch, seq=seq)
        check.tensor("token_types", token_types, "batch seq", **sizes)


def _check_t5_encode(t5, src_ids, src_mask=None) -> None:
    if src_ids is None:
        raise ValueError("T5 needs encoder input: pass src_ids (batch, src)")
    _check_ids(src_ids, t5.cfg.vocab_size, "src_ids")
    if src_mask is not None:
        _check_mask(src_mask, *src_ids.shape, "src_mask")


def _check_t5_decode(t5, tgt_ids, context, context_mask=None, tgt_mask=None) -> None:
    """T5's decoder input, its mask, and the encoder output it reads."""
    cfg = t5.cfg
    _check_ids(tgt_ids, cfg.vocab_size, "tgt_ids")
    sizes = dict(batch=tgt_ids.shape[0], d_model=cfg.d_model)
    axes = "batch src d_model"
    check.tensor("context", context, axes, floating=True, **sizes)
    if context_mask is not None:
        _check_mask(context_mask, *context.shape[:2], "context_mask")
    if tgt_mask is not None:
        _check_mask(tgt_mask, *tgt_ids.shape, "tgt_mask")
        _check_right_padded(tgt_mask, "T5")


def _check_bound_step(bound, ids, cache=None) -> None:
    """A bound T5's step: ids of the source's batch, a cache that fits."""
    _check_ids(ids, bound.cfg.vocab_size)
    batch = bound.context.shape[0]
    batch = batch if cache is None else cache.batch_size
    layers = len(bound.model.decoder.blocks)
    _check_cache(cache, batch, layers, "T5")
    hint = "the source's batch"
    check.tensor("ids", ids, "batch new", batch=batch, hint=hint)


def _check_right_padded(mask: torch.Tensor, owner: str = "GPT") -> None:
    """On the CPU: no row of ``mask`` has padding before a real token."""
    # padding, then a real token
    left = (mask[:, 1:] & ~mask[:, :-1]).any(dim=1)
    if mask.device.type == "cpu" and bool(left.any()):
        why = "positions count from the first column: pad on the right"
        raise ValueError(f"{owner}: mask row {_first(left)} is left-padded; {why}")


def _check_cache(cache: object, batch: int, n_layers: int, owner: str) -> None:
    check.instance("cache", cache, (ModelCache, type(None)), owner=owner)
    got = None if cache is None else (cache.batch_size, len(cache.self_attn))
    if got not in (None, (batch, n_layers)):
        want = f"(batch, layers) = {(batch, n_layers)}, got {got}"
        raise ValueError(f"{owner}: cache must fit the ids and the model: {want}")


def _first(flags: torch.Tensor) -> int:
    return int(flags.nonzero()[0])


# From chapters/07-1-families.md, section "Three models".
class GPT(nn.Module):
    """Decoder-only language model: ``ids (batch seq) -> logits (batch seq
    vocab)``.

    ``forward(ids, mask=None)``: ``mask`` ``(batch seq)`` boolean, True for
    real tokens (right padding only: positions count from the first column,
    so a left-padded row is refused). ``step(ids, cache=None)`` runs only
    the new tokens ``(batch new)`` against the cache and returns ``(logits
    (batch new vocab), cache)``. Both check their arguments unless trust
    is on (a decoding loop feeding back its own tokens,
    :mod:`lib.generation`), then run the stack with trust on.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        check.instance("cfg", cfg, TransformerConfig, owner="GPT")
        if cfg.n_decoder_layers not in (0, cfg.n_layers):
            layers = f"n_layers={cfg.n_layers} blocks, not n_decoder_layers"
            raise ValueError(f"GPT builds {layers}={cfg.n_decoder_layers} (T5's)")
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.decoder = Decoder(cfg)
        tie = self.embed.tokens if cfg.tie_embeddings else None
        self.head = Unembedding(cfg.d_model, cfg.vocab_size, tie_to=tie, init_std=0.02)
        init_weights(self)

    @check.front_door(_check_gpt_forward)
    def forward(
        self, ids: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.decoder(self.embed(ids), mask=mask)
        return _soft_cap(self.head(x), self.cfg.logit_softcap)

    @check.front_door(_check_gpt_step)
    def step(
        self, ids: torch.Tensor, cache: ModelCache | None = None
    ) -> tuple[torch.Tensor, ModelCache]:
        offset = 0 if cache is None else cache.seq_len
        x = self.embed(ids, offset=offset)
        x, cache = self.decoder(x, cache=cache, use_cache=True)
        return _soft_cap(self.head(x), self.cfg.logit_softcap), cache


# From chapters/07-1-families.md, section "Three models".
def _soft_cap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap · tanh(logits / cap)``, Gemma 2's soft cap, bounded by
    ``±cap``; the logits unchanged when ``cap`` is None."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


# From chapters/07-1-families.md, section "Three models".
class BERT(nn.Module):
    """Encoder-only masked language model: ``ids (batch seq) -> logits
    (batch seq vocab)``.

    ``forward(ids, mask=None, token_types=None)``: ``mask`` ``(batch seq)``
    boolean, True for real tokens; ``token_types`` ``(batch seq)`` segment
    ids. ``encode`` returns the encoder's ``(batch seq d_model)`` output
    (for classification heads, chapter 8).
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        check.instance("cfg", cfg, TransformerConfig, owner="BERT")
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.mlm_dense = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.mlm_activation = (FFN_ACTIVATIONS | GATED_FFN_ACTIVATIONS)[cfg.activation]
        self.mlm_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        tie = self.embed.tokens if cfg.tie_embeddings else None
        self.head = Unembedding(
            cfg.d_model, cfg.vocab_size, tie_to=tie, bias=True, init_std=0.02
        )
        init_weights(self)

    @check.front_door(_check_bert_input)
    def encode(self, ids, mask=None, token_types=None) -> torch.Tensor:
        return self.encoder(self.embed(ids, token_types), mask)

    def forward(self, ids, mask=None, token_types=None) -> torch.Tensor:
        h = self.encode(ids, mask, token_types)
        h = self.mlm_norm(self.mlm_activation(self.mlm_dense(h)))
        return _soft_cap(self.head(h), self.cfg.logit_softcap)


# From chapters/07-1-families.md, section "Three models".
class SequenceClassifier(nn.Module):
    """BERT's embeddings and encoder with a linear head on the mean of the
    outputs.

    ``forward(ids, mask=None)``: ``ids`` ``(batch seq)``, ``mask`` ``(batch
    seq)`` True for real tokens -> logits ``(batch n_classes)``. The MLM
    head is not used.
    """

    def __init__(self, bert: BERT, n_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        if not isinstance(bert, BERT):
            raise TypeError(f"SequenceClassifier takes a BERT, got {bert!r:.60}")
        self.cfg = bert.cfg
        self.embed, self.encoder = bert.embed, bert.encoder
        self.dropout = nn.Dropout(check.probability("dropout", dropout))
        n_classes = check.positive_int("n_classes", n_classes)
        self.head = nn.Linear(bert.cfg.d_model, n_classes)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None):
        # BERT's front door: the same checks of ids and mask, on our embed
        # and encoder
        hidden = BERT.encode(self, ids, mask)  # (batch seq d_model)
        if mask is None:
            pooled = reduce(hidden, "batch seq d_model -> batch d_model", "mean")
        else:
            weights = rearrange(mask.to(hidden.dtype), "batch seq -> batch seq 1")
            n_real = weights.sum(1).clamp(min=1.0)  # (batch 1)
            pooled = (hidden * weights).sum(1) / n_real
        return self.head(self.dropout(pooled))


# From chapters/07-1-families.md, section "Three models".
class T5(nn.Module):
    """Encoder-decoder: ``(src_ids (batch src), tgt_ids (batch tgt)) ->
    (batch tgt vocab)``.

    ``forward(src_ids, tgt_ids, src_mask=None, tgt_mask=None)``; the decoder
    input ``tgt_ids`` starts with ``start_id`` (T5: the pad id 0) and is the
    target shifted right. ``encode(src_ids, src_mask)`` gives ``(batch src
    d_model)``; ``bind(src_ids, src_mask)`` returns a stepper for
    :mod:`lib.generation`.
    """

    def __init__(self, cfg: TransformerConfig, *, start_id: int = 0) -> None:
        super().__init__()
        check.instance("cfg", cfg, TransformerConfig, owner="T5")
        check.int_in_range("start_id", start_id, 0, cfg.vocab_size - 1, owner="T5")
        self.cfg, self.start_id = cfg, start_id
        self.embed = Embeddings(cfg)  # shared by both stacks
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg, cross_attention=True)
        tie = self.embed.tokens if cfg.tie_embeddings else None
        self.head = Unembedding(cfg.d_model, cfg.vocab_size, tie_to=tie, init_std=0.02)
        self.head_scale = cfg.d_model**-0.5 if cfg.tie_embeddings else 1.0
        init_t5_weights(self)

    @check.front_door(_check_t5_encode)
    def encode(
        self, src_ids: torch.Tensor, src_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        # a row with no real token is not refused (that would read the
        # mask): attention gives zeros there, on every device
        return self.encoder(self.embed(src_ids), src_mask)

    @check.front_door(_check_t5_decode)
    def decode(self, tgt_ids, context, context_mask=None, tgt_mask=None):
        """Logits ``(batch tgt vocab)`` of ``tgt_ids`` reading the encoder
        output ``context`` ``(batch src d_model)`` (and its mask ``(batch
        src)``)."""
        x = self.decoder(
            self.embed(tgt_ids),
            mask=tgt_mask,
            context=context,
            context_mask=context_mask,
        )
        logits = self.head(x * self.head_scale)
        return _soft_cap(logits, self.cfg.logit_softcap)

    def forward(
        self, src_ids, tgt_ids=None, src_mask=None, tgt_mask=None
    ) -> torch.Tensor:
        if tgt_ids is None:
            raise ValueError("T5.forward needs decoder input tgt_ids (batch, tgt)")
        return self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask, tgt_mask)

    def bind(
        self, src_ids: torch.Tensor, src_mask: torch.Tensor | None = None
    ) -> _BoundT5:
        """Encode ``src_ids`` once; the result decodes with ``step(ids,
        cache)``."""
        return _BoundT5(self, self.encode(src_ids, src_mask), src_mask)


class _BoundT5:
    """A T5 with its encoder output bound in: ``step(ids, cache) -> (logits,
    cache)``.

    The first step starts from the bound encoder output; later steps read it
    (and its mask) from the cache, so beam search may reorder and duplicate
    the cache's rows freely. Under trust (a decoding loop feeding back its
    own tokens), ``step`` skips the checks of the ids and the cache.
    """

    def __init__(
        self, model: T5, context: torch.Tensor, context_mask: torch.Tensor | None
    ):
        self.model, self.context, self.context_mask = (model, context, context_mask)
        self.start_id = model.start_id
        self.cfg = model.cfg

    @check.front_door(_check_bound_step)
    def step(self, ids: torch.Tensor, cache: ModelCache | None = None):
        if cache is None:
            context, context_mask = self.context, self.context_mask
        else:
            context, context_mask = cache.context, cache.context_mask
        model, offset = self.model, 0 if cache is None else cache.seq_len
        x = model.embed(ids, offset=offset)
        x, cache = model.decoder(
            x, context=context, context_mask=context_mask, cache=cache, use_cache=True
        )
        logits = model.head(x * model.head_scale)
        return _soft_cap(logits, self.cfg.logit_softcap), cache


# From chapters/07-1-families.md, section "Three models".
def init_weights(model: nn.Module, std: float = 0.02) -> nn.Module:
    """GPT-2's initialisation, in place: N(0, std²) weights, zero biases,
    unit norms, and residual output projections scaled by
    ``1/sqrt(2·n_blocks)``. Returns ``model``."""
    check.instance("model", model, nn.Module, owner="init_weights()")
    std = check.finite_float("std", std, low=0.0, low_open=True, owner="init_weights()")
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    residual_std = std / math.sqrt(2 * max(1, len(blocks)))
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding, TokenEmbedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, Unembedding) and not module.is_tied:
            nn.init.normal_(module.weight, std=std)
    for block in blocks:
        for sublayer in (block.self_attn, block.cross_attn, block.ffn):
            if sublayer is None:
                continue
            # attention's W_O, the FFN's W_out, or every expert's W_out
            for inner in sublayer.sublayer.modules():
                if isinstance(inner, MultiHeadAttention):
                    out = inner.out_proj
                elif isinstance(inner, (FeedForward, GatedFeedForward)):
                    out = inner.w_out
                else:
                    continue
                nn.init.normal_(out.weight, std=residual_std)
    return model


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once)."""
    check.instance("model", model, nn.Module, owner="count_parameters()")
    return sum(p.numel() for p in model.parameters())


def parameter_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameters by where they live: embeddings, attention, ffn, norms,
    head (others)."""
    check.instance("model", model, nn.Module, owner="parameter_breakdown()")
    groups = dict.fromkeys(("embeddings", "attention", "ffn", "norms"), 0)
    groups["head"] = 0  # everything else
    attention = (".self_attn.sublayer.", ".cross_attn.sublayer.")
    # tied parameters are listed once
    for name, p in model.named_parameters():
        if any(part in name for part in attention):
            groups["attention"] += p.numel()
        elif ".ffn.sublayer." in name:
            groups["ffn"] += p.numel()
        elif "norm" in name and "embed." not in name:
            groups["norms"] += p.numel()
        elif name.startswith("embed.") or "position_bias" in name:
            groups["embeddings"] += p.numel()
        else:
            groups["head"] += p.numel()
    return groups


def kv_cache_bytes_per_token(
    model_or_cfg: nn.Module | TransformerConfig, bytes_per_value: int = 2
) -> int:
    """Bytes the self-attention caches of a decoder add per generated token.

    Given a model (GPT or T5), its decoder's blocks are counted; given a
    configuration, ``cfg.decoder_layers`` (T5's decoder depth, or
    ``n_layers``: what a GPT builds, since a GPT refuses a different
    ``n_decoder_layers``).
    """
    decoder = getattr(model_or_cfg, "decoder", None)
    if isinstance(decoder, Decoder):
        cfg, n_layers = model_or_cfg.cfg, len(decoder.blocks)
    else:
        check.instance("model_or_cfg", model_or_cfg, (GPT, T5, TransformerConfig))
        cfg, n_layers = model_or_cfg, model_or_cfg.decoder_layers
    return kv_cache_bytes(n_layers, cfg.kv_heads, cfg.head_size, 1, 1, bytes_per_value)


# From chapters/07-1-families.md, section "Three models".
def init_t5_weights(model: T5) -> T5:
    """T5's initialisation, in place (Mesh TensorFlow's sizes, as in
    ``transformers``).

    With ``d`` = d_model and ``h`` heads of ``d_head``: token embedding (and
    an untied head) N(0, 1); queries N(0, 1/(d·d_head)), keys and values
    N(0, 1/d), attention output N(0, 1/(h·d_head)); FFN input N(0, 1/d),
    FFN output N(0, 1/d_ff); relative-position tables N(0, 1/d). Everything
    else (biases, norms, other tables) as :func:`init_weights` leaves it.
    Returns ``model``.
    """
    check.instance("model", model, T5, owner="init_t5_weights()")
    init_weights(model)  # zero biases; the matrices are all redrawn below
    d_model = model.cfg.d_model
    with torch.no_grad():
        model.embed.tokens.weight.normal_(std=1.0)
        if not model.head.is_tied:
            model.head.weight.normal_(std=1.0)
        for module in model.modules():
            if isinstance(module, MultiHeadAttention):
                parts = [module.q_dim, module.kv_dim, module.kv_dim]
                q, k, v = module.qkv_proj.weight.split(parts)
                q.normal_(std=(d_model * module.d_head) ** -0.5)
                k.normal_(std=d_model**-0.5)
                v.normal_(std=d_model**-0.5)
                module.out_proj.weight.normal_(std=module.q_dim**-0.5)
            elif isinstance(module, (FeedForward, GatedFeedForward)):
                module.w_in.weight.normal_(std=d_model**-0.5)
                module.w_out.weight.normal_(std=module.d_ff**-0.5)
            elif isinstance(module, T5RelativePositionBias):
                table = module.relative_attention_bias.weight
                table.normal_(std=d_model**-0.5)
    return model


# From chapters/07-1-families.md, section "What the cache costs, and how models shrink it".
@dataclass(frozen=True)
class LatentCache:
    """The cache of one :class:`MultiHeadLatentAttention` layer: the
    latents ``latent`` ``(batch seq d_latent)`` of the positions seen so
    far, and nothing else."""

    latent: torch.Tensor

    @property
    def seq_len(self) -> int:
        return self.latent.shape[1]

    def select(self, indices: torch.Tensor) -> LatentCache:
        """The cache with its batch rows gathered by ``indices``
        ``(new_batch,)`` (beam search)."""
        indices = torch.as_tensor(indices, device=self.latent.device)
        return LatentCache(self.latent.index_select(0, indices))

    def crop(self, length: int) -> LatentCache:
        """The cache of the first ``length`` positions."""
        length = check.int_in_range("length", length, 0, self.seq_len)
        return LatentCache(self.latent[:, :length])


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2), causal, without the
    decoupled RoPE key.

    Queries ``x W_Q`` per head; keys and values up-projected per head
    (``W_UK``, ``W_UV``) from one latent ``c = x W_DKV`` ``(batch seq
    d_latent)`` shared by all heads, which is all the cache keeps. No
    biases.

    ``forward(x, *, past=None, use_cache=False, absorbed=False)``: ``x``
    ``(batch new d_model)``, the new positions; ``past`` a
    :class:`LatentCache` of the earlier ones. ``absorbed=True`` computes the
    same function with ``W_UK`` folded into the queries and ``W_UV`` into
    the output projection: attention over the latents themselves. Returns
    ``(batch new d_model)``, and the extended cache too when ``use_cache``.
    """

    def __init__(
        self, d_model: int, n_heads: int, d_latent: int, *, d_head: int | None = None
    ) -> None:
        super().__init__()
        owner = "MultiHeadLatentAttention"
        sizes = dict(d_model=d_model, n_heads=n_heads, d_latent=d_latent)
        sizes = check.positive_ints(owner=owner, **sizes)
        self.d_model, self.n_heads, self.d_latent = sizes
        if d_head is None:
            check.divisible(d_model=d_model, n_heads=n_heads, owner=owner)
            d_head = d_model // n_heads
        self.d_head = check.positive_int("d_head", d_head, owner=owner)
        inner = n_heads * self.d_head
        self.q_proj = nn.Linear(d_model, inner, bias=False)  # W_Q
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)  # W_DKV
        self.k_up = nn.Linear(d_latent, inner, bias=False)  # W_UK
        self.v_up = nn.Linear(d_latent, inner, bias=False)  # W_UV
        self.out_proj = nn.Linear(inner, d_model, bias=False)  # W_O

    def forward(
        self,
        x: torch.Tensor,
        *,
        past: LatentCache | None = None,
        use_cache: bool = False,
        absorbed: bool = False,
    ):
        owner = "MultiHeadLatentAttention"
        check.tensor("x", x, "batch new d_model", d_model=self.d_model, owner=owner)
        check.booleans(owner=owner, use_cache=use_cache, absorbed=absorbed)
        latent = self.kv_down(x)  # (batch new d_latent)
        if past is not None:
            check.instance("past", past, LatentCache, owner=owner)
            sizes = dict(batch=x.shape[0], d_latent=self.d_latent)
            axes, cached = "batch seq d_latent", past.latent
            check.tensor("past.latent", cached, axes, **sizes, owner=owner)
            latent = torch.cat([past.latent, latent], dim=1)
        q = rearrange(
            self.q_proj(x),
            "batch q_pos (heads d_head) -> batch heads q_pos d_head",
            heads=self.n_heads,
        )
        attend = self._absorbed if absorbed else self._expanded
        out = attend(q, latent)
        return (out, LatentCache(latent)) if use_cache else out

    def _per_head(self, weight: torch.Tensor) -> torch.Tensor:
        """An up-projection's weight as ``(heads d_head d_latent)``."""
        axes = "(heads d_head) d_latent -> heads d_head d_latent"
        return rearrange(weight, axes, heads=self.n_heads)

    def _expanded(self, q: torch.Tensor, latent: torch.Tensor):
        """Every head's keys and values re-projected from the latents."""
        split = "batch k_pos (heads d_head) -> batch heads k_pos d_head"
        k = rearrange(self.k_up(latent), split, heads=self.n_heads)
        v = rearrange(self.v_up(latent), split, heads=self.n_heads)
        out = scaled_dot_product_attention(q, k, v, causal=True)
        merge = "batch heads q_pos d_head -> batch q_pos (heads d_head)"
        return self.out_proj(rearrange(out, merge))

    def _absorbed(self, q: torch.Tensor, latent: torch.Tensor):
        """The same attention read straight from the latents."""
        # q · (W_UK c) = (W_UKᵀ q) · c: each head's query, in latent space
        q_latent = einsum(
            q,
            self._per_head(self.k_up.weight),
            "batch heads q_pos d_head, heads d_head d_latent"
            " -> batch heads q_pos d_latent",
        )
        # one key/value head shared by all query heads (MQA): the latent
        one_head = "batch seq d_latent -> batch 1 seq d_latent"
        shared = rearrange(latent, one_head)
        # (batch heads q_pos d_latent): each head's weighted latents
        mixed = scaled_dot_product_attention(
            q_latent, shared, shared, causal=True, scale=self.d_head**-0.5
        )
        # W_O (W_UV c) = (W_O W_UV) c: W_UV folded into the output
        w_out = rearrange(
            self.out_proj.weight,
            "d_model (heads d_head) -> d_model heads d_head",
            heads=self.n_heads,
        )
        folded = einsum(
            w_out,
            self._per_head(self.v_up.weight),
            "d_model heads d_head, heads d_head d_latent -> d_model heads d_latent",
        )
        return einsum(
            mixed,
            folded,
            "batch heads q_pos d_latent, d_model heads d_latent -> batch q_pos d_model",
        )
