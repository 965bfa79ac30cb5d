# This file is generated from chapters/05-ffn.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/05-ffn.md, section "Two linear layers and a nonlinearity".
"""The position-wise feed-forward network (chapter 5 of the course).

Activations (ReLU, squared ReLU, GELU in its exact and tanh forms,
Swish/SiLU), the classic two-layer FFN, its gated variants (GLU, ReGLU,
GEGLU, SwiGLU) with the 8/3 hidden-size rule, parameter counts (of one FFN,
and of a whole transformer by component), and a mixture of experts with its
load-balancing loss.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, reduce
from torch import nn

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "gelu_erf",
    "gelu_tanh",
    "FFN_ACTIVATIONS",
    "FeedForward",
    "swish",
    "GATED_FFN_ACTIVATIONS",
    "gated_ffn_hidden_size",
    "GatedFeedForward",
    "ffn_param_count",
    "TransformerParamConfig",
    "transformer_param_breakdown",
    "MoEFeedForward",
    "moe_balance_loss",
]


# From chapters/05-ffn.md, section "Activations: ReLU, GELU and its tanh approximation".
def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """GELU, exact form: ``x·Φ(x) = x/2 · (1 + erf(x/√2))``, Φ the standard
    normal CDF.

    Shapes: ``x`` is ``(...)``, the result ``(...)``.
    """
    check.tensor("x", x, floating=True, owner="gelu_erf()")
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


# From chapters/05-ffn.md, section "Activations: ReLU, GELU and its tanh approximation".
def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh form: ``x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))``
    (GPT-2's).

    Shapes: ``x`` is ``(...)``, the result ``(...)``.
    """
    check.tensor("x", x, floating=True, owner="gelu_tanh()")
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    return 0.5 * x * (1.0 + torch.tanh(inner))


# From chapters/05-ffn.md, section "The module".
#: The activations a plain FFN accepts, by name: PyTorch's fused kernels for
#: ReLU and for gelu_erf and gelu_tanh, and Primer's squared ReLU.
FFN_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # the exact erf form
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's form
    "relu2": lambda x: F.relu(x).square(),  # max(0, x)², below
}


# From chapters/05-ffn.md, section "The module".
# Both FFNs' front door: ``x`` ``(... d_model)`` in the dtype and on the
# device of the weights (any dtype under autocast).
_check_ffn_input = check.layer_forward("... d_model", "w_in.weight")
_PLAIN = object()  # no multiple_of: the plain FFN's arguments


def _check_ffn(d_model, d_ff, activation, bias, dropout, multiple_of=_PLAIN):
    """The arguments of :class:`FeedForward` or, given ``multiple_of``, of
    :class:`GatedFeedForward`. Returns ``d_model``, ``d_ff`` (None stays
    None: the class's default) and ``dropout``, checked."""
    gated = multiple_of is not _PLAIN
    owner = "GatedFeedForward" if gated else "FeedForward"
    d_model = check.positive_int("d_model", d_model, owner=owner)
    if gated:
        check.positive_int("multiple_of", multiple_of, owner=owner)
    if d_ff is not None:
        d_ff = check.positive_int("d_ff", d_ff, owner=owner)
    # a name of the other kind of FFN gets a hint
    if gated:
        other = activation in FFN_ACTIVATIONS
        hint, names = "a plain FFN is FeedForward's", GATED_FFN_ACTIVATIONS
    else:
        other = activation in ("glu", "reglu", "geglu", "swiglu")
        hint, names = ("gated variants are GatedFeedForward's", FFN_ACTIVATIONS)
    hint = hint if other else None
    check.one_of("activation", activation, names, owner=owner, hint=hint)
    check.boolean("bias", bias, owner=owner)
    dropout = check.probability("dropout", dropout, owner=owner)
    return d_model, d_ff, dropout


# From chapters/05-ffn.md, section "The module".
class FeedForward(nn.Module):
    """The position-wise feed-forward network
    ``W_out · act(W_in · x + b_in) + b_out``.

    The same two linear layers act on every position. ``d_ff`` defaults to
    ``4 * d_model``; ``activation`` is one of :data:`FFN_ACTIVATIONS`;
    ``bias=False`` drops both biases (T5, LLaMA); ``dropout`` acts on the
    hidden activations.

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
        args = (d_model, d_ff, activation, bias, dropout)
        d_model, d_ff, dropout = _check_ffn(*args)
        if d_ff is None:
            d_ff = 4 * d_model
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        # rows of w_in.weight: the "keys"
        self.w_in = nn.Linear(d_model, d_ff, bias=bias)
        # columns of w_out.weight: the "values"
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    @check.front_door(_check_ffn_input)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the FFN to every position of ``x`` on its own.

        Shapes: ``x`` is ``(... d_model)``, typically
        ``(batch seq d_model)``, in the weights' dtype (any dtype under
        autocast); the result is ``(... d_model)``.
        """
        activation = FFN_ACTIVATIONS[self.activation]
        hidden = activation(self.w_in(x))  # (... d_ff)
        if self.training:  # (in eval, dropout is the identity: no call)
            hidden = self.dropout(hidden)
        return self.w_out(hidden)  # (... d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


# From chapters/05-ffn.md, section "Swish, and gated FFNs".
def swish(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Swish: ``x · sigmoid(beta · x)``; ``beta = 1`` is SiLU, ``beta → ∞``
    is ReLU.

    Shapes: ``x`` is ``(...)``, the result ``(...)``.
    """
    check.tensor("x", x, floating=True, owner="swish()")
    beta = check.finite_float("beta", beta, owner="swish()")
    return x * torch.sigmoid(beta * x)


# From chapters/05-ffn.md, section "Swish, and gated FFNs".
#: The function each gated FFN applies to its gate branch (the value branch
#: is linear).
GATED_FFN_ACTIVATIONS = {
    "glu": torch.sigmoid,
    "reglu": F.relu,
    "geglu": F.gelu,
    "swiglu": F.silu,  # Swish with beta = 1
}


# From chapters/05-ffn.md, section "The 8/3 rule".
def _check_hidden_size(d_model, multiple_of) -> tuple[int, int]:
    """:func:`gated_ffn_hidden_size`'s sizes, as ints ``>= 1``."""
    owner = "gated_ffn_hidden_size()"
    d_model = check.positive_int("d_model", d_model, owner=owner)
    multiple_of = check.positive_int("multiple_of", multiple_of, owner=owner)
    return d_model, multiple_of


# From chapters/05-ffn.md, section "The 8/3 rule".
def gated_ffn_hidden_size(d_model: int, multiple_of: int = 64) -> int:
    """The hidden size of a gated FFN with a plain 4·d_model FFN's parameter
    count.

    ``floor(8/3 · d_model)`` (three matrices instead of two), rounded up to
    a multiple of ``multiple_of`` as LLaMA does;
    ``gated_ffn_hidden_size(4096, 256) == 11008``.
    """
    d_model, multiple_of = _check_hidden_size(d_model, multiple_of)
    hidden = 8 * d_model // 3  # 2/3 of the plain FFN's 4·d_model
    # round up (ceiling division), never down
    return multiple_of * -(-hidden // multiple_of)


# From chapters/05-ffn.md, section "The 8/3 rule".
class GatedFeedForward(nn.Module):
    """A gated FFN (GLU, ReGLU, GEGLU, SwiGLU):
    ``(act(x W_gate) ⊗ x W_value) W_out``.

    ``w_in`` holds the gate and value projections fused, gate first:
    ``w_in.weight`` is ``(2·d_ff, d_model)``. ``d_ff`` defaults to
    :func:`gated_ffn_hidden_size` (the 8/3 rule, rounded up to
    ``multiple_of``; an explicit ``d_ff`` is used as given). No biases by
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
        # FeedForward's folded checks, with multiple_of
        args = (d_model, d_ff, activation, bias, dropout, multiple_of)
        d_model, d_ff, dropout = _check_ffn(*args)
        if d_ff is None:
            d_ff = gated_ffn_hidden_size(d_model, multiple_of)
        self.d_model, self.d_ff, self.activation = d_model, d_ff, activation
        # gate and value, fused
        self.w_in = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.w_out = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    @check.front_door(_check_ffn_input)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated FFN to every position of ``x`` on its own.

        Shapes: ``x`` is ``(... d_model)``, typically
        ``(batch seq d_model)``, in the weights' dtype (any dtype under
        autocast); the result is ``(... d_model)``.
        """
        split = "... (branch d_ff) -> branch ... d_ff"
        gate, value = rearrange(self.w_in(x), split, branch=2)
        activation = GATED_FFN_ACTIVATIONS[self.activation]
        hidden = activation(gate) * value  # (... d_ff)
        if self.training:  # (in eval, dropout is the identity: no call)
            hidden = self.dropout(hidden)
        return self.w_out(hidden)  # (... d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


# From chapters/05-ffn.md, section "The 8/3 rule".
def ffn_param_count(
    d_model: int, d_ff: int, *, gated: bool = False, bias: bool = True
) -> int:
    """Parameters of a plain or gated FFN, from its sizes.

    Plain: ``2·d_model·d_ff`` weights, plus ``d_ff + d_model`` biases if
    ``bias``. Gated (``gated=True``): ``3·d_model·d_ff`` weights, plus
    ``2·d_ff + d_model`` biases.
    """
    owner = "ffn_param_count()"
    check.positive_ints(d_model=d_model, d_ff=d_ff, owner=owner)
    check.booleans(gated=gated, bias=bias, owner=owner)
    # a gated FFN projects to gate and value
    n_in = 2 * d_ff if gated else d_ff
    weights = d_model * n_in + d_ff * d_model
    biases = n_in + d_model if bias else 0
    return weights + biases


# From chapters/05-ffn.md, section "Where the parameters live".
def _check_param_config(config) -> None:
    """A :class:`TransformerParamConfig`'s fields: a name, sizes ``>= 1``,
    counts ``>= 0``, flags, a positive ``published``, and some layers."""
    owner = f"TransformerParamConfig({config.name!r})"
    check.string("name", config.name, owner=owner)
    for field in ("d_model", "vocab_size"):
        check.positive_int(field, getattr(config, field), owner=owner)
    counts = ("n_encoder_layers", "n_decoder_layers", "n_positions")
    counts += ("n_token_types", "n_extra_norms")
    for field in counts:
        check.int_at_least(field, getattr(config, field), 0, owner=owner)
    flags = "gated_ffn bias norm_bias tied_output pooler"
    for field in flags.split():
        check.boolean(field, getattr(config, field), owner=owner)
    if config.d_ff is not None:
        check.positive_int("d_ff", config.d_ff, owner=owner)
    positive = dict(low=0, low_open=True, owner=owner)
    if config.published is not None:
        check.finite_float("published", config.published, **positive)
    if config.n_encoder_layers + config.n_decoder_layers == 0:
        raise ValueError(f"{owner}: it needs at least one encoder or decoder layer")


# From chapters/05-ffn.md, section "Where the parameters live".
@dataclass(frozen=True)
class TransformerParamConfig:
    """The shape of a transformer, as far as counting its parameters needs.

    ``n_encoder_layers`` blocks have self-attention and an FFN;
    ``n_decoder_layers`` blocks have (masked) self-attention,
    cross-attention when there is an encoder, and an FFN. ``n_positions``
    counts *learned* positions (0 for sinusoidal or rotary ones).
    ``n_extra_norms`` counts norms outside the blocks (BERT's embedding
    norm, a pre-LN final norm). ``published`` is the reported total, for
    comparison: the paper's figure, or the released checkpoint's where the
    two differ (GPT-2 small: 124M, not the paper's 117M). The attention
    count assumes full multi-head attention (``n_heads · d_head = d_model``,
    no grouped-query sharing of keys and values).
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
    # the output projection reuses the token embedding
    tied_output: bool = True
    # BERT's d_model x d_model pooler on the [CLS] token
    pooler: bool = False
    published: float | None = None

    def __post_init__(self) -> None:
        _check_param_config(self)


# From chapters/05-ffn.md, section "Where the parameters live".
def transformer_param_breakdown(config: TransformerParamConfig) -> dict:
    """Parameters of a transformer by component, from its shape alone.

    Returns ``{"embeddings", "attention", "ffn", "norms", "head"}``
    (``head``: an untied output projection and BERT's pooler); the total is
    the sum of the values.
    """
    check.instance("config", config, TransformerParamConfig)
    d, c = config.d_model, config
    d_ff = 4 * d if c.d_ff is None else c.d_ff
    n_blocks = c.n_encoder_layers + c.n_decoder_layers
    cross = c.n_encoder_layers > 0 and c.n_decoder_layers > 0
    decoder_attentions = 2 if cross else 1
    n_encoder, n_decoder = c.n_encoder_layers, c.n_decoder_layers
    n_attention = n_encoder + decoder_attentions * n_decoder
    # a norm per sublayer, and the norms outside the blocks
    n_norms = 2 * n_encoder + (decoder_attentions + 1) * n_decoder
    n_norms += c.n_extra_norms
    untied = 0 if c.tied_output else c.vocab_size * d
    pooler = d * d + d if c.pooler else 0
    ffn = ffn_param_count(d, d_ff, gated=c.gated_ffn, bias=c.bias)
    return {
        "embeddings": (c.vocab_size + c.n_positions + c.n_token_types) * d,
        "attention": n_attention * (4 * d * d + (4 * d if c.bias else 0)),
        "ffn": n_blocks * ffn,
        "norms": n_norms * (2 * d if c.norm_bias else d),
        "head": untied + pooler,
    }


# From chapters/05-ffn.md, section "Mixture of experts".
def _check_moe(d_model, d_ff, n_experts, top_k, activation, bias):
    """MoEFeedForward's sizes and choices; returns the sizes as ints."""
    owner = "MoEFeedForward"
    sizes = dict(d_model=d_model, n_experts=n_experts, top_k=top_k)
    sizes = check.positive_ints(**sizes, owner=owner)
    if d_ff is not None:
        check.positive_int("d_ff", d_ff, owner=owner)
    names = (*FFN_ACTIVATIONS, *GATED_FFN_ACTIVATIONS)
    check.one_of("activation", activation, names, owner=owner)
    check.boolean("bias", bias, owner=owner)
    if sizes[2] > sizes[1]:
        why = "a token cannot use more experts than there are"
        got = f"top_k={sizes[2]} exceeds n_experts={sizes[1]}"
        raise ValueError(f"{owner}: {got}: {why}")
    return sizes


_check_moe_input = check.layer_forward("... d_model", "router.weight")


# From chapters/05-ffn.md, section "Mixture of experts".
class MoEFeedForward(nn.Module):
    """A mixture of experts: a router sends each token to ``top_k`` of
    ``n_experts`` FFNs and mixes their outputs.

    The router (linear, no bias) gives each token a softmax over the
    experts; the ``top_k`` most probable are kept and their probabilities
    renormalised to sum to 1. Each expert is a :class:`FeedForward` (a
    :class:`GatedFeedForward` for a gated ``activation``) of hidden size
    ``d_ff`` (None: that FFN's default). After each forward,
    ``balance_loss`` holds the Switch Transformer's load-balancing loss
    ``n_experts · Σ_i f_i · P_i`` (``f_i``: the share of routed token slots
    sent to expert ``i``; ``P_i``: its mean router probability), 1 when
    routing is uniform. With ``top_k=1`` the kept weight is always 1, so
    the router learns from the balance loss alone.

    Shapes: ``x`` is ``(... d_model)``, the result ``(... d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int | None,
        n_experts: int,
        top_k: int,
        activation: str = "gelu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        sizes = _check_moe(d_model, d_ff, n_experts, top_k, activation, bias)
        self.d_model, self.n_experts, self.top_k = sizes
        self.activation = activation
        self.router = nn.Linear(d_model, n_experts, bias=False)
        gated = activation in GATED_FFN_ACTIVATIONS
        expert = GatedFeedForward if gated else FeedForward
        self.experts = nn.ModuleList(
            expert(d_model, d_ff, activation, bias) for _ in range(n_experts)
        )
        self.d_ff = self.experts[0].d_ff
        self.balance_loss = torch.zeros(())  # until the first forward

    @check.front_door(_check_moe_input)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Route every position of ``x`` to its experts and mix their
        outputs; store the batch's ``balance_loss``.

        Shapes: ``x`` is ``(... d_model)``, the result ``(... d_model)``.
        """
        tokens = rearrange(x, "... d_model -> (...) d_model")
        probs = self.router(tokens).softmax(dim=-1)  # (tokens experts)
        top_probs, top_experts = probs.topk(self.top_k, dim=-1)
        # (tokens top_k): the kept experts' weights, summing to 1
        top_weights = top_probs / top_probs.sum(dim=-1, keepdim=True)
        mixed = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            # the tokens routed to expert e, and in which of their slots
            rows, slots = torch.where(top_experts == e)
            weights = rearrange(top_weights[rows, slots], "n -> n 1")
            out = expert(tokens[rows]) * weights  # (n d_model)
            mixed.index_add_(0, rows, out.to(mixed.dtype))
        # Switch's loss: n · Σ f_i · P_i; f counts slots (no gradient)
        counts = torch.bincount(top_experts.flatten(), minlength=self.n_experts)
        routed_share = counts / top_experts.numel()  # f: (experts)
        mean_prob = reduce(probs, "tokens experts -> experts", "mean")  # P
        self.balance_loss = self.n_experts * (routed_share * mean_prob).sum()
        return mixed.reshape(x.shape)

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, top_k={self.top_k}"


# From chapters/05-ffn.md, section "Mixture of experts".
def moe_balance_loss(model: nn.Module) -> torch.Tensor:
    """The sum of ``balance_loss`` over every :class:`MoEFeedForward` in
    ``model`` (from each one's last forward); a 0-dim zero when there is
    none. Add it, times a small weight, to the training loss.
    """
    check.instance("model", model, nn.Module, owner="moe_balance_loss()")
    layers = [m for m in model.modules() if isinstance(m, MoEFeedForward)]
    if not layers:
        return torch.zeros(())
    return torch.stack([m.balance_loss for m in layers]).sum()
