# This file is generated from chapters/05-ffn.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""The position-wise feed-forward network (chapter 5 of the course).

Activations (ReLU, GELU in its exact and tanh forms, Swish/SiLU), the classic two-layer FFN,
its gated variants (GLU, ReGLU, GEGLU, SwiGLU) with the 8/3 hidden-size rule, and parameter
counts: of one FFN, and of a whole transformer by component.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

__all__ = [
    "gelu_erf",
    "gelu_tanh",
    "swish",
    "FFN_ACTIVATIONS",
    "FeedForward",
    "GATED_FFN_ACTIVATIONS",
    "gated_ffn_hidden_size",
    "GatedFeedForward",
    "ffn_param_count",
    "TransformerParamConfig",
    "transformer_param_breakdown",
]


def _check_int(value: object, name: str, owner: str, *, minimum: int = 1) -> int:
    """``value`` as an int, or a clear error saying which argument of ``owner`` was wrong."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value}")
    return value


def _check_bool(value: object, name: str, owner: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be True or False, got {value!r}")
    return value


def _check_dropout(p: object, owner: str) -> float:
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise TypeError(f"{owner}: dropout must be a number, got {type(p).__name__} {p!r}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{owner}: dropout must be a probability in [0, 1), got {p!r}")
    return float(p)


def _check_float_tensor(x: object, owner: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner} takes a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{owner} needs a floating-point tensor, got dtype {x.dtype}")
    return x


def _check_features(x: object, d_model: int, owner: str) -> torch.Tensor:
    """Fail unless ``x`` is a float tensor shaped ``(... d_model)``."""
    _check_float_tensor(x, owner)
    if x.ndim == 0 or x.shape[-1] != d_model:
        raise ValueError(
            f"{owner} expects input of shape (..., d_model={d_model}), "
            f"got shape {tuple(x.shape)}: its last dimension must be the model dimension"
        )
    return x


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """GELU, exact form: ``x·Φ(x) = x/2 · (1 + erf(x/√2))`` with Φ the standard normal CDF.

    Shapes: ``x`` is ``(...)``, the result ``(...)``.
    """
    _check_float_tensor(x, "gelu_erf")
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation: ``x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))`` (GPT-2's form).

    Shapes: ``x`` is ``(...)``, the result ``(...)``.
    """
    _check_float_tensor(x, "gelu_tanh")
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    return 0.5 * x * (1.0 + torch.tanh(inner))


#: The activations a plain FFN accepts, by name (PyTorch's fused kernels; see gelu_erf, gelu_tanh).
FFN_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # the exact erf form
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's form
}


class FeedForward(nn.Module):
    """The position-wise feed-forward network: ``W_out · act(W_in · x + b_in) + b_out``.

    The same two linear layers act on every position. ``d_ff`` defaults to ``4 * d_model``;
    ``activation`` is one of :data:`FFN_ACTIVATIONS`; ``bias=False`` drops both biases (T5,
    LLaMA); ``dropout`` acts on the hidden activations.

    Shapes: ``x`` is ``(... d_model)``, the result ``(... d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        activation: str = "gelu",
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        owner = "FeedForward"
        _check_int(d_model, "d_model", owner)
        d_ff = 4 * d_model if d_ff is None else _check_int(d_ff, "d_ff", owner)
        if activation not in FFN_ACTIVATIONS:
            gated = activation in ("glu", "reglu", "geglu", "swiglu")
            hint = " (gated variants are GatedFeedForward's)" if gated else ""
            raise ValueError(
                f"{owner}: unknown activation {activation!r}{hint}; "
                f"valid ones are {', '.join(repr(name) for name in FFN_ACTIVATIONS)}"
            )
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        _check_bool(bias, "bias", owner)
        self.w_in = nn.Linear(d_model, d_ff, bias=bias)  # rows of w_in.weight: the "keys"
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)  # columns of w_out.weight: the "values"
        self.dropout = nn.Dropout(_check_dropout(dropout, owner))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features(x, self.d_model, "FeedForward")
        hidden = FFN_ACTIVATIONS[self.activation](self.w_in(x))  # (... d_ff)
        return self.w_out(self.dropout(hidden))  # (... d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Swish: ``x · sigmoid(beta · x)``; ``beta = 1`` is SiLU, ``beta → ∞`` tends to ReLU.

    Shapes: ``x`` is ``(...)``, the result ``(...)``.
    """
    _check_float_tensor(x, "swish")
    if not isinstance(beta, (int, float)) or isinstance(beta, bool):
        raise TypeError(f"swish: beta must be a number, got {type(beta).__name__} {beta!r}")
    if not math.isfinite(beta):
        raise ValueError(f"swish: beta must be a finite number, got {beta!r}")
    return x * torch.sigmoid(beta * x)


#: The function each gated FFN applies to its gate branch (the value branch stays linear).
GATED_FFN_ACTIVATIONS = {
    "glu": torch.sigmoid,
    "reglu": F.relu,
    "geglu": F.gelu,
    "swiglu": F.silu,  # Swish with beta = 1
}


def gated_ffn_hidden_size(d_model: int, multiple_of: int = 64) -> int:
    """The hidden size of a gated FFN with a plain 4·d_model FFN's parameter count.

    ``floor(8/3 · d_model)`` (three matrices instead of two), rounded up to a multiple of
    ``multiple_of`` as LLaMA does; ``gated_ffn_hidden_size(4096, 256) == 11008``.
    """
    _check_int(d_model, "d_model", "gated_ffn_hidden_size")
    _check_int(multiple_of, "multiple_of", "gated_ffn_hidden_size")
    hidden = 8 * d_model // 3  # 2/3 of the plain FFN's 4·d_model
    return multiple_of * -(-hidden // multiple_of)  # round up (ceiling division), never down


class GatedFeedForward(nn.Module):
    """A gated FFN (GLU, ReGLU, GEGLU or SwiGLU): ``(act(x W_gate) ⊗ x W_value) W_out``.

    ``w_in`` holds the gate and value projections fused, gate first: ``w_in.weight`` is
    ``(2·d_ff, d_model)``. ``d_ff`` defaults to :func:`gated_ffn_hidden_size` (the 8/3 rule,
    rounded up to ``multiple_of``; an explicit ``d_ff`` is used as given). No biases by
    default, as in LLaMA. ``dropout`` acts on the gated hidden activations.

    Shapes: ``x`` is ``(... d_model)``, the result ``(... d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int | None = None,
        activation: str = "swiglu",
        bias: bool = False,
        dropout: float = 0.0,
        multiple_of: int = 64,
    ) -> None:
        super().__init__()
        owner = "GatedFeedForward"
        _check_int(d_model, "d_model", owner)
        _check_int(multiple_of, "multiple_of", owner)
        if d_ff is None:
            d_ff = gated_ffn_hidden_size(d_model, multiple_of)
        _check_int(d_ff, "d_ff", owner)
        if activation not in GATED_FFN_ACTIVATIONS:
            hint = " (a plain FFN is FeedForward's)" if activation in FFN_ACTIVATIONS else ""
            raise ValueError(
                f"{owner}: unknown activation {activation!r}{hint}; "
                f"valid ones are {', '.join(repr(name) for name in GATED_FFN_ACTIVATIONS)}"
            )
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        _check_bool(bias, "bias", owner)
        self.w_in = nn.Linear(d_model, 2 * d_ff, bias=bias)  # gate and value, fused
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(_check_dropout(dropout, owner))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_features(x, self.d_model, "GatedFeedForward")
        gate, value = rearrange(self.w_in(x), "... (branch d_ff) -> branch ... d_ff", branch=2)
        hidden = GATED_FFN_ACTIVATIONS[self.activation](gate) * value  # (... d_ff)
        return self.w_out(self.dropout(hidden))  # (... d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def ffn_param_count(d_model: int, d_ff: int, *, gated: bool = False, bias: bool = True) -> int:
    """Parameters of a plain or gated FFN, from its sizes.

    Plain: ``2·d_model·d_ff`` weights, plus ``d_ff + d_model`` biases if ``bias``. Gated
    (``gated=True``): ``3·d_model·d_ff`` weights, plus ``2·d_ff + d_model`` biases.
    """
    _check_int(d_model, "d_model", "ffn_param_count")
    _check_int(d_ff, "d_ff", "ffn_param_count")
    n_in = 2 * d_ff if gated else d_ff  # a gated FFN projects to gate and value
    weights = d_model * n_in + d_ff * d_model
    biases = n_in + d_model if bias else 0
    return weights + biases


@dataclass(frozen=True)
class TransformerParamConfig:
    """The shape of a transformer, as far as counting its parameters needs.

    ``n_encoder_layers`` blocks have self-attention and an FFN; ``n_decoder_layers`` blocks
    have (masked) self-attention, cross-attention when there is an encoder, and an FFN.
    ``n_positions`` counts *learned* positions (0 for sinusoidal or rotary ones).
    ``n_extra_norms`` counts norms outside the blocks (BERT's embedding norm, a pre-LN final
    norm). ``published`` is the reported total, for comparison: the paper's figure, or the
    released checkpoint's where the two differ (GPT-2 small: 124M, not the paper's 117M).
    The attention count assumes full multi-head attention (``n_heads · d_head = d_model``, no
    grouped-query sharing of keys and values).
    """

    name: str
    d_model: int
    vocab_size: int
    n_encoder_layers: int = 0
    n_decoder_layers: int = 0
    d_ff: int | None = None  # None: 4 * d_model
    n_positions: int = 0
    n_token_types: int = 0
    gated_ffn: bool = False
    bias: bool = True  # biases on the linear layers
    norm_bias: bool = True  # LayerNorm's shift; RMSNorm has none
    n_extra_norms: int = 0
    tied_output: bool = True  # the output projection reuses the token embedding
    pooler: bool = False  # BERT's d_model x d_model pooler on the [CLS] token
    published: float | None = None

    def __post_init__(self) -> None:
        owner = f"TransformerParamConfig({self.name!r})"
        for field in ("d_model", "vocab_size"):
            _check_int(getattr(self, field), field, owner)
        for field in ("n_encoder_layers", "n_decoder_layers", "n_positions", "n_token_types"):
            _check_int(getattr(self, field), field, owner, minimum=0)
        _check_int(self.n_extra_norms, "n_extra_norms", owner, minimum=0)
        for field in ("gated_ffn", "bias", "norm_bias", "tied_output", "pooler"):
            _check_bool(getattr(self, field), field, owner)
        if self.d_ff is not None:
            _check_int(self.d_ff, "d_ff", owner)
        if self.n_encoder_layers + self.n_decoder_layers == 0:
            raise ValueError(f"{owner}: a transformer needs at least one encoder or decoder layer")


def transformer_param_breakdown(config: TransformerParamConfig) -> dict[str, int]:
    """Parameters of a transformer by component, from its shape alone.

    Returns ``{"embeddings", "attention", "ffn", "norms", "head"}`` (``head``: an untied
    output projection and BERT's pooler); the total is the sum of the values.
    """
    if not isinstance(config, TransformerParamConfig):
        raise TypeError(f"expected a TransformerParamConfig, got {type(config).__name__}")
    d, c = config.d_model, config
    d_ff = 4 * d if c.d_ff is None else c.d_ff
    n_blocks = c.n_encoder_layers + c.n_decoder_layers
    cross = c.n_encoder_layers > 0 and c.n_decoder_layers > 0
    decoder_attentions = 2 if cross else 1
    n_attention = c.n_encoder_layers + decoder_attentions * c.n_decoder_layers
    n_norms = 2 * c.n_encoder_layers + (decoder_attentions + 1) * c.n_decoder_layers
    n_norms += c.n_extra_norms
    return {
        "embeddings": (c.vocab_size + c.n_positions + c.n_token_types) * d,
        "attention": n_attention * (4 * d * d + (4 * d if c.bias else 0)),
        "ffn": n_blocks * ffn_param_count(d, d_ff, gated=c.gated_ffn, bias=c.bias),
        "norms": n_norms * (2 * d if c.norm_bias else d),
        "head": (0 if c.tied_output else c.vocab_size * d) + (d * d + d if c.pooler else 0),
    }
