# This file is generated from chapters/07-5-pretrained.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/07-5-pretrained.md, section "The models at work".
"""Pretrained weights in the course's own classes, and the checkpoints the
course ships (chapter 7).

* :func:`load_pretrained` takes a hub name from :data:`PRETRAINED` (GPT-2
  small, DistilGPT2, BERT-base, T5-small, ViT-B/16), loads the published
  model and its tokenizer with ``transformers`` and returns ours
  (:class:`Pretrained`), converted by :func:`lib.hf_weights.from_reference`
  or by the loader a later chapter registers (:func:`register_hub_loader`:
  chapter 10's ViT). When the hub cannot be used
  (:func:`hub_problem`: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set,
  no network, or no answer within a few seconds) it reads the local cache,
  and failing that builds the same configuration with random weights
  (:func:`random_model`) and a :class:`ByteTokenizer`, and says in one line
  why: offline, the hub too slow (and how to wait longer), or a download
  that failed.
* :func:`save_model` and :func:`load_model`: one file for a model, its
  configuration, weights, tokenizer, metadata and sha256, of any kind in
  :data:`MODEL_KINDS` (chapter 10 registers its ViT there,
  :func:`register_model_kind`); ``lib.training``'s checkpoints wrap one.
* :func:`save_shipped`, :func:`load_shipped`, :func:`shipped_names`: small
  trained models that ship in ``lib/data/checkpoints/`` as such files, each
  checked against the sha256 digest that ``manifest.json`` records with its
  size and metrics.

``transformers`` is imported only by the functions that need it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch
from torch import nn

from lib import _checks as check
from lib.datasets import DATA_DIR, ChecksumError, sha256_file
from lib.hf_weights import REFERENCE_FAMILIES, from_reference, load_checked
from lib.models import (
    BERT,
    GPT,
    T5,
    SequenceClassifier,
    TransformerConfig,
    count_parameters,
)
from lib.tokenizer import BPETokenizer, CharTokenizer
from lib.utils import get_device, relative_command

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "MODEL_FORMAT",
    "RUNTIME_FIELDS",
    "ModelFileError",
    "ModelKind",
    "MODEL_KINDS",
    "register_model_kind",
    "model_kind",
    "content_sha256",
    "check_packed",
    "SavedModel",
    "unpack_model",
    "load_model",
    "CHECKPOINTS",
    "MANIFEST",
    "FP32_LIMIT",
    "Shipped",
    "shipped_names",
    "load_shipped",
    "HubModel",
    "PRETRAINED",
    "hub_model",
    "reference_config",
    "ByteTokenizer",
    "OFFLINE_VARIABLES",
    "OFFLINE",
    "TOO_SLOW",
    "FAILED",
    "hub_problem",
    "HUB_TIMEOUTS",
    "Pretrained",
    "random_model",
    "load_pretrained",
    "HubLoader",
    "HUB_LOADERS",
    "register_hub_loader",
    "pack_model",
    "plain_values",
    "packed_differences",
    "atomic_save",
    "save_model",
    "remove_stale_temporaries",
    "save_shipped",
]


# From chapters/07-5-pretrained.md, section "The models at work".
#: What a model file calls its format.
MODEL_FORMAT = "lib.pretrained.model/1"
#: Configuration fields that change how a model runs, not what its weights
#: mean: a model file loads, and a checkpoint resumes, with other values.
RUNTIME_FIELDS = ("attn_backend", "dropout")


class ModelFileError(RuntimeError):
    """A model file cannot be used: unreadable, damaged or not a model file
    (then ``damaged`` is True), of a kind no module registers, or asked to
    hold what it cannot."""

    def __init__(self, message: str, *, damaged: bool = False) -> None:
        super().__init__(message)
        self.damaged = damaged


@dataclass(frozen=True)
class ModelKind:
    """How a model file stores and rebuilds one class of model.

    ``name``: what the file calls it (``"gpt"``); ``model_class`` and
    ``config_class`` (a dataclass, the model's ``cfg``); ``arguments``:
    what else the constructor takes, read from a model (T5's ``start_id``);
    ``build(config, **arguments)``: the model (default: ``model_class``);
    ``runtime``: the fields of the configuration and the arguments that may
    differ when it is loaded or resumed; ``module``: the module that
    registers it, which :func:`load_model` imports when a file names a kind
    not registered yet (default: the class's module).
    """

    name: str
    model_class: type
    config_class: type
    arguments: Callable[[nn.Module], Mapping[str, Any]] | None = None
    build: Callable[..., nn.Module] | None = None
    runtime: tuple[str, ...] = RUNTIME_FIELDS
    module: str | None = None

    def make(self, config: Any, arguments: Mapping[str, Any]) -> nn.Module:
        """A new model of this kind (random weights)."""
        return (self.build or self.model_class)(config, **arguments)


#: The kinds of model a model file can hold, by name; a later chapter adds
#: its own (chapter 10: ``"vit"``) with :func:`register_model_kind`.
MODEL_KINDS: dict[str, ModelKind] = {}


def register_model_kind(kind: ModelKind) -> ModelKind:
    """Add (or replace) ``kind`` in :data:`MODEL_KINDS`; returns it."""
    check.instance("kind", kind, ModelKind, owner="register_model_kind")
    MODEL_KINDS[check.string("kind.name", kind.name)] = kind
    return kind


def model_kind(model: nn.Module) -> ModelKind | None:
    """The registered kind of ``model`` (its exact class), or None."""
    kinds = MODEL_KINDS.values()
    return next((k for k in kinds if type(model) is k.model_class), None)


def _classifier(bert_cfg, n_classes: int, dropout: float) -> nn.Module:
    return SequenceClassifier(BERT(bert_cfg), n_classes, dropout)


for _kind in (
    ModelKind("gpt", GPT, TransformerConfig),
    ModelKind("bert", BERT, TransformerConfig),
    ModelKind(
        "classifier",
        SequenceClassifier,
        TransformerConfig,
        arguments=lambda m: dict(n_classes=m.head.out_features, dropout=m.dropout.p),
        build=_classifier,
    ),
    ModelKind(
        "t5", T5, TransformerConfig, arguments=lambda m: dict(start_id=m.start_id)
    ),
):
    register_model_kind(replace(_kind, module="lib.pretrained"))


# From chapters/07-5-pretrained.md, section "The models at work".
def content_sha256(value: Any) -> str:
    """A digest of everything in ``value``: each tensor's dtype, shape and
    bytes, every other value's ``repr``, in a fixed order (a flipped byte
    changes it)."""
    digest = hashlib.sha256()

    def walk(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            data = item.detach().cpu().contiguous().reshape(-1)
            digest.update(f"tensor {data.dtype} {tuple(item.shape)}".encode())
            digest.update(data.view(torch.uint8).numpy())
        elif isinstance(item, Mapping):
            for key, inner in item.items():
                digest.update(f"key {key!r}".encode())
                walk(inner)
        elif isinstance(item, list | tuple):
            digest.update(f"list {len(item)}".encode())
            for inner in item:
                walk(inner)
        else:
            digest.update(f"value {item!r}".encode())

    walk(value)
    return digest.hexdigest()


def check_packed(packed: Any, where: str) -> dict[str, Any]:
    """``packed`` if it is an intact :func:`pack_model` dict; else a
    :class:`ModelFileError` (``damaged``) naming ``where`` it came from."""
    if not isinstance(packed, dict) or packed.get("format") != MODEL_FORMAT:
        raise ModelFileError(f"{where} is not a model file", damaged=True)
    rest = {k: v for k, v in packed.items() if k != "sha256"}
    if packed.get("sha256") != content_sha256(rest):  # a changed byte
        raise ModelFileError(f"{where} is damaged: not its sha256", damaged=True)
    return packed


def _tokenizer(state: Mapping[str, Any] | None) -> Any:
    """The tokenizer that :func:`_tokenizer_state` stored (or None)."""
    if state is None:
        return None
    if state["type"] == "char":
        return CharTokenizer("".join(state["chars"]))
    expected = BPETokenizer().to_dict()
    for field in ("format", "version", "pattern"):
        if state.get(field) != expected[field]:
            got = state.get(field)
            raise ModelFileError(f"its BPE tokenizer has another {field}: {got!r}")
    merges = [tuple(pair) for pair in state["merges"]]
    return BPETokenizer.from_merges(merges, state["special_tokens"])


def _kind_of(packed: Mapping[str, Any], where: str) -> ModelKind:
    """The registered kind a model file names, importing the module that
    registers it if need be (only a module of this package)."""
    name, module = packed["kind"], packed.get("module")
    package = __name__.split(".")[0] if "." in __name__ else "lib"
    ours = isinstance(module, str) and module.startswith(f"{package}.")
    if name not in MODEL_KINDS and ours:
        importlib.import_module(module)
    if name not in MODEL_KINDS:
        known = ", ".join(MODEL_KINDS)
        what = f"the weights of a {packed.get('class')}, of no kind"
        if name is not None:
            what = f"a model of kind {name!r}, which no imported module"
            what += f" registers (it names {module!r})"
        raise ModelFileError(
            f"{where} holds {what}: load_model rebuilds only the kinds of "
            f"lib.pretrained.MODEL_KINDS ({known}); load the weights into "
            "a model built by hand (lib.training.load_checkpoint)"
        )
    return MODEL_KINDS[name]


@dataclass
class SavedModel:
    """A model file, loaded: ``model`` (eval mode), its ``tokenizer`` (or
    None), ``kind``, ``config`` (the configuration object the model was
    built from), ``metadata``, ``sha256`` (the digest of the file's
    content), ``dtype`` (of the stored weights) and ``path``."""

    model: nn.Module
    tokenizer: Any
    kind: str
    config: Any
    metadata: dict[str, Any]
    sha256: str
    dtype: str
    path: Path | None = None


def unpack_model(
    packed: Mapping[str, Any],
    *,
    device: torch.device | str | None = None,
    where: str = "the model file",
    **runtime: Any,
) -> SavedModel:
    """The model a :func:`pack_model` dict holds, rebuilt from its kind and
    configuration, with its weights, tokenizer and metadata; ``runtime``
    overrides the kind's runtime fields (``attn_backend="sdpa"`` for a
    model saved with ``"flash_triton"``, ``dropout=0.0``)."""
    packed = check_packed(packed, where)
    kind = _kind_of(packed, where)
    allowed = [k for k in kind.runtime if k in packed["config"]]
    if other := sorted(set(runtime) - set(allowed)):
        raise ValueError(
            f"load_model: {', '.join(other)} cannot change at loading (it "
            f"changes what the weights mean); a {kind.name} may change: "
            f"{', '.join(allowed)}"
        )
    config = {**packed["config"], **runtime}
    arguments = {**packed["arguments"]}
    arguments |= {k: v for k, v in runtime.items() if k in arguments}
    try:
        cfg = kind.config_class(**config)
    except TypeError as err:  # a field this version does not know
        raise ModelFileError(f"{where}: its configuration: {err}") from None
    model = kind.make(cfg, arguments)
    load_checked(model, packed["state_dict"])
    # get_device names a device this machine lacks, in words
    model = model.to("cpu" if device is None else get_device(str(device)))
    return SavedModel(
        model.eval(),
        _tokenizer(packed["tokenizer"]),
        kind.name,
        cfg,
        dict(packed["metadata"]),
        packed["sha256"],
        packed["dtype"],
    )


def load_model(
    path: str | os.PathLike, *, device: torch.device | str | None = None, **runtime: Any
) -> SavedModel:
    """The model of a file of :func:`save_model` (or of a file that holds
    one under ``"model"``: a :mod:`lib.training` checkpoint), in one call:
    the model rebuilt from its kind and configuration, in eval mode on
    ``device`` (default: the CPU), with its weights, tokenizer, metadata and
    sha256 (verified) in a :class:`SavedModel`.

    ``runtime`` sets the kind's runtime fields (``attn_backend="sdpa"`` for
    a model trained with ``"flash_triton"``). A file that is missing,
    unreadable, damaged or of an unknown kind is a :class:`ModelFileError`
    that names it; loading reads with ``weights_only=True``.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"no model file at {path}")
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ModelFileError(
            f"{path} is not a readable model file (truncated or "
            f"corrupted?). The cause, in full: {type(err).__name__}: {err}",
            damaged=True,
        ) from err
    inner = content.get("model") if isinstance(content, dict) else None
    if isinstance(inner, dict) and inner.get("format") == MODEL_FORMAT:
        content = inner  # a checkpoint that wraps a model file
    saved = unpack_model(content, device=device, where=str(path), **runtime)
    saved.path = path
    return saved


# From chapters/07-5-pretrained.md, section "The models at work".
#: The folder of the checkpoints that ship with the course.
CHECKPOINTS = DATA_DIR / "checkpoints"
#: The manifest: each checkpoint's file, sha256, size, metrics, command.
MANIFEST = "manifest.json"
#: Checkpoints with more float32 weight bytes than this are kept in fp16.
FP32_LIMIT = 10_000_000


@dataclass
class Shipped:
    """A shipped checkpoint, loaded: ``model`` (eval mode), its
    ``tokenizer`` (a :class:`~lib.tokenizer.CharTokenizer` or a
    :class:`~lib.tokenizer.BPETokenizer`, or None),
    ``name``, ``entry``, its record in the manifest (``file``, ``sha256``,
    ``bytes``, ``kind``, ``dtype``, ``parameters``, ``metrics``,
    ``record``, ``command``, and ``inputs``: how to prepare what the model
    reads, such as the pixel mean and std a ViT was trained with), and
    ``metadata``, what the model file itself holds besides the model."""

    model: nn.Module
    tokenizer: Any
    name: str
    entry: dict[str, Any]
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


def _manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def shipped_names(directory: str | os.PathLike = CHECKPOINTS) -> list[str]:
    """The names of the checkpoints in ``directory``'s manifest."""
    return sorted(_manifest(Path(directory)))


def load_shipped(
    name: str,
    device: torch.device | str | None = None,
    *,
    directory: str | os.PathLike = CHECKPOINTS,
) -> Shipped:
    """A shipped checkpoint by name: its file's sha256 checked against the
    manifest, then read by :func:`load_model` (the model in eval mode on
    ``device``, default the CPU, and its tokenizer).

    A name the manifest does not list, or a listed file that is missing, is
    a ``FileNotFoundError``; a file whose digest is not the manifest's
    (corrupt, truncated, altered) a :class:`~lib.datasets.ChecksumError`;
    both name it.
    """
    directory = Path(directory)
    manifest = _manifest(directory)
    if name not in manifest:
        listed = ", ".join(sorted(manifest)) or "none"
        where = directory / MANIFEST
        raise FileNotFoundError(f"{where} lists no {name!r} (it lists: {listed})")
    entry = manifest[name]
    path = directory / entry["file"]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing (the manifest lists it): restore it from "
            "the repository, or reinstall the package"
        )
    digest = sha256_file(path)
    if digest != (recorded := entry["sha256"]):
        raise ChecksumError(
            f"{path} has sha256 {digest}, the manifest records {recorded}: "
            "the file is corrupt or was altered; restore it from the "
            "repository"
        )
    saved = load_model(path, device=device)
    return Shipped(saved.model, saved.tokenizer, name, entry, saved.metadata)


# From chapters/07-5-pretrained.md, section "GPT-2: every strategy, its loss, and speculative decoding".
@dataclass(frozen=True)
class HubModel:
    """One model of the Hugging Face hub, as the course loads it.

    ``name``: its hub name (its last part, ``gpt2``, works too);
    ``reference``: the ``transformers`` class that loads it;
    ``config_class`` and ``config``: the published hyperparameters, so its
    shapes are known with no download; ``licence`` and ``source``: what its
    model card says; ``byte_tokens``: the arguments of the
    :class:`ByteTokenizer` that stands in for its tokenizer offline (None:
    it takes no text); ``loader``: the module that registers the loader of
    its ``config_class`` (:func:`register_hub_loader`), imported when the
    model is first asked for (None: a text model, which
    :func:`~lib.hf_weights.from_reference` converts).
    """

    name: str
    reference: str
    config_class: str
    config: Mapping[str, Any]
    licence: str
    source: str
    byte_tokens: Mapping[str, Any] | None = None
    loader: str | None = None

    @property
    def short(self) -> str:
        """The name without its organisation: ``gpt2``, ``t5-small``."""
        return self.name.rsplit("/", 1)[-1]


_GPT2_SIZES = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_head=12)
_GPT2_BYTES = dict(
    vocab_size=50257, specials={"<|endoftext|>": 50256}, eos="<|endoftext|>"
)
_BERT_SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102}

#: The hub models the chapters load, by name.
PRETRAINED = {
    model.name: model
    for model in (
        HubModel(
            "openai-community/gpt2",
            "GPT2LMHeadModel",
            "GPT2Config",
            dict(_GPT2_SIZES, n_layer=12),
            "MIT",
            "OpenAI's GPT-2 small (124M parameters), trained on WebText",
            _GPT2_BYTES,
        ),
        HubModel(
            "distilbert/distilgpt2",
            "GPT2LMHeadModel",
            "GPT2Config",
            dict(_GPT2_SIZES, n_layer=6),
            "Apache-2.0",
            "Hugging Face's DistilGPT2 (82M parameters), distilled from "
            "GPT-2 small on OpenWebText",
            _GPT2_BYTES,
        ),
        HubModel(
            "google-bert/bert-base-uncased",
            "BertForMaskedLM",
            "BertConfig",
            dict(
                vocab_size=30522,
                hidden_size=768,
                num_hidden_layers=12,
                num_attention_heads=12,
                intermediate_size=3072,
                max_position_embeddings=512,
                type_vocab_size=2,
            ),
            "Apache-2.0",
            "Google's BERT-base, uncased (110M parameters), trained on "
            "BookCorpus and English Wikipedia",
            dict(
                vocab_size=30522,
                offset=1000,
                specials=_BERT_SPECIALS | {"[MASK]": 103},
                prefix=("[CLS]",),
                suffix=("[SEP]",),
                pad="[PAD]",
                mask="[MASK]",
            ),
        ),
        HubModel(
            "google-t5/t5-small",
            "T5ForConditionalGeneration",
            "T5Config",
            dict(
                vocab_size=32128,
                d_model=512,
                d_kv=64,
                d_ff=2048,
                num_layers=6,
                num_decoder_layers=6,
                num_heads=8,
                relative_attention_num_buckets=32,
                relative_attention_max_distance=128,
                feed_forward_proj="relu",
                decoder_start_token_id=0,
                pad_token_id=0,
                eos_token_id=1,
            ),
            "Apache-2.0",
            "Google's T5-small (60M parameters), trained on C4 mixed with "
            "supervised tasks, translation among them",
            dict(
                vocab_size=32128,
                offset=3,
                specials={"<pad>": 0, "</s>": 1, "<unk>": 2},
                suffix=("</s>",),
                pad="<pad>",
                eos="</s>",
            ),
        ),
        HubModel(
            "google/vit-base-patch16-224",
            "ViTForImageClassification",
            "ViTConfig",
            dict(
                image_size=224,
                patch_size=16,
                num_channels=3,
                hidden_size=768,
                num_hidden_layers=12,
                num_attention_heads=12,
                intermediate_size=3072,
                num_labels=1000,
            ),
            "Apache-2.0",
            "Google's ViT-B/16 (86M parameters), pre-trained on "
            "ImageNet-21k, fine-tuned on ImageNet-1k at 224×224",
            loader="lib.vit",  # chapter 10 registers its loader
        ),
    )
}


def hub_model(name: str) -> HubModel:
    """The :data:`PRETRAINED` entry for a hub name, or for its last part."""
    check.string("name", name)
    by_short = {model.short: model for model in PRETRAINED.values()}
    found = PRETRAINED.get(name) or by_short.get(name)
    if found is None:
        known = ", ".join(PRETRAINED)
        raise ValueError(f"no pretrained model {name!r} here; known: {known}")
    return found


def reference_config(name: str, **overrides: Any) -> Any:
    """The ``transformers`` configuration of ``name``: its published sizes
    (and ``overrides``), built with no download."""
    import transformers

    model = hub_model(name)
    config_class = getattr(transformers, model.config_class)
    return config_class(**{**model.config, **overrides})


# From chapters/07-5-pretrained.md, section "GPT-2: every strategy, its loss, and speculative decoding".
class ByteTokenizer:
    """The offline stand-in for a hub tokenizer: UTF-8 bytes as tokens.

    Byte ``b`` is id ``offset + b``; ``specials`` maps special tokens
    (``"[MASK]"``, ``"</s>"``) to their ids, and ``encode`` finds them in
    the text and adds ``prefix`` and ``suffix`` (BERT's ``[CLS]`` and
    ``[SEP]``, T5's ``</s>``). Like a ``transformers`` tokenizer:
    ``encode(text, add_special_tokens=True)``, ``decode(ids,
    skip_special_tokens=False)``, ``vocab_size``, ``pad_token_id``,
    ``eos_token_id``, ``mask_token`` and ``mask_token_id`` (None when
    absent). Decoded, an id that is neither a byte nor special reads
    ``<id>`` (``<41959>``, set off by a space from the text before it), and
    a byte outside a valid UTF-8 character ``\\xNN``, so that a random
    model's output stays readable.
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        offset: int = 0,
        specials: Mapping[str, int] | None = None,
        prefix: Sequence[str] = (),
        suffix: Sequence[str] = (),
        pad: str | None = None,
        eos: str | None = None,
        mask: str | None = None,
    ) -> None:
        self.vocab_size, self.offset = vocab_size, offset
        self.specials = dict(specials or {})
        check.int_in_range("offset", offset, 0, vocab_size - 256)
        for token, token_id in self.specials.items():
            check.int_in_range(f"specials[{token!r}]", token_id, 0, vocab_size - 1)
        self.prefix = [self.specials[token] for token in prefix]
        self.suffix = [self.specials[token] for token in suffix]
        self.pad_token_id, self.eos_token_id, self.mask_token_id = (
            None if token is None else self.specials[token]
            for token in (pad, eos, mask)
        )
        self.mask_token = mask
        self._token_of = {token_id: t for t, token_id in self.specials.items()}
        # the longest first, so that no special token is cut by a shorter
        # one
        names = sorted(self.specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``: its bytes, and its special tokens' ids."""
        check.string("text", text, utf8=True, owner="ByteTokenizer.encode()")
        pieces = self._split.split(text) if self.specials else [text]
        ids = []
        for index, piece in enumerate(pieces):
            if index % 2:  # the split's odd pieces are the special tokens
                ids.append(self.specials[piece])
            else:
                ids += [self.offset + byte for byte in piece.encode("utf-8")]
        if add_special_tokens:
            ids = self.prefix + ids + self.suffix
        return ids

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (a list or a tensor ``(seq,)``)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        text, run = "", bytearray()  # run: the bytes not yet decoded
        for token_id in ids:
            if 0 <= token_id - self.offset < 256:
                run.append(token_id - self.offset)
                continue
            text += run.decode("utf-8", errors="backslashreplace")
            run = bytearray()
            if token_id not in self._token_of:
                # set off by a space: a line wraps between two such ids
                text += f"{' ' if text[-1:].strip() else ''}<{token_id}>"
            elif not skip_special_tokens:
                text += self._token_of[token_id]
        return text + run.decode("utf-8", errors="backslashreplace")

    def __repr__(self) -> str:
        specials = ", ".join(self.specials)
        size = self.vocab_size
        return f"ByteTokenizer(vocab_size={size}, specials: {specials})"


# From chapters/07-5-pretrained.md, section "GPT-2: every strategy, its loss, and speculative decoding".
#: The variables that switch the hub off (``transformers`` obeys them too).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
#: The kinds of problem: the hub switched off or out of reach, too slow to
#: answer, or a download that failed for another reason.
OFFLINE = "offline"
TOO_SLOW = "hub too slow"
FAILED = "download failed"


def _probe(url: str, timeout: float) -> tuple[str, str] | None:
    """None when ``url`` answers a HEAD request within ``timeout`` s, else
    ``(kind, detail)``."""
    outcome: list[tuple[str, str] | None] = []
    late = (TOO_SLOW, f"no answer in {timeout:g} s")

    def ask() -> None:
        request = urllib.request.Request(url, method="HEAD")
        try:
            urllib.request.urlopen(request, timeout=timeout).close()
            outcome.append(None)
        # an HTTP error is an answer too: the hub is reachable
        except urllib.error.HTTPError:
            outcome.append(None)
        # no name, no route, refused; or the socket's own timeout, which
        # urllib wraps (as the reason of a URLError) while connecting
        except (OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            timed_out = isinstance(reason, TimeoutError)
            outcome.append(late if timed_out else (OFFLINE, "no network"))

    # aside, so that a name lookup that hangs costs `timeout` seconds too
    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else late


def hub_problem(timeout: float = 3.0) -> tuple[str, str] | None:
    """None when the hub can be used now; else why not, as ``(kind,
    detail)``: ``("offline", "HF_HUB_OFFLINE=1")``, ``("offline", "no
    network")`` or ``("hub too slow", "no answer in 3 s")``.

    A set offline variable (:data:`OFFLINE_VARIABLES`) decides with no
    request; otherwise one HEAD request to ``HF_ENDPOINT`` (default
    https://huggingface.co, through the environment's proxies) must be
    answered within ``timeout`` s.
    """
    check.finite_float("timeout", timeout, low=0.0, low_open=True)
    for variable in OFFLINE_VARIABLES:
        value = os.environ.get(variable, "")
        if value.strip().lower() in ("1", "true", "yes", "on"):
            return OFFLINE, f"{variable}={value}"
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    return _probe(endpoint, timeout)


# From chapters/07-5-pretrained.md, section "GPT-2: every strategy, its loss, and speculative decoding".
#: huggingface_hub's waits for the hub, in seconds (10 by default).
HUB_TIMEOUTS = ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT")
# The errors that mean the hub was too slow, or out of reach: Python's,
# and those of each HTTP library huggingface_hub has used.
_SLOW = (
    "builtins.TimeoutError",  # socket.timeout is the same class
    "requests.exceptions.Timeout",
    "httpx.TimeoutException",
    "httpx2.TimeoutException",
)
_UNREACHABLE = (
    "builtins.ConnectionRefusedError",
    "socket.gaierror",  # no such name
    "requests.exceptions.ConnectionError",
    "httpx.ConnectError",
    "httpx2.ConnectError",
    "huggingface_hub.utils.OfflineModeIsEnabled",
)


def _classes(paths: Sequence[str]) -> tuple[type, ...]:
    """The classes named ``module.Class`` that this environment has."""
    found = []
    for path in paths:
        module, _, name = path.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # not installed, or renamed
            continue
    return tuple(found)


def _failure(error: BaseException) -> tuple[str, str]:
    """``(kind, detail)`` of a download that raised ``error``, from every
    link of its chain (the errors it was raised from, or while handling)."""
    chain, link = [], error
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    for kind, paths in ((TOO_SLOW, _SLOW), (OFFLINE, _UNREACHABLE)):
        classes = _classes(paths)
        found = [link for link in chain if isinstance(link, classes)]
        if found:
            return kind, type(found[0]).__name__
    for link in chain:  # an HTTP error says its status
        response = getattr(link, "response", None)
        status = getattr(response, "status_code", None)
        if isinstance(status, int):
            return FAILED, f"HTTP {status}"
    return FAILED, type(chain[-1]).__name__


@contextlib.contextmanager
def _hub_waits(seconds: float) -> Iterator[None]:
    """huggingface_hub's waits (:data:`HUB_TIMEOUTS`) at least ``seconds``
    while the context lasts."""
    try:
        from huggingface_hub import constants
    except ImportError:  # no transformers either: the download says so
        yield
        return
    names = [name for name in HUB_TIMEOUTS if hasattr(constants, name)]
    saved = {name: getattr(constants, name) for name in names}
    for name, value in saved.items():
        setattr(constants, name, max(value, seconds))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(constants, name, value)


# From chapters/07-5-pretrained.md, section "GPT-2: every strategy, its loss, and speculative decoding".
@dataclass
class Pretrained:
    """A hub model in our classes: ``model`` (eval mode), its ``tokenizer``
    (``transformers``' own, or a :class:`ByteTokenizer` offline; None for
    images), the hub ``name``, ``real`` (True: the published weights; False:
    random weights of the same configuration), the weights' ``source`` and
    ``licence``, ``labels`` (a classifier's class names; None offline) and
    ``notice``, the line :func:`load_pretrained` printed.
    """

    model: nn.Module
    tokenizer: Any
    name: str
    real: bool
    source: str
    licence: str
    labels: dict[int, str] | None = None
    notice: str = ""


def random_model(name: str) -> nn.Module:
    """Our model of ``name``: its published configuration, random weights
    (each model's own initialisation), in eval mode. Nothing is downloaded.
    """
    config = reference_config(name)
    if loader := _hub_loader(hub_model(name)):
        return loader.build(config).eval()
    read_config, _, model_class = REFERENCE_FAMILIES[config.model_type]
    cfg = read_config(config)
    if model_class is T5:
        return T5(cfg, start_id=config.decoder_start_token_id).eval()
    return model_class(cfg).eval()


def _download(model: HubModel, local_only: bool) -> tuple[nn.Module, Any]:
    """The reference model and its tokenizer, from the hub or
    (``local_only``) from the local cache; raises when they cannot be had.
    """
    import transformers

    verbosity = transformers.logging.get_verbosity()
    # not the warning that BERT's unused pre-training head was left out
    transformers.logging.set_verbosity_error()
    try:
        tokenizer = None
        if model.byte_tokens is not None:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                model.name, local_files_only=local_only
            )
        reference = getattr(transformers, model.reference).from_pretrained(
            model.name, local_files_only=local_only
        )
    finally:
        transformers.logging.set_verbosity(verbosity)
    return reference.float().eval(), tokenizer


def load_pretrained(
    name: str,
    *,
    device: torch.device | str | None = None,
    timeout: float = 3.0,
    verbose: bool = True,
) -> Pretrained:
    """``name``'s published weights in our classes; without them, random
    weights.

    ``name``: a key of :data:`PRETRAINED` or its last part (``"gpt2"``).
    With the hub usable (:func:`hub_problem`, which waits at most
    ``timeout`` s for its answer), ``transformers`` downloads the model and
    tokenizer, each request waiting at least ``timeout`` s too
    (:data:`HUB_TIMEOUTS`); otherwise it reads only its local cache. The
    model is converted by :func:`~lib.hf_weights.from_reference` (a ViT by
    the loader chapter 10 registers). When nothing could be loaded,
    the model is :func:`random_model`'s and the tokenizer a
    :class:`ByteTokenizer`. ``verbose`` prints one line saying which
    happened and, for random weights, why: ``offline (...)``, ``hub too
    slow (...)`` with a longer ``timeout`` to retry with, or ``download
    failed (...)``. The model goes to ``device`` (default: the CPU).
    """
    model = hub_model(name)
    problem = hub_problem(timeout)
    try:
        with _hub_waits(timeout):
            reference, tokenizer = _download(model, local_only=problem is not None)
    # nothing in the cache, or a download that failed
    except Exception as error:
        reference, tokenizer = None, None
        problem = problem or _failure(error)
    labels = None
    if reference is None:
        ours = random_model(model.name)
        if model.byte_tokens is not None:
            tokenizer = ByteTokenizer(**model.byte_tokens)
        tokens = "" if tokenizer is None else ", byte tokens"
        kind, detail = problem
        notice = f"{kind} ({detail}): random {model.short}{tokens}"
        notice += "; output is noise"
        if kind == TOO_SLOW:
            longer = max(30.0, 10 * timeout)
            retry = f"load_pretrained({model.short!r}, timeout={longer:g})"
            notice += f"; to wait longer: {retry}"
        source = f"random weights in the configuration of {model.name}"
    else:
        if loader := _hub_loader(model):
            ours = loader.convert(loader.build(reference.config), reference)
            ours = ours.eval()
            if loader.labels:
                labels = dict(reference.config.id2label)
        else:
            ours = from_reference(reference)
        cached = " (local cache)" if problem else ""
        notice = f"{model.name}: published weights{cached}, {model.licence}"
        source = f"huggingface.co/{model.name}: {model.source}"
    if verbose:
        print(notice)
    if device is not None:
        ours = ours.to(get_device(str(device)))
    real = reference is not None
    return Pretrained(
        ours, tokenizer, model.name, real, source, model.licence, labels, notice
    )


# From chapters/07-5-pretrained.md, section "GPT-2: every strategy, its loss, and speculative decoding".
@dataclass(frozen=True)
class HubLoader:
    """How a later chapter loads the hub models of one configuration class:
    ``build(config)``, our model (random weights) from a ``transformers``
    configuration; ``convert(ours, reference)``, ``ours`` with the weights
    of the ``transformers`` model ``reference``; ``labels``: a classifier,
    whose class names :class:`Pretrained` keeps."""

    build: Callable[[Any], nn.Module]
    convert: Callable[[nn.Module, nn.Module], nn.Module]
    labels: bool = False


#: The loaders later chapters register, by ``HubModel.config_class``.
HUB_LOADERS: dict[str, HubLoader] = {}


def register_hub_loader(config_class: str, loader: HubLoader) -> None:
    """Load the hub models of ``config_class`` (``"ViTConfig"``) with
    ``loader`` (chapter 10 registers its ViT's)."""
    check.string("config_class", config_class, owner="register_hub_loader")
    check.instance("loader", loader, HubLoader, owner="register_hub_loader")
    HUB_LOADERS[config_class] = loader


def _hub_loader(model: HubModel) -> HubLoader | None:
    """The registered loader of ``model`` (None: a text model, converted by
    :func:`~lib.hf_weights.from_reference`), importing the module its entry
    names if it has not registered yet."""
    if model.loader is None:
        return None
    if model.config_class not in HUB_LOADERS:
        importlib.import_module(model.loader)  # it registers on import
    if model.config_class not in HUB_LOADERS:
        raise RuntimeError(
            f"{model.loader} registered no loader for {model.config_class}"
        )
    return HUB_LOADERS[model.config_class]


# From chapters/07-5-pretrained.md, section "One model file, and the checkpoints that ship with the course".
def pack_model(
    model: nn.Module,
    tokenizer: Any = None,
    *,
    metadata: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """What a model file holds (:func:`save_model` writes it; lib.training's
    checkpoints hold one under ``"model"``): ``format``, ``kind`` (a name in
    :data:`MODEL_KINDS`, or None for a module no kind registers: then only
    its weights can be loaded, into a model built by hand), ``module``,
    ``class``, ``config`` (the model's ``cfg`` as a dict), ``arguments``,
    ``state_dict`` (on the CPU; floating tensors in ``dtype``, default
    their own), ``dtype``, ``tokenizer`` (a
    :class:`~lib.tokenizer.CharTokenizer` or
    :class:`~lib.tokenizer.BPETokenizer`, stored as plain data),
    ``metadata`` and ``sha256``, a digest of all the rest."""
    check.instance("model", model, nn.Module, what="a torch.nn.Module")
    kind = model_kind(model)
    config, arguments = _config_of(model), _arguments_of(model, kind)
    packed = dict(format=MODEL_FORMAT, kind=kind and kind.name)
    packed["module"] = kind and (kind.module or kind.model_class.__module__)
    packed["class"] = type(model).__name__  # for messages
    packed |= dict(
        config=plain_values(config, "config"),
        arguments=plain_values(arguments, "arguments"),
        tokenizer=_tokenizer_state(tokenizer),
        metadata=plain_values(dict(metadata or {}), "metadata"),
    )
    packed["state_dict"], packed["dtype"] = _stored_state(model, dtype)
    packed["sha256"] = content_sha256(packed)
    return packed


# From chapters/07-5-pretrained.md, section "One model file, and the checkpoints that ship with the course".
def plain_values(value: Any, where: str) -> Any:
    """``value`` made of what ``torch.load(weights_only=True)`` reads back:
    tensors, numbers, strings, lists, tuples and dicts. NumPy numbers become
    Python numbers, arrays tensors, paths strings; anything else is a
    :class:`ModelFileError` naming ``where`` it is, raised before a file
    that could not be loaded is written."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, PurePath):
        return str(value)
    plain = bool | int | float | str | torch.Tensor
    if value is None or isinstance(value, plain):
        return value
    if isinstance(value, Mapping):
        return {k: plain_values(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [plain_values(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise ModelFileError(
        f"cannot save {where}, a {type(value).__name__} ({value!r:.60}): a "
        "model file holds tensors, numbers, strings, lists and dicts only "
        "(weights_only loading)"
    )


def _stored_state(
    model: nn.Module, dtype: torch.dtype | None
) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict on the CPU, its floating tensors in ``dtype`` (None:
    their own), each tied tensor once (its names share one stored tensor);
    and the name of the floating dtype ("mixed" if several)."""
    state = model.state_dict()

    def key(t: torch.Tensor) -> tuple:
        return t.data_ptr(), tuple(t.shape), t.stride(), t.device

    unique = {key(t): t for t in state.values()}
    stored = {
        k: t.detach().to("cpu", dtype if t.is_floating_point() else t.dtype)
        for k, t in unique.items()
    }
    floats = {t.dtype for t in stored.values() if t.is_floating_point()}
    name = str(floats.pop()).split(".")[-1] if len(floats) == 1 else "mixed"
    return {n: stored[key(t)] for n, t in state.items()}, name


def _tokenizer_state(tokenizer: Any) -> dict[str, Any] | None:
    check.instance(
        "tokenizer",
        tokenizer,
        (CharTokenizer, BPETokenizer, type(None)),
        what="a CharTokenizer, a BPETokenizer or None",
    )
    if isinstance(tokenizer, CharTokenizer):
        return dict(type="char", chars=list(tokenizer.chars))
    if isinstance(tokenizer, BPETokenizer):
        return dict(type="bpe", **tokenizer.to_dict())
    return None


def _config_of(model: nn.Module) -> dict[str, Any] | None:
    """``model.cfg`` as a dict (None: no dataclass ``cfg``)."""
    cfg = getattr(model, "cfg", None)
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else None


def _arguments_of(model: nn.Module, kind: ModelKind | None) -> dict:
    return dict(kind.arguments(model)) if kind and kind.arguments else {}


def _differences(
    saved: Mapping[str, Any] | None,
    now: Mapping[str, Any] | None,
    skip: Sequence[str],
    what: str,
    source: str,
) -> list[str]:
    """``what`` fields that differ between two dicts, ``skip`` left out."""
    if saved is None or now is None:
        return []
    absent = "(absent)"
    return [
        f"{what}{k}: {saved.get(k, absent)!r} in {source}, {now.get(k, absent)!r} now"
        for k in sorted(saved.keys() | now.keys())
        if k not in skip and saved.get(k, absent) != now.get(k, absent)
    ]


def packed_differences(
    packed: Mapping[str, Any],
    model: nn.Module,
    *,
    strict: bool = True,
    source: str = "the file",
) -> list[str]:
    """How a model file (called ``source`` in the messages) differs from
    ``model``, in words: with ``strict``, the kind, and every field of the
    configuration and the arguments that changes what the weights mean (the
    kind's ``runtime`` fields, such as ``attn_backend`` and ``dropout``,
    may differ); always, the state dict's missing and unexpected keys and
    its shapes (five of each)."""
    problems = []
    kind = model_kind(model)
    runtime = kind.runtime if kind else RUNTIME_FIELDS
    if strict:
        own, saved_kind = kind and kind.name, packed["kind"]
        if None not in (own, saved_kind) and own != saved_kind:
            problems.append(f"kind: {saved_kind!r} in {source}, {own!r} now")
        config = plain_values(_config_of(model), "config")
        arguments = _arguments_of(model, kind)
        saved_arguments = packed.get("arguments") or {}
        problems += _differences(packed["config"], config, runtime, "", source)
        problems += _differences(
            saved_arguments, arguments, runtime, "argument ", source
        )
    saved, own_state = packed["state_dict"], model.state_dict()
    found = {
        "missing keys": [k for k in own_state if k not in saved],
        "unexpected keys": [k for k in saved if k not in own_state],
        "shape mismatches": [
            f"{k} {tuple(saved[k].shape)} in {source}, {tuple(v.shape)} in the model"
            for k, v in own_state.items()
            if k in saved and v.shape != saved[k].shape
        ],
    }
    problems += [
        f"{what}: {', '.join(items[:5])}"
        + (f" (and {len(items) - 5} more)" if len(items) > 5 else "")
        for what, items in found.items()
        if items
    ]
    # names the model ties (one Parameter) must hold one value in the file:
    # loading would otherwise write one over the other
    names_of: dict[int, list[str]] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        names_of.setdefault(id(tensor), []).append(key)
    for names in names_of.values():
        stored = [saved[k] for k in names if k in saved]
        if any(
            t.shape != stored[0].shape or not torch.equal(t, stored[0])
            for t in stored[1:]
        ):
            problems.append(
                f"tied weights {', '.join(names)} hold different values in "
                f"{source}: the model ties them, the saved one did not"
            )
    return problems


# From chapters/07-5-pretrained.md, section "One model file, and the checkpoints that ship with the course".
def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj)`` to ``path`` atomically: into a temporary file of
    the same folder, flushed to disk, then renamed, so that ``path`` is
    never half-written. The stale temporaries of killed saves in that folder
    go first (:func:`remove_stale_temporaries`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # a file object: the archive inside is named "archive", not after
        # the temporary, so the same content makes the same bytes
        with open(temporary, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())  # on disk before the name points at it
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return path


def save_model(
    path: str | os.PathLike, model: nn.Module, tokenizer: Any = None, **metadata: Any
) -> Path:
    """Write ``model``, its ``tokenizer`` and ``metadata`` to one file
    (atomically), which :func:`load_model` reads back; returns its path.

    ``model``: a model of a kind in :data:`MODEL_KINDS` (GPT, BERT,
    SequenceClassifier, T5; chapter 10 adds ViT); ``tokenizer``: a
    :class:`~lib.tokenizer.CharTokenizer`, a
    :class:`~lib.tokenizer.BPETokenizer` or None; ``metadata``: plain
    values (numbers, strings, lists, dicts, tensors). The file holds
    :func:`pack_model`'s dict: the kind, the configuration, the weights
    (their own dtype), the tokenizer, the metadata and a sha256 of it all.
    """
    if model_kind(model) is None:
        known = ", ".join(k.model_class.__name__ for k in MODEL_KINDS.values())
        raise TypeError(
            f"save_model takes a model of a registered kind ({known}), got "
            f"{type(model).__name__}"
        )
    packed = pack_model(model, tokenizer, metadata=metadata)
    return atomic_save(packed, path)


# From chapters/07-5-pretrained.md, section "One model file, and the checkpoints that ship with the course".
def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (True when unsure)."""
    if os.name == "nt":  # os.kill would end it there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporaries ``.NAME.PID.tmp`` that :func:`atomic_save`
    left in ``directory`` when its process was killed mid-write (a process
    that still runs keeps its own); returns those deleted."""
    removed = []
    for path in Path(directory).glob(".*.tmp"):
        pid = path.name.removesuffix(".tmp").rpartition(".")[2]
        if pid.isdigit() and not _alive(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


# From chapters/07-5-pretrained.md, section "One model file, and the checkpoints that ship with the course".
def save_shipped(
    model: nn.Module,
    name: str,
    *,
    tokenizer: Any = None,
    metrics: Mapping[str, Any] | None = None,
    record: str | None = None,
    command: str | None = None,
    inputs: Mapping[str, Any] | None = None,
    directory: str | os.PathLike = CHECKPOINTS,
) -> Path:
    """Write ``model`` as the model file ``directory/<name>.pt`` and record
    it in the manifest; returns the path.

    The file is :func:`save_model`'s (float16 weights above
    :data:`FP32_LIMIT` float32 bytes), with the metadata ``name``,
    ``inputs`` (JSON values: what a user must do to the inputs, such as
    normalising images), ``record`` (the run's record) and ``command``
    (what trained it, relative to the project:
    :func:`lib.utils.relative_command`). The manifest records those too,
    with the file's sha256 and size, the kind, the parameter count and
    ``metrics`` (JSON values), which stay out of the file: re-measuring them
    leaves the file's bytes as they are.
    """
    if (kind := model_kind(model)) is None:
        got = type(model).__name__
        raise TypeError(f"save_shipped takes a registered kind, got {got}")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", check.string("name", name)):
        raise ValueError(f"name: lower-case letters, digits, - and ., got {name!r}")
    _tokenizer_state(tokenizer)  # a tokenizer it cannot hold fails here
    about = dict(
        name=name,
        record=record,
        # no path of this machine (lib.utils.relative_command)
        command=None if command is None else relative_command(command),
        inputs=dict(inputs or {}),
    )
    entry = dict(kind=kind.name, parameters=count_parameters(model))
    entry |= dict(about, metrics=dict(metrics or {}))
    del entry["name"]
    # a value that JSON cannot hold fails here, before anything is written
    json.dumps(entry)
    unique = {p.data_ptr(): p for p in model.state_dict().values()}
    fp32_bytes = sum(4 * t.numel() for t in unique.values())
    half = torch.float16 if fp32_bytes > FP32_LIMIT else None
    packed = pack_model(model, tokenizer, metadata=about, dtype=half)
    path = atomic_save(packed, Path(directory) / f"{name}.pt")
    entry |= dict(file=path.name, sha256=sha256_file(path))
    entry |= dict(bytes=path.stat().st_size, dtype=packed["dtype"])
    manifest = _manifest(path.parent) | {name: entry}
    text = json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False)
    (path.parent / MANIFEST).write_text(text + "\n", encoding="utf-8")
    return path
