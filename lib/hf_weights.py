# This file is generated from chapters/07-2-reference.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/07-2-reference.md, section "A loader is a table".
"""Load Hugging Face reference weights into the course's models (chapter 7).

A loader is a table of rows ``(our key(s), their key(s), transform)``, with
``{i}`` (``{e}`` and ``{d}`` in T5's encoder and decoder) standing for a
block's index. :func:`convert_state_dict` applies a table and checks that
every key on both sides was used and every shape fits, or raises
:class:`StateDictMismatchError` (a ``ValueError``) listing the missing,
unexpected and mis-shaped keys.

* Transforms: :func:`same`, :func:`transpose` (GPT-2's Conv1D),
  :func:`concat` (fused q/k/v and gate/value projections), :func:`tied` (one
  tensor under several names).
* Per family: ``config_from_<family>(hf_config) -> TransformerConfig``
  (reads plain attributes; this module never imports ``transformers``),
  ``<family>_rows(cfg)`` (the table) and
  ``<family>_state_dict(their_state_dict, cfg)`` (our state dict), for GPT-2
  and Llama (:class:`~lib.models.GPT`), BERT (:class:`~lib.models.BERT`) and
  T5 (:class:`~lib.models.T5`).
* :func:`load_checked` loads a state dict strictly, checking that tied
  parameters agree; :func:`from_reference` turns a ``transformers`` model
  into ours in one call.
"""

from __future__ import annotations

import re
import string
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import product

import torch
from torch import nn

from lib import _checks as check
from lib.models import BERT, GPT, T5, TransformerConfig

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "same",
    "transpose",
    "concat",
    "tied",
    "Row",
    "expand_rows",
    "StateDictMismatchError",
    "convert_state_dict",
    "load_checked",
    "config_from_gpt2",
    "GPT2_SKIPPED",
    "gpt2_rows",
    "gpt2_state_dict",
    "config_from_bert",
    "BERT_SKIPPED",
    "bert_rows",
    "bert_state_dict",
    "config_from_t5",
    "t5_rows",
    "t5_state_dict",
    "config_from_llama",
    "LLAMA_SKIPPED",
    "llama_rows",
    "llama_state_dict",
    "REFERENCE_FAMILIES",
    "from_reference",
]


# From chapters/07-2-reference.md, section "A loader is a table".
def _check_matrix(weight: torch.Tensor) -> None:
    """``transpose``'s argument: a 2-D weight."""
    if weight.dim() != 2:
        raise ValueError(f"transpose expects a matrix, got shape {tuple(weight.shape)}")


# From chapters/07-2-reference.md, section "A loader is a table".
def same(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor unchanged."""
    return tensor


def transpose(weight: torch.Tensor) -> torch.Tensor:
    """GPT-2's Conv1D weight ``(d_in d_out)`` as a Linear weight ``(d_out
    d_in)``."""
    _check_matrix(weight)
    return weight.t()


def concat(*weights: torch.Tensor) -> torch.Tensor:
    """Separate projections as one fused projection, stacked along the
    output axis.

    ``(d_q d_in), (d_k d_in), (d_v d_in) -> (d_q+d_k+d_v d_in)`` (biases:
    1-D alike), in the order given, which must be the order the fused layer
    splits its output in.
    """
    return torch.cat(weights, dim=0)


def tied(*copies: torch.Tensor) -> torch.Tensor:
    """One tensor stored under several names: check the copies agree, return
    it."""
    first = copies[0]
    for other in copies[1:]:
        if other.shape != first.shape or not torch.equal(other, first):
            raise ValueError("the tied copies differ, so they are not one tensor")
    return first


# From chapters/07-2-reference.md, section "A loader is a table".
#: A row of a conversion table, ``(our key(s), their key(s), transform)``,
#: where each key(s) is one key pattern or a tuple of them.
Row = tuple[str | tuple[str, ...], str | tuple[str, ...], Callable[..., torch.Tensor]]


def _keys(keys: str | Sequence[str]) -> tuple[str, ...]:
    return (keys,) if isinstance(keys, str) else tuple(keys)


def _under(ours: str, theirs: str, rows: list[Row]) -> list[Row]:
    """The rows with the prefixes ``ours`` and ``theirs`` put before their
    keys."""
    return [
        (tuple(ours + k for k in _keys(o)), tuple(theirs + k for k in _keys(t)), f)
        for o, t, f in rows
    ]


def expand_rows(
    rows: Iterable[Row], ranges: Mapping[str, Iterable[int]]
) -> Iterator[tuple[tuple[str, ...], tuple[str, ...], Callable[..., torch.Tensor]]]:
    """Each row once per value of its placeholders; ``{i}`` takes
    ``ranges["i"]``."""
    parse = string.Formatter().parse
    for ours, theirs, transform in rows:
        ours, theirs = _keys(ours), _keys(theirs)
        fields = {field for key in (*ours, *theirs) for _, field, _, _ in parse(key)}
        fields = sorted(field for field in fields if field)
        unknown = [field for field in fields if field not in ranges]
        if unknown:
            raise ValueError(f"row {ours} has placeholders {unknown} with no range")
        for values in product(*(ranges[field] for field in fields)):
            index = dict(zip(fields, values))
            yield (
                tuple(key.format(**index) for key in ours),
                tuple(key.format(**index) for key in theirs),
                transform,
            )


class StateDictMismatchError(ValueError):
    """A state dict that does not fit; lists the missing, unexpected,
    misshaped keys."""

    def __init__(
        self, what: str, missing: list[str], unexpected: list[str], misshaped: list[str]
    ) -> None:
        self.missing, self.unexpected, self.misshaped = (missing, unexpected, misshaped)
        lines = [f"{what}: the state dict does not fit"]
        for label, items in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("mis-shaped", misshaped),
        ):
            if items:
                lines.append(f"  {label} ({len(items)}):")
                lines += [f"    {item}" for item in items[:20]]
                if len(items) > 20:
                    lines.append(f"    ... and {len(items) - 20} more")
        super().__init__("\n".join(lines))


def _shapes(keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> str:
    return ", ".join(f"{key} {tuple(t.shape)}" for key, t in zip(keys, tensors))


def convert_state_dict(
    their_state_dict: Mapping[str, torch.Tensor],
    rows: Iterable[Row],
    expected: Mapping[str, torch.Size],
    *,
    ranges: Mapping[str, Iterable[int]] | None = None,
    skip: Sequence[str] = (),
    what: str = "state dict",
) -> dict[str, torch.Tensor]:
    """Apply a table of rows to ``their_state_dict``; return our state dict.

    ``expected`` maps each of our keys to its shape
    (``model.state_dict()``'s). Every key of theirs must be used by a row or
    match one of the ``skip`` regular expressions (buffers that are not
    weights); every key of ours must be filled, with its shape. Otherwise
    raises :class:`StateDictMismatchError` listing every offender.
    """
    check.instance("their_state_dict", their_state_dict, Mapping, what="a state dict")
    ours: dict[str, torch.Tensor] = {}
    sources: dict[str, str] = {}
    attempted, used = set(), set()
    missing, unexpected, misshaped = [], [], []
    for our_keys, their_keys, transform in expand_rows(rows, ranges or {}):
        attempted.update(our_keys)
        present = [key for key in their_keys if key in their_state_dict]
        used.update(present)
        if transform is tied and present:
            # a tied tensor saved under only one of its names is complete
            absent = []
        else:
            absent = [key for key in their_keys if key not in their_state_dict]
        if absent:
            missing += absent
            continue
        tensors = [their_state_dict[key] for key in present]
        try:
            value = transform(*tensors)
        except (RuntimeError, ValueError) as error:
            source = _shapes(present, tensors)
            misshaped.append(f"{our_keys[0]}: cannot be made from {source} ({error})")
            continue
        for key in our_keys:
            ours[key], sources[key] = value, _shapes(present, tensors)
    unexpected += [
        key
        for key in their_state_dict
        if key not in used and not any(re.fullmatch(p, key) for p in skip)
    ]
    # Our side: a key that no row fills, or a row that fills a key our model
    # lacks, is a table that does not match the configuration.
    missing += [f"{k} (ours: no row fills it)" for k in expected if k not in attempted]
    unexpected += [f"{k} (ours: not in the model)" for k in ours if k not in expected]
    for key, value in ours.items():
        if key in expected and value.shape != expected[key]:
            misshaped.append(
                f"{key}: the model has {tuple(expected[key])}, the table "
                f"made {tuple(value.shape)} from {sources[key]}"
            )
    if missing or unexpected or misshaped:
        raise StateDictMismatchError(what, missing, unexpected, misshaped)
    return ours


def _shapes_of(model_class: type[nn.Module], cfg: TransformerConfig) -> dict:
    """Our model's state-dict shapes for ``cfg``, built on the meta device
    (no data)."""
    with torch.device("meta"):
        model = model_class(cfg)
    return {key: value.shape for key, value in model.state_dict().items()}


# From chapters/07-2-reference.md, section "A loader is a table".
def load_checked(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """Load ``state_dict`` into ``model`` strictly; returns ``model``.

    Raises :class:`StateDictMismatchError` for missing, unexpected or
    mis-shaped keys, and ``ValueError`` when the names of one tied parameter
    get different values.
    """
    check.instance("model", model, nn.Module, owner="load_checked()")
    check.instance("state_dict", state_dict, Mapping, what="a state dict (a mapping)")
    # tied names share one Parameter object
    own = model.state_dict(keep_vars=True)
    missing = [key for key in own if key not in state_dict]
    unexpected = [key for key in state_dict if key not in own]
    misshaped = [
        f"{key}: the model has {tuple(own[key].shape)}, got {tuple(given.shape)}"
        for key, given in state_dict.items()
        if key in own and given.shape != own[key].shape
    ]
    name = type(model).__name__
    if missing or unexpected or misshaped:
        raise StateDictMismatchError(name, missing, unexpected, misshaped)
    names_of: dict[int, list[str]] = {}
    for key, tensor in own.items():
        names_of.setdefault(id(tensor), []).append(key)
    for names in names_of.values():
        first = state_dict[names[0]]
        if any(not torch.equal(state_dict[other], first) for other in names[1:]):
            raise ValueError(
                f"{name}: {', '.join(names)} are one tied tensor, but the "
                "state dict gives them different values; build the model "
                "untied (tie_embeddings=False) or load equal values"
            )
    model.load_state_dict(state_dict, strict=True)
    return model


# From chapters/07-2-reference.md, section "A loader is a table".
#: transformers' activation names -> ours, for plain and for gated FFNs.
_PLAIN_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}
_GATED_ACTIVATIONS = {
    "relu": "reglu",
    "gelu": "geglu",
    "silu": "swiglu",
    "swish": "swiglu",
    "sigmoid": "glu",
}


def _activation(config: object, field: str, gated: bool = False) -> str:
    name = getattr(config, field)
    table = _GATED_ACTIVATIONS if gated else _PLAIN_ACTIVATIONS
    if name not in table:
        raise ValueError(
            f"{type(config).__name__}.{field}={name!r} has no counterpart "
            f"in a {'gated' if gated else 'plain'} FFN here; known: "
            f"{', '.join(map(repr, table))}"
        )
    return table[name]


def _require(config: object, field: str, supported: object, why: str) -> None:
    value = getattr(config, field, supported)
    if value != supported:
        raise ValueError(
            f"{type(config).__name__}.{field}={value!r} is not supported "
            f"({why}); only {supported!r} is"
        )


def _dropout(config: object, *fields: str, **fixed: float) -> float:
    """Our one dropout rate from the reference's rates ``fields`` (and
    ``fixed`` ones it does not configure): equal rates are carried;
    different ones are a warning that names them, and the first is used
    (dropout matters only in training)."""
    rates = {field: float(getattr(config, field, 0.0) or 0.0) for field in fields}
    rates |= fixed
    first = next(iter(rates.values()))
    if len(set(rates.values())) > 1:
        listed = ", ".join(f"{name}={rate}" for name, rate in rates.items())
        warnings.warn(
            f"{type(config).__name__} has {listed}, but TransformerConfig "
            "has one dropout for embeddings, attention weights and "
            f"residuals: using {first}",
            stacklevel=3,
        )
    return first


def _token_rows(cfg: TransformerConfig, embedding: str | tuple, head: str) -> list[Row]:
    """The token embedding and output head: one tied row, or two rows."""
    if cfg.tie_embeddings:
        ours = ("embed.tokens.weight", "head.weight")
        return [(ours, (*_keys(embedding), head), tied)]
    return [("embed.tokens.weight", embedding, tied), ("head.weight", head, same)]


# From chapters/07-2-reference.md, section "GPT-2".
def config_from_gpt2(config: object) -> TransformerConfig:
    """Our configuration of a ``transformers`` ``GPT2Config`` (read by
    attribute)."""
    _require(config, "scale_attn_by_inverse_layer_idx", False, "one scale for all")
    _require(config, "add_cross_attention", False, "GPT has no cross-attention")
    d_model = config.n_embd
    return TransformerConfig(
        vocab_size=config.vocab_size,
        d_model=d_model,
        n_heads=config.n_head,
        n_layers=config.n_layer,
        d_ff=config.n_inner or 4 * d_model,
        activation=_activation(config, "activation_function"),
        norm="layernorm",
        norm_eps=config.layer_norm_epsilon,
        norm_position="pre",
        positions="learned",
        max_len=config.n_positions,
        bias=True,
        attn_scale=None if getattr(config, "scale_attn_weights", True) else 1.0,
        dropout=_dropout(config, "resid_pdrop", "embd_pdrop", "attn_pdrop"),
        tie_embeddings=getattr(config, "tie_word_embeddings", True),
    )


#: Buffers of older GPT-2 checkpoints, which our model does without: the
#: causal mask and the masked-score constant.
GPT2_SKIPPED = (r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",)


def gpt2_rows(cfg: TransformerConfig) -> list[Row]:
    """GPT-2's table; ``{i}`` runs over the blocks."""
    # (ours under decoder.blocks.{i}., theirs under transformer.h.{i}.)
    block = [
        ("self_attn.norm.weight", "ln_1.weight", same),
        ("self_attn.norm.bias", "ln_1.bias", same),
        ("self_attn.sublayer.qkv_proj.weight", "attn.c_attn.weight", transpose),
        ("self_attn.sublayer.qkv_proj.bias", "attn.c_attn.bias", same),
        ("self_attn.sublayer.out_proj.weight", "attn.c_proj.weight", transpose),
        ("self_attn.sublayer.out_proj.bias", "attn.c_proj.bias", same),
        ("ffn.norm.weight", "ln_2.weight", same),
        ("ffn.norm.bias", "ln_2.bias", same),
        ("ffn.sublayer.w_in.weight", "mlp.c_fc.weight", transpose),
        ("ffn.sublayer.w_in.bias", "mlp.c_fc.bias", same),
        ("ffn.sublayer.w_out.weight", "mlp.c_proj.weight", transpose),
        ("ffn.sublayer.w_out.bias", "mlp.c_proj.bias", same),
    ]
    return [
        *_token_rows(cfg, "transformer.wte.weight", "lm_head.weight"),
        ("embed.positions.embedding.weight", "transformer.wpe.weight", same),
        *_under("decoder.blocks.{i}.", "transformer.h.{i}.", block),
        ("decoder.final_norm.weight", "transformer.ln_f.weight", same),
        ("decoder.final_norm.bias", "transformer.ln_f.bias", same),
    ]


def gpt2_state_dict(
    their_state_dict: Mapping[str, torch.Tensor], cfg: TransformerConfig
) -> dict[str, torch.Tensor]:
    """A ``GPT2LMHeadModel`` state dict as one of ``GPT(cfg)``."""
    return convert_state_dict(
        their_state_dict,
        gpt2_rows(cfg),
        _shapes_of(GPT, cfg),
        ranges={"i": range(cfg.n_layers)},
        skip=GPT2_SKIPPED,
        what="GPT-2 -> GPT",
    )


# From chapters/07-2-reference.md, section "BERT".
def config_from_bert(config: object) -> TransformerConfig:
    """Our configuration of a ``transformers`` ``BertConfig`` (read by
    attribute)."""
    _require(config, "position_embedding_type", "absolute", "learned positions")
    _require(config, "is_decoder", False, "BERT here is an encoder")
    return TransformerConfig(
        vocab_size=config.vocab_size,
        d_model=config.hidden_size,
        n_heads=config.num_attention_heads,
        n_layers=config.num_hidden_layers,
        d_ff=config.intermediate_size,
        activation=_activation(config, "hidden_act"),
        norm="layernorm",
        norm_eps=config.layer_norm_eps,
        norm_position="post",
        positions="learned",
        max_len=config.max_position_embeddings,
        n_token_types=config.type_vocab_size,
        embedding_norm=True,
        bias=True,
        dropout=_dropout(config, "hidden_dropout_prob", "attention_probs_dropout_prob"),
        tie_embeddings=getattr(config, "tie_word_embeddings", True),
    )


#: Buffers, not weights: default position ids and token type ids.
BERT_SKIPPED = (r"bert\.embeddings\.(position_ids|token_type_ids)",)


def bert_rows(cfg: TransformerConfig) -> list[Row]:
    """BERT's table (``BertForMaskedLM``); ``{i}`` runs over the blocks."""
    qkv = ("attention.self.query.", "attention.self.key.", "attention.self.value.")
    # (ours under encoder.blocks.{i}., theirs under bert.encoder.layer.{i}.)
    block = [
        ("self_attn.sublayer.qkv_proj.weight", [p + "weight" for p in qkv], concat),
        ("self_attn.sublayer.qkv_proj.bias", [p + "bias" for p in qkv], concat),
        ("self_attn.sublayer.out_proj.weight", "attention.output.dense.weight", same),
        ("self_attn.sublayer.out_proj.bias", "attention.output.dense.bias", same),
        ("self_attn.norm.weight", "attention.output.LayerNorm.weight", same),
        ("self_attn.norm.bias", "attention.output.LayerNorm.bias", same),
        ("ffn.sublayer.w_in.weight", "intermediate.dense.weight", same),
        ("ffn.sublayer.w_in.bias", "intermediate.dense.bias", same),
        ("ffn.sublayer.w_out.weight", "output.dense.weight", same),
        ("ffn.sublayer.w_out.bias", "output.dense.bias", same),
        ("ffn.norm.weight", "output.LayerNorm.weight", same),
        ("ffn.norm.bias", "output.LayerNorm.bias", same),
    ]
    embeddings = [  # (ours under embed., theirs under bert.embeddings.)
        ("positions.embedding.weight", "position_embeddings.weight", same),
        ("token_types.weight", "token_type_embeddings.weight", same),
        ("norm.weight", "LayerNorm.weight", same),
        ("norm.bias", "LayerNorm.bias", same),
    ]
    mlm_head = [  # (ours at the top level, theirs under cls.predictions.)
        ("head.bias", ("bias", "decoder.bias"), tied),
        ("mlm_dense.weight", "transform.dense.weight", same),
        ("mlm_dense.bias", "transform.dense.bias", same),
        ("mlm_norm.weight", "transform.LayerNorm.weight", same),
        ("mlm_norm.bias", "transform.LayerNorm.bias", same),
    ]
    decoder = "cls.predictions.decoder.weight"  # the tied output matrix
    return [
        *_token_rows(cfg, "bert.embeddings.word_embeddings.weight", decoder),
        *_under("embed.", "bert.embeddings.", embeddings),
        *_under("encoder.blocks.{i}.", "bert.encoder.layer.{i}.", block),
        *_under("", "cls.predictions.", mlm_head),
    ]


def bert_state_dict(
    their_state_dict: Mapping[str, torch.Tensor], cfg: TransformerConfig
) -> dict[str, torch.Tensor]:
    """A ``BertForMaskedLM`` state dict as one of ``BERT(cfg)``."""
    return convert_state_dict(
        their_state_dict,
        bert_rows(cfg),
        _shapes_of(BERT, cfg),
        ranges={"i": range(cfg.n_layers)},
        skip=BERT_SKIPPED,
        what="BERT -> BERT",
    )


# From chapters/07-2-reference.md, section "T5".
def config_from_t5(config: object) -> TransformerConfig:
    """Our configuration of a ``transformers`` ``T5Config`` (read by
    attribute)."""
    gated = bool(getattr(config, "is_gated_act", False))
    if gated and config.dense_act_fn == "gelu_new":
        raise ValueError(
            "T5Config.dense_act_fn='gelu_new' in a gated FFN (T5 v1.1's "
            "'gated-gelu') is not supported: our geglu gates with the "
            "exact GELU, T5 v1.1 with its tanh approximation"
        )
    return TransformerConfig(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        n_heads=config.num_heads,
        n_layers=config.num_layers,
        n_decoder_layers=config.num_decoder_layers or config.num_layers,
        d_head=config.d_kv,
        d_ff=config.d_ff,
        activation=_activation(config, "dense_act_fn", gated),
        norm="rmsnorm",
        norm_eps=config.layer_norm_epsilon,
        norm_position="pre",
        positions="t5",
        t5_num_buckets=config.relative_attention_num_buckets,
        t5_max_distance=config.relative_attention_max_distance,
        bias=False,
        attn_scale=1.0,
        dropout=config.dropout_rate,
        # the d_model^-0.5 rescaling of the head goes with a tied head in
        # 4.x; 5.x always ties the weights and keeps the rescaling flag
        # apart (scale_decoder_outputs): an untied copy of a tied matrix
        # gives the same logits
        tie_embeddings=getattr(
            config,
            "scale_decoder_outputs",
            getattr(config, "tie_word_embeddings", True),
        ),
    )


def _t5_block(cfg: TransformerConfig, cross: bool) -> list[Row]:
    """One block's rows: ``layer.0`` self-attention, ``layer.1``
    cross-attention (in the decoder), then the FFN; ours relative to the
    block, theirs to ``block.{n}.``."""
    attentions = [("self_attn.", "SelfAttention.")]
    if cross:
        attentions.append(("cross_attn.", "EncDecAttention."))
    rows = []
    for index, (ours, theirs) in enumerate(attentions):
        theirs = f"layer.{index}.{theirs}"
        rows += [
            (ours + "norm.weight", f"layer.{index}.layer_norm.weight", same),
            (
                ours + "sublayer.qkv_proj.weight",
                [f"{theirs}{p}.weight" for p in "qkv"],
                concat,
            ),
            (ours + "sublayer.out_proj.weight", theirs + "o.weight", same),
        ]
    ffn = f"layer.{len(attentions)}."
    if cfg.gated:  # T5 v1.1 and later: wi_0 is the gate, wi_1 the value
        w_in = (ffn + "DenseReluDense.wi_0.weight", ffn + "DenseReluDense.wi_1.weight")
        rows.append(("ffn.sublayer.w_in.weight", w_in, concat))
    else:
        w_in = ffn + "DenseReluDense.wi.weight"
        rows.append(("ffn.sublayer.w_in.weight", w_in, same))
    rows += [
        ("ffn.sublayer.w_out.weight", ffn + "DenseReluDense.wo.weight", same),
        ("ffn.norm.weight", ffn + "layer_norm.weight", same),
    ]
    return rows


def t5_rows(cfg: TransformerConfig) -> list[Row]:
    """T5's table; ``{e}`` runs over the encoder's blocks and ``{d}`` the
    decoder's."""
    embedding = ("shared.", "encoder.embed_tokens.", "decoder.embed_tokens.")
    table = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    stack = [  # (ours under encoder. or decoder., theirs likewise)
        # one relative-position table per stack, stored in the stack's first
        # block
        ("position_bias.relative_attention_bias.weight", table, same),
        ("final_norm.weight", "final_layer_norm.weight", same),
    ]
    return [
        *_token_rows(cfg, tuple(p + "weight" for p in embedding), "lm_head.weight"),
        *_under("encoder.blocks.{e}.", "encoder.block.{e}.", _t5_block(cfg, False)),
        *_under("decoder.blocks.{d}.", "decoder.block.{d}.", _t5_block(cfg, True)),
        *_under("encoder.", "encoder.", stack),
        *_under("decoder.", "decoder.", stack),
    ]


def t5_state_dict(
    their_state_dict: Mapping[str, torch.Tensor], cfg: TransformerConfig
) -> dict[str, torch.Tensor]:
    """A ``T5ForConditionalGeneration`` state dict as the state dict of
    ``T5(cfg)``."""
    return convert_state_dict(
        their_state_dict,
        t5_rows(cfg),
        _shapes_of(T5, cfg),
        ranges={"e": range(cfg.n_layers), "d": range(cfg.decoder_layers)},
        what="T5 -> T5",
    )


# From chapters/07-2-reference.md, section "Llama".
def _plain_rope_base(config: object) -> float:
    """RoPE's base of a Llama config that uses plain RoPE, refusing
    context-extension scaling. 4.x: ``rope_theta``, and ``rope_scaling``
    None; 5.x: ``rope_parameters`` (also read as ``rope_scaling``) with
    ``rope_type`` ``"default"`` and the base in it."""
    rope = getattr(config, "rope_parameters", None) or getattr(
        config, "rope_scaling", None
    )
    plain = rope is None or (
        isinstance(rope, dict) and rope.get("rope_type") == "default"
    )
    if not plain:
        raise ValueError(
            f"{type(config).__name__}.rope_scaling={rope!r} is not "
            "supported (plain RoPE, no context-extension scaling); only "
            "None or rope_type 'default' is"
        )
    return float((rope or {}).get("rope_theta") or config.rope_theta)


def config_from_llama(config: object) -> TransformerConfig:
    """Our configuration of a ``transformers`` ``LlamaConfig`` (read by
    attribute)."""
    rope_base = _plain_rope_base(config)
    _require(config, "attention_bias", False, "Llama here has no biases")
    _require(config, "mlp_bias", False, "Llama here has no biases")
    n_heads = config.num_attention_heads
    return TransformerConfig(
        vocab_size=config.vocab_size,
        d_model=config.hidden_size,
        n_heads=n_heads,
        n_layers=config.num_hidden_layers,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
        d_head=getattr(config, "head_dim", None) or config.hidden_size // n_heads,
        d_ff=config.intermediate_size,
        activation=_activation(config, "hidden_act", gated=True),
        norm="rmsnorm",
        norm_eps=config.rms_norm_eps,
        norm_position="pre",
        positions="rope",
        max_len=config.max_position_embeddings,
        rope_base=rope_base,
        bias=False,
        # Llama drops only attention weights; our one rate would drop
        # everywhere
        dropout=_dropout(config, "attention_dropout", embeddings_and_residuals=0.0),
        tie_embeddings=getattr(config, "tie_word_embeddings", False),
    )


#: RoPE's frequencies, a buffer that older Llama checkpoints saved.
LLAMA_SKIPPED = (r"model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq",)


def llama_rows(cfg: TransformerConfig) -> list[Row]:
    """Llama's table; ``{i}`` runs over the blocks."""
    qkv = [f"self_attn.{p}_proj.weight" for p in "qkv"]
    gate_up = ("mlp.gate_proj.weight", "mlp.up_proj.weight")  # gate first
    # (ours under decoder.blocks.{i}., theirs under model.layers.{i}.)
    block = [
        ("self_attn.norm.weight", "input_layernorm.weight", same),
        ("self_attn.sublayer.qkv_proj.weight", qkv, concat),
        ("self_attn.sublayer.out_proj.weight", "self_attn.o_proj.weight", same),
        ("ffn.norm.weight", "post_attention_layernorm.weight", same),
        ("ffn.sublayer.w_in.weight", gate_up, concat),
        ("ffn.sublayer.w_out.weight", "mlp.down_proj.weight", same),
    ]
    return [
        *_token_rows(cfg, "model.embed_tokens.weight", "lm_head.weight"),
        *_under("decoder.blocks.{i}.", "model.layers.{i}.", block),
        ("decoder.final_norm.weight", "model.norm.weight", same),
    ]


def llama_state_dict(
    their_state_dict: Mapping[str, torch.Tensor], cfg: TransformerConfig
) -> dict[str, torch.Tensor]:
    """A ``LlamaForCausalLM`` state dict as one of ``GPT(cfg)``."""
    return convert_state_dict(
        their_state_dict,
        llama_rows(cfg),
        _shapes_of(GPT, cfg),
        ranges={"i": range(cfg.n_layers)},
        skip=LLAMA_SKIPPED,
        what="Llama -> GPT",
    )


# From chapters/07-2-reference.md, section "Llama".
#: ``model_type`` -> (config reader, state-dict converter, our model class).
REFERENCE_FAMILIES = {
    "gpt2": (config_from_gpt2, gpt2_state_dict, GPT),
    "bert": (config_from_bert, bert_state_dict, BERT),
    "t5": (config_from_t5, t5_state_dict, T5),
    "llama": (config_from_llama, llama_state_dict, GPT),
}


def from_reference(reference: nn.Module) -> nn.Module:
    """Our model with the weights of a ``transformers`` model, in eval mode.

    ``reference``: a ``GPT2LMHeadModel``, ``BertForMaskedLM``,
    ``T5ForConditionalGeneration`` or ``LlamaForCausalLM``, recognised by
    ``reference.config.model_type``.
    """
    family = getattr(getattr(reference, "config", None), "model_type", None)
    if family not in REFERENCE_FAMILIES:
        known = ", ".join(REFERENCE_FAMILIES)
        raise ValueError(f"no loader for model_type {family!r}; known: {known}")
    read_config, convert, model_class = REFERENCE_FAMILIES[family]
    cfg = read_config(reference.config)
    # T5 decodes from its pad id, 0, unless told otherwise
    if model_class is T5:
        start_id = getattr(reference.config, "decoder_start_token_id", None)
        model = T5(cfg, start_id=0 if start_id is None else start_id)
    else:
        model = model_class(cfg)
    load_checked(model, convert(reference.state_dict(), cfg))
    return model.eval()
