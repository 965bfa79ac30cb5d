# This file is generated from chapters/07-5-pretrained.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/07-5-pretrained.md, section "The models at work".
"""One file for a trained model (chapter 7): its kind, configuration,
weights, tokenizer and metadata, and a sha256 of it all.

* :func:`save_model` writes one (atomically: :func:`atomic_save`), and
  :func:`load_model` reads it back in one call as a :class:`LoadedModel`,
  the type every loader of the course returns.
* :data:`MODEL_KINDS`: the classes a file rebuilds (GPT, BERT,
  SequenceClassifier, T5; chapter 10 adds its ViT,
  :func:`register_model_kind`).
* :func:`pack_model`, :func:`check_packed`, :func:`packed_differences`,
  :func:`plain_values`: what :mod:`lib.training`'s checkpoints, each
  around one model file, are built on.

It imports nothing of the hub (:mod:`lib.pretrained`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch
from torch import nn

from lib import _checks as check
from lib.models import BERT, GPT, T5, SequenceClassifier, TransformerConfig
from lib.tokenizer import BPETokenizer, CharTokenizer
from lib.utils import get_device

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
    "tokenizer_from_state",
    "packed_differences",
    "LoadedModel",
    "unpack_model",
    "load_model",
    "pack_model",
    "plain_values",
    "tokenizer_state",
    "atomic_save",
    "save_model",
    "remove_stale_temporaries",
]


# From chapters/07-5-pretrained.md, section "The models at work".
#: What a model file calls its format (the name it had in lib.pretrained).
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
    register_model_kind(replace(_kind, module="lib.model_file"))


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


def tokenizer_from_state(
    state: Mapping[str, Any] | None, where: str = "the model file"
) -> Any:
    """The tokenizer that :func:`tokenizer_state` stored (None: none); a
    BPE of another format is a :class:`ModelFileError` naming ``where``."""
    if state is None:
        return None
    if state["type"] == "char":
        return CharTokenizer("".join(state["chars"]))
    expected = BPETokenizer().to_dict()
    for field in ("format", "version", "pattern"):
        if state.get(field) != expected[field]:
            got = state.get(field)
            raise ModelFileError(
                f"{where}: its BPE tokenizer has another {field}: {got!r}"
            )
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
            f"lib.model_file.MODEL_KINDS ({known}); load the weights into "
            "a model built by hand (lib.training.load_checkpoint)"
        )
    return MODEL_KINDS[name]


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


@dataclass
class LoadedModel:
    """A model loaded, with what came with it: what :func:`load_model`,
    :func:`lib.pretrained.load_shipped` and
    :func:`lib.pretrained.load_pretrained` return, each filling what it
    knows. Always ``model`` (eval mode), its ``tokenizer`` (a file's
    CharTokenizer or BPETokenizer, the hub's own or a ByteTokenizer; None:
    it reads no text), ``kind`` (in :data:`MODEL_KINDS`) and ``config``.
    From a file: ``metadata``, ``sha256`` (of its content), ``dtype`` (of
    the stored weights), ``path``. Shipped: ``name`` and ``entry``, its
    record in the manifest (``file``, ``sha256``, ``bytes``, ``kind``,
    ``dtype``, ``parameters``, ``metrics``, ``record``, ``command``, and
    ``inputs``: how to prepare what the model reads, such as a ViT's pixel
    mean and std). From the hub: ``name``, ``real`` (False: random weights
    of the same configuration), ``source``, ``licence``, ``labels`` (a
    classifier's class names; None offline) and ``notice``, the line
    :func:`~lib.pretrained.load_pretrained` printed."""

    model: nn.Module
    tokenizer: Any = None
    kind: str | None = None
    config: Any = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    sha256: str | None = None
    dtype: str | None = None
    path: Path | None = None
    name: str | None = None
    entry: dict[str, Any] = dataclasses.field(default_factory=dict)
    real: bool = True
    source: str = ""
    licence: str = ""
    labels: dict[int, str] | None = None
    notice: str = ""


def unpack_model(
    packed: Mapping[str, Any],
    *,
    device: torch.device | str | None = None,
    where: str = "the model file",
    **runtime: Any,
) -> LoadedModel:
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
    # the weights against the model their configuration builds (keys,
    # shapes, tied matrices), all of them before any is loaded
    problems = packed_differences(packed, model, strict=False, source=where)
    if problems:
        raise ModelFileError(
            f"{where} does not fit the {kind.name} its configuration "
            f"builds: {' | '.join(problems)}"
        )
    model.load_state_dict(packed["state_dict"])
    # get_device names a device this machine lacks, in words
    model = model.to("cpu" if device is None else get_device(str(device)))
    return LoadedModel(
        model.eval(),
        tokenizer_from_state(packed["tokenizer"], where),
        kind=kind.name,
        config=cfg,
        metadata=dict(packed["metadata"]),
        sha256=packed["sha256"],
        dtype=packed["dtype"],
    )


def load_model(
    path: str | os.PathLike, *, device: torch.device | str | None = None, **runtime: Any
) -> LoadedModel:
    """The model of a file of :func:`save_model` (or of a file that holds
    one under ``"model"``: a :mod:`lib.training` checkpoint), in one call:
    the model rebuilt from its kind and configuration, in eval mode on
    ``device`` (default: the CPU), with its weights, tokenizer, metadata and
    sha256 (verified) in a :class:`LoadedModel`.

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
        tokenizer=tokenizer_state(tokenizer),
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


def tokenizer_state(tokenizer: Any) -> dict[str, Any] | None:
    """``tokenizer`` as plain data, what a model file holds (None: none);
    :func:`tokenizer_from_state` rebuilds it."""
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


# From chapters/07-5-pretrained.md, section "One model file, and the checkpoints that ship with the course".
def _check_registered(model: nn.Module) -> None:
    """:func:`save_model` takes a model of a kind in :data:`MODEL_KINDS`."""
    if model_kind(model) is None:
        known = ", ".join(k.model_class.__name__ for k in MODEL_KINDS.values())
        raise TypeError(
            f"save_model takes a model of a registered kind ({known}), got "
            f"{type(model).__name__}"
        )


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
    _check_registered(model)
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
