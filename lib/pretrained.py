# This file is generated from chapters/07-5-pretrained.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/07-5-pretrained.md, section "The models at work".
"""Pretrained weights in the course's own classes, and the checkpoints the
course ships (chapter 7).

* :func:`load_pretrained` takes a hub name from :data:`PRETRAINED` (GPT-2
  small, DistilGPT2, BERT-base, T5-small, ViT-B/16), loads the published
  model and its tokenizer with ``transformers`` and returns ours,
  converted by :func:`lib.hf_weights.from_reference`
  or by the loader a later chapter registers (:func:`register_hub_loader`:
  chapter 10's ViT). When the hub cannot be used
  (:func:`hub_problem`: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set,
  no network, or no answer within a few seconds) it reads the local cache,
  and failing that builds the same configuration with random weights
  (:func:`random_model`) and a :class:`ByteTokenizer`, and says in one line
  why: offline, the hub too slow (and how to wait longer), or a download
  that failed.
* :func:`save_shipped`, :func:`load_shipped`, :func:`shipped_names`: small
  trained models that ship in ``lib/data/checkpoints/``, each a model file
  of :mod:`lib.model_file` checked against the sha256 digest that
  ``manifest.json`` records with its size and metrics.

Both loaders return a :class:`~lib.model_file.LoadedModel`, as
:func:`lib.model_file.load_model` does.

``transformers`` is imported only by the functions that need it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lib import _checks as check
from lib.datasets import DATA_DIR, ChecksumError, sha256_file
from lib.hf_weights import REFERENCE_FAMILIES, from_reference
from lib.model_file import (
    LoadedModel,
    atomic_save,
    load_model,
    model_kind,
    pack_model,
    tokenizer_state,
)
from lib.models import T5, count_parameters
from lib.utils import get_device, relative_command

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "CHECKPOINTS",
    "MANIFEST",
    "FP32_LIMIT",
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
    "random_model",
    "load_pretrained",
    "HubLoader",
    "HUB_LOADERS",
    "register_hub_loader",
    "save_shipped",
]


# From chapters/07-5-pretrained.md, section "The models at work".
#: The folder of the checkpoints that ship with the course.
CHECKPOINTS = DATA_DIR / "checkpoints"
#: The manifest: each checkpoint's file, sha256, size, metrics, command.
MANIFEST = "manifest.json"
#: Checkpoints with more float32 weight bytes than this are kept in fp16.
FP32_LIMIT = 10_000_000


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
) -> LoadedModel:
    """A shipped checkpoint by name: its file's sha256 checked against the
    manifest, then read by :func:`~lib.model_file.load_model` (the model in
    eval mode on ``device``, default the CPU, and its tokenizer), with its
    ``name`` and ``entry`` in the manifest.

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
    return dataclasses.replace(saved, name=name, entry=entry)


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
) -> LoadedModel:
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
    failed (...)``. The model goes to ``device`` (default: the CPU), in a
    :class:`~lib.model_file.LoadedModel`.
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
    kind = model_kind(ours)
    return LoadedModel(
        ours,
        tokenizer,
        kind=kind and kind.name,
        config=getattr(ours, "cfg", None),
        name=model.name,
        real=reference is not None,
        source=source,
        licence=model.licence,
        labels=labels,
        notice=notice,
    )


# From chapters/07-5-pretrained.md, section "GPT-2: every strategy, its loss, and speculative decoding".
@dataclass(frozen=True)
class HubLoader:
    """How a later chapter loads the hub models of one configuration class:
    ``build(config)``, our model (random weights) from a ``transformers``
    configuration; ``convert(ours, reference)``, ``ours`` with the weights
    of the ``transformers`` model ``reference``; ``labels``: a classifier,
    whose class names :class:`~lib.model_file.LoadedModel` keeps."""

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
    tokenizer_state(tokenizer)  # a tokenizer it cannot hold fails here
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
