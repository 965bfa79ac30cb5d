# This file is generated from chapters/07-families.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""The model families (chapter 7 of the course): BERT, GPT and T5 from one set of parts.

* :class:`TransformerConfig`: one configuration for every family (and ViT's encoder).
* :class:`Embeddings`, :class:`TransformerBlock`, :class:`Encoder`, :class:`Decoder`:
  the stack. Encoder and decoder take *embedded* input, so chapter 10's ViT reuses the
  encoder.
* :class:`BERT` (encoder + masked-LM head), :class:`GPT` (decoder + tied un-embedding,
  with a Llama-style option set) and :class:`T5` (encoder-decoder): each returns logits.
* :class:`ModelCache`: the key/value caches of a whole model, reorderable for beam
  search; ``GPT.step`` and ``T5.bind(...).step`` decode with it (see
  :mod:`lib.generation`).
* :func:`init_weights`, :func:`count_parameters`, :func:`parameter_breakdown`.

Axis names: ``batch``, ``seq`` (``src``/``tgt`` for T5), ``d_model``, ``vocab``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from einops import rearrange
from torch import nn

from lib import _checks as check
from lib.attention import (
    ATTENTION_BACKENDS,
    KVCache,
    MultiHeadAttention,
    kv_cache_bytes,
)
from lib.embeddings import TokenEmbedding, Unembedding
from lib.ffn import (
    FFN_ACTIVATIONS,
    GATED_FFN_ACTIVATIONS,
    FeedForward,
    GatedFeedForward,
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
    "T5",
    "init_weights",
    "count_parameters",
    "parameter_breakdown",
    "kv_cache_bytes_per_token",
]


POSITION_KINDS = ("learned", "sinusoidal", "rope", "alibi", "t5", "none")


@dataclass(frozen=True)
class TransformerConfig:
    """One configuration for BERT, GPT, T5 (and ViT's encoder).

    Sizes: ``vocab_size``, ``d_model``, ``n_heads``, ``n_layers`` (the encoder's, or the
    decoder's for GPT), ``n_decoder_layers`` (T5's decoder; 0 means ``n_layers``),
    ``n_kv_heads`` (GQA/MQA; None: ``n_heads``), ``d_head`` (None: ``d_model //
    n_heads``), ``d_ff`` (None: ``4·d_model``, or the 8/3 rule for a gated activation),
    ``max_len``.

    Choices: ``activation`` (relu, gelu, gelu_tanh; gated: glu, reglu, geglu, swiglu),
    ``norm`` (layernorm, rmsnorm) with ``norm_eps`` (None: the norm's default) at
    ``norm_position`` (pre, post), ``positions`` (learned, sinusoidal, rope, alibi, t5,
    none), ``rope_base``, ``t5_num_buckets``/``t5_max_distance``, ``n_token_types``
    (BERT's segment embeddings), ``embedding_norm`` (BERT), ``embedding_scale``
    (multiply embeddings by √d_model, as the original Transformer), ``bias`` (on every
    linear layer), ``attn_scale`` (None: 1/√d_head; T5: 1.0), ``dropout``,
    ``tie_embeddings``, ``attn_backend`` (a name in
    ``lib.attention.ATTENTION_BACKENDS``).
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

    def __post_init__(self) -> None:
        owner = "TransformerConfig"
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_len"):
            check.positive_int(name, getattr(self, name), owner=owner)
        for name in (
            "n_kv_heads",
            "d_head",
            "d_ff",
            "t5_num_buckets",
            "t5_max_distance",
        ):
            if getattr(self, name) is not None:
                check.positive_int(name, getattr(self, name), owner=owner)
        for name in ("n_decoder_layers", "n_token_types"):
            check.int_at_least(name, getattr(self, name), 0, owner=owner)
        for name in ("embedding_norm", "embedding_scale", "bias", "tie_embeddings"):
            check.boolean(name, getattr(self, name), owner=owner)
        check.one_of("positions", self.positions, POSITION_KINDS, owner=owner)
        check.one_of("norm", self.norm, NORM_KINDS, owner=owner)
        check.one_of("norm_position", self.norm_position, NORM_POSITIONS, owner=owner)
        activations = (*FFN_ACTIVATIONS, *GATED_FFN_ACTIVATIONS)
        check.one_of("activation", self.activation, activations, owner=owner)
        check.one_of(
            "attn_backend",
            self.attn_backend,
            tuple(ATTENTION_BACKENDS),
            owner=owner,
        )
        check.probability("dropout", self.dropout, owner=owner)
        check.finite_float(
            "rope_base", self.rope_base, low=0.0, low_open=True, owner=owner
        )
        if self.norm_eps is not None:
            check.finite_float(
                "norm_eps", self.norm_eps, low=0.0, low_open=True, owner=owner
            )
        if self.attn_scale is not None:
            check.finite_float("attn_scale", self.attn_scale, owner=owner)
        if self.d_head is None and self.d_model % self.n_heads:
            raise ValueError(
                f"{owner}: n_heads={self.n_heads} does not divide "
                f"d_model={self.d_model}; "
                "change one, or set d_head explicitly"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"{owner}: n_kv_heads={self.n_kv_heads} does not divide "
                f"n_heads={self.n_heads}; each key/value head serves a whole group"
            )
        if self.positions == "rope" and self.head_size % 2:
            raise ValueError(
                f"{owner}: RoPE needs an even d_head, got {self.head_size}",
            )

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


def _check_ids(ids: object, vocab_size: int, name: str = "ids") -> torch.Tensor:
    """Integer ids ``(batch seq)`` in ``0..vocab_size-1``, or a clear error."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(
            f"{name} must be a tensor of token ids, got {type(ids).__name__}",
        )
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be int64 or int32 token ids, got {ids.dtype}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must be (batch, seq), got shape {tuple(ids.shape)}")
    if not torch.compiler.is_compiling() and ids.numel():
        low, high = (int(v) for v in torch.aminmax(ids))
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} must be in 0..{vocab_size - 1}, got ids from {low} to {high}",
            )
    return ids


def _key_mask(mask: torch.Tensor | None, batch: int, k_len: int) -> torch.Tensor | None:
    """A ``(batch k_pos)`` boolean key mask (True = real token) as ``(batch 1 1
    k_pos)``."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a boolean tensor (True = real token), got {mask!r}",
        )
    if tuple(mask.shape) != (batch, k_len):
        raise ValueError(
            f"mask must be (batch, k_pos) = {(batch, k_len)}, got {tuple(mask.shape)}",
        )
    return rearrange(mask, "batch k_pos -> batch 1 1 k_pos")


class Embeddings(nn.Module):
    """Token embedding (+ positions added at the input, + segments, + norm), then
    dropout.

    ``forward(ids, token_types=None, offset=0)``: ``ids`` ``(batch seq)`` ->
    ``(batch seq d_model)``; ``offset`` is the absolute position of the first token.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokens = TokenEmbedding(
            cfg.vocab_size,
            cfg.d_model,
            scale=cfg.embedding_scale,
            init_std=0.02,
            check_ids=False,
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
        x = self.tokens(_check_ids(ids, self.cfg.vocab_size))
        if self.positions is not None:
            x = self.positions(x, offset=offset)
        if self.token_types is not None:
            if token_types is None:
                token_types = torch.zeros_like(ids)
            x = x + self.token_types(
                _check_ids(token_types, self.cfg.n_token_types, "token_types"),
            )
        elif token_types is not None:
            raise ValueError("token_types given, but the config has n_token_types=0")
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


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
    )


def _ffn(cfg: TransformerConfig) -> nn.Module:
    if cfg.gated:
        return GatedFeedForward(cfg.d_model, cfg.d_ff, cfg.activation, bias=cfg.bias)
    return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, bias=cfg.bias)


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention and an FFN, each in a residual sublayer.

    ``forward(x, *, mask, causal, position_bias, rope, context, context_mask, cache)``:
    ``x`` ``(batch seq d_model)``; ``mask``/``context_mask`` boolean, broadcasting to
    ``(batch heads q_pos k_pos)``; ``context`` ``(batch src d_model)`` for
    cross-attention; ``cache`` a pair ``(self KVCache or None, cross KVCache or None)``.
    Returns ``x``, or ``(x, (self_cache, cross_cache))`` when ``use_cache``.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        cross_attention: bool = False,
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
        if self.cross_attn is not None:
            if context is None:
                raise ValueError(
                    "this block has cross-attention: pass context (the encoder output)",
                )
            kwargs = dict(past=past_cross, use_cache=True) if use_cache else {}
            out = self.cross_attn(x, context, mask=context_mask, **kwargs)
            x, cross_cache = out if use_cache else (out, None)
        x = self.ffn(x)
        return (x, (self_cache, cross_cache)) if use_cache else x


@dataclass(frozen=True)
class ModelCache:
    """Key/value caches of every decoder layer (and the cross-attention inputs, for T5).

    ``self_attn[i]`` and ``cross_attn[i]`` are layer ``i``'s :class:`KVCache`;
    ``context`` ``(batch src d_model)`` and ``context_mask`` ``(batch src)`` are the
    encoder output and its padding mask (T5 only).
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
        """The cache with its batch rows gathered by ``indices`` ``(new_batch,)``
        (beams)."""
        indices = torch.as_tensor(indices, device=self.self_attn[0].keys.device)

        def rows(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, indices)

        return ModelCache(
            tuple(c.select(indices) for c in self.self_attn),
            tuple(None if c is None else c.select(indices) for c in self.cross_attn),
            rows(self.context),
            rows(self.context_mask),
        )

    def crop(self, length: int) -> ModelCache:
        """The cache of the first ``length`` decoded positions, cross-attention
        kept."""
        return replace(self, self_attn=tuple(c.crop(length) for c in self.self_attn))


class _Stack(nn.Module):
    """What encoder and decoder share: blocks, in-attention positions, the final
    norm."""

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
            cfg.norm_position,
            cfg.d_model,
            cfg.norm,
            cfg.norm_eps,
        )

    def _check_input(self, x: object) -> torch.Tensor:
        is_tensor = isinstance(x, torch.Tensor)
        if not is_tensor or x.dim() != 3 or x.shape[-1] != self.cfg.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"{type(self).__name__} takes embedded input (batch, seq, "
                f"d_model={self.cfg.d_model}), got {got}; embed token ids first"
            )
        return x

    def _bias(self, q_len: int, k_len: int, offset: int) -> torch.Tensor | None:
        if self.position_bias is None:
            return None
        return self.position_bias(q_len, k_len, offset)  # once for every block


class Encoder(_Stack):
    """``n_layers`` blocks with bidirectional self-attention.

    ``forward(x, mask=None)``: ``x`` ``(batch seq d_model)`` embedded input; ``mask``
    ``(batch seq)`` boolean, True for real tokens. Returns ``(batch seq d_model)``.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__(cfg, cfg.n_layers, causal=False, cross=False)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._check_input(x)
        key_mask = _key_mask(mask, x.shape[0], x.shape[1])
        bias = self._bias(x.shape[1], x.shape[1], 0)
        for block in self.blocks:
            x = block(x, mask=key_mask, position_bias=bias, rope=self.rope)
        return self.final_norm(x)


class Decoder(_Stack):
    """``n_layers`` blocks with causal self-attention (and cross-attention if asked).

    ``forward(x, *, mask=None, context=None, context_mask=None, cache=None,
    use_cache=False)``: ``x`` ``(batch new d_model)``, the embedded new tokens; ``mask``
    ``(batch k_pos)`` boolean over all positions (cached ones first), True for real
    tokens; ``context`` ``(batch src d_model)`` and ``context_mask`` ``(batch src)`` for
    cross-attention. Returns ``(batch new d_model)``, or ``(that, ModelCache)`` when
    ``use_cache``.
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        *,
        cross_attention: bool = False,
    ) -> None:
        n_layers = cfg.decoder_layers if cross_attention else cfg.n_layers
        super().__init__(cfg, n_layers, causal=True, cross=cross_attention)
        self.cross_attention = cross_attention

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
        self._check_input(x)
        if self.cross_attention and context is None:
            raise ValueError(
                "an encoder-decoder's decoder needs context (the encoder output)",
            )
        offset = 0 if cache is None else cache.seq_len
        q_len, k_len = x.shape[1], offset + x.shape[1]
        self_mask = _key_mask(mask, x.shape[0], k_len)
        cross_mask = None
        if context is not None:
            cross_mask = _key_mask(context_mask, *context.shape[:2])
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


class GPT(nn.Module):
    """Decoder-only language model: ``ids (batch seq) -> logits (batch seq vocab)``.

    ``forward(ids, mask=None)``: ``mask`` ``(batch seq)`` boolean, True for real tokens
    (right padding). ``step(ids, cache=None)`` runs only the new tokens ``(batch new)``
    against the cache and returns ``(logits (batch new vocab), cache)``.
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.decoder = Decoder(cfg)
        tie = self.embed.tokens if cfg.tie_embeddings else None
        self.head = Unembedding(cfg.d_model, cfg.vocab_size, tie_to=tie, init_std=0.02)
        init_weights(self)

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._check_length(ids, 0)
        return self.head(self.decoder(self.embed(ids), mask=mask))

    def step(
        self,
        ids: torch.Tensor,
        cache: ModelCache | None = None,
    ) -> tuple[torch.Tensor, ModelCache]:
        offset = 0 if cache is None else cache.seq_len
        self._check_length(ids, offset)
        x, cache = self.decoder(
            self.embed(ids, offset=offset),
            cache=cache,
            use_cache=True,
        )
        return self.head(x), cache

    def _check_length(self, ids: torch.Tensor, offset: int) -> None:
        end = offset + (ids.shape[-1] if isinstance(ids, torch.Tensor) else 0)
        if self.cfg.positions == "learned" and end > self.cfg.max_len:
            raise ValueError(
                f"GPT: positions up to {end - 1} exceed "
                f"max_len={self.cfg.max_len} of its "
                "learned position table; shorten the prompt or generate fewer tokens"
            )


class BERT(nn.Module):
    """Encoder-only masked language model: ``ids (batch seq) -> logits (batch seq
    vocab)``.

    ``forward(ids, mask=None, token_types=None)``: ``mask`` ``(batch seq)`` boolean,
    True for real tokens; ``token_types`` ``(batch seq)`` segment ids. ``encode``
    returns the encoder's ``(batch seq d_model)`` output (for classification heads,
    chapter 8).
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
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

    def encode(self, ids, mask=None, token_types=None) -> torch.Tensor:
        if self.cfg.positions == "learned" and ids.shape[-1] > self.cfg.max_len:
            raise ValueError(
                f"BERT: {ids.shape[-1]} tokens exceed max_len={self.cfg.max_len}",
            )
        return self.encoder(self.embed(ids, token_types), mask)

    def forward(self, ids, mask=None, token_types=None) -> torch.Tensor:
        h = self.encode(ids, mask, token_types)
        return self.head(self.mlm_norm(self.mlm_activation(self.mlm_dense(h))))


class T5(nn.Module):
    """Encoder-decoder: ``(src_ids (batch src), tgt_ids (batch tgt)) -> (batch tgt
    vocab)``.

    ``forward(src_ids, tgt_ids, src_mask=None, tgt_mask=None)``; the decoder input
    ``tgt_ids`` starts with ``start_id`` (T5: the pad id 0) and is the target shifted
    right. ``encode(src_ids, src_mask)`` gives ``(batch src d_model)``; ``bind(src_ids,
    src_mask)`` returns a stepper for :mod:`lib.generation`.
    """

    def __init__(self, cfg: TransformerConfig, *, start_id: int = 0) -> None:
        super().__init__()
        self.cfg, self.start_id = cfg, start_id
        self.embed = Embeddings(cfg)  # shared by both stacks
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg, cross_attention=True)
        tie = self.embed.tokens if cfg.tie_embeddings else None
        self.head = Unembedding(cfg.d_model, cfg.vocab_size, tie_to=tie, init_std=0.02)
        self.head_scale = cfg.d_model**-0.5 if cfg.tie_embeddings else 1.0
        init_weights(self)

    def encode(
        self,
        src_ids: torch.Tensor,
        src_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if src_ids is None:
            raise ValueError("T5 needs encoder input: pass src_ids (batch, src)")
        return self.encoder(self.embed(src_ids), src_mask)

    def decode(
        self,
        tgt_ids,
        context,
        context_mask=None,
        tgt_mask=None,
        cache=None,
        use_cache=False,
    ):
        offset = 0 if cache is None else cache.seq_len
        out = self.decoder(
            self.embed(tgt_ids, offset=offset),
            mask=tgt_mask,
            context=context,
            context_mask=context_mask,
            cache=cache,
            use_cache=use_cache,
        )
        x, cache = out if use_cache else (out, None)
        logits = self.head(x * self.head_scale)
        return (logits, cache) if use_cache else logits

    def forward(
        self, src_ids, tgt_ids=None, src_mask=None, tgt_mask=None
    ) -> torch.Tensor:
        if tgt_ids is None:
            raise ValueError(
                "T5.forward needs decoder input tgt_ids (batch, tgt) as well",
            )
        context = self.encode(src_ids, src_mask)
        return self.decode(tgt_ids, context, src_mask, tgt_mask)

    def bind(
        self,
        src_ids: torch.Tensor,
        src_mask: torch.Tensor | None = None,
    ) -> _BoundT5:
        """Encode ``src_ids`` once; the result decodes with ``step(ids, cache)``."""
        return _BoundT5(self, self.encode(src_ids, src_mask), src_mask)


class _BoundT5:
    """A T5 with its encoder output bound in: ``step(ids, cache) -> (logits, cache)``.

    The first step starts from the bound encoder output; later steps read it (and its
    mask) from the cache, so beam search may reorder and duplicate the cache's rows
    freely.
    """

    def __init__(
        self,
        model: T5,
        context: torch.Tensor,
        context_mask: torch.Tensor | None,
    ):
        self.model, self.context, self.context_mask = model, context, context_mask
        self.start_id = model.start_id
        self.cfg = model.cfg

    def step(self, ids: torch.Tensor, cache: ModelCache | None = None):
        if cache is None:
            context, context_mask = self.context, self.context_mask
        else:
            context, context_mask = cache.context, cache.context_mask
        return self.model.decode(
            ids, context, context_mask, cache=cache, use_cache=True
        )


def init_weights(model: nn.Module, std: float = 0.02) -> nn.Module:
    """GPT-2's initialisation, in place: N(0, std²) weights, zero biases, unit norms,
    and residual output projections scaled by ``1/sqrt(2·n_blocks)``. Returns
    ``model``."""
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
            inner = sublayer.sublayer  # MultiHeadAttention or a feed-forward network
            is_attention = isinstance(inner, MultiHeadAttention)
            out = inner.out_proj if is_attention else inner.w_out
            nn.init.normal_(out.weight, std=residual_std)
    return model


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters())


def parameter_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameters by where they live: embeddings, attention, ffn, norms, head
    (others)."""
    groups = {"embeddings": 0, "attention": 0, "ffn": 0, "norms": 0, "head": 0}
    for name, p in model.named_parameters():  # tied parameters are listed once
        if ".self_attn.sublayer." in name or ".cross_attn.sublayer." in name:
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


def kv_cache_bytes_per_token(cfg: TransformerConfig, bytes_per_value: int = 2) -> int:
    """Bytes the self-attention caches of a decoder add per generated token."""
    return kv_cache_bytes(
        cfg.decoder_layers, cfg.kv_heads, cfg.head_size, 1, 1, bytes_per_value
    )
