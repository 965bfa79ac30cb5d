"""Unit tests of lib.pretrained, all offline (no test touches the network).

* The loading path at the published shapes. ``transformers``' configuration classes give
  each model's published sizes with no download (GPT-2 small, DistilGPT2, BERT-base,
  T5-small, ViT-B/16). The whole conversion table is checked at full depth on a state
  dict of zeros of the reference's shapes (the reference is built on the meta device, and
  the zeros are one broadcast element each: no memory, no initialisation). Outputs are
  compared on random weights through ``load_pretrained``'s own online branch (only the
  download is replaced), with the published widths, vocabularies, heads and positions but
  two blocks per stack instead of 6 to 12, which keeps the test to seconds on a CPU.
* Why the published weights could not be had, in the one line printed: an offline
  variable or no network ("offline"), a probe or a download that timed out ("hub too
  slow", with the longer ``timeout`` to retry with, which also raises huggingface_hub's
  own waits), any other failure ("download failed"). The download's errors are the
  classes that huggingface_hub and its HTTP library raise (requests before
  huggingface_hub 1.0, httpx or httpx2 after), chained as ``transformers`` chains them;
  those a version lacks are skipped. Random weights of the same configuration.
* Shipped checkpoints in a temporary folder: round trips, float16, and the errors for a
  missing, unknown or altered file.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
import transformers
from huggingface_hub.utils import LocalEntryNotFoundError, OfflineModeIsEnabled

from lib import pretrained
from lib.datasets import ChecksumError, sha256_file
from lib.hf_weights import REFERENCE_FAMILIES
from lib.model_file import LoadedModel
from lib.models import GPT, T5, TransformerConfig, count_parameters
from lib.pretrained import (
    PRETRAINED,
    ByteTokenizer,
    hub_model,
    hub_problem,
    load_pretrained,
    load_shipped,
    random_model,
    reference_config,
    save_shipped,
    shipped_names,
)
from lib.tokenizer import CharTokenizer
from lib.vit import ViT, ViTConfig, config_from_vit, vit_state_dict

transformers.logging.set_verbosity_error()

#: Two blocks per stack; every other size as published.
TWO_BLOCKS = {
    "openai-community/gpt2": dict(n_layer=2),
    "distilbert/distilgpt2": dict(n_layer=2),
    "google-bert/bert-base-uncased": dict(num_hidden_layers=2),
    "google-t5/t5-small": dict(num_layers=2, num_decoder_layers=2),
    "google/vit-base-patch16-224": dict(num_hidden_layers=2),
}


@pytest.fixture
def online(monkeypatch):
    """The hub 'answers' (the probe says so); no offline variable is set."""
    for variable in pretrained.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(pretrained, "_probe", lambda url, timeout: None)


@pytest.fixture
def no_network(monkeypatch):
    """The probe fails and the local cache is empty: every download raises."""
    for variable in pretrained.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(
        pretrained, "_probe", lambda url, timeout: ("offline", "no network")
    )
    asked = []

    def download(model, local_only):
        asked.append(local_only)
        raise OSError(f"{model.name} is not in the local cache")

    monkeypatch.setattr(pretrained, "_download", download)
    return asked


def _ours_on_meta(name: str, config) -> torch.nn.Module:
    with torch.device("meta"):
        if hub_model(name).config_class == "ViTConfig":
            return ViT(config_from_vit(config))
        read_config, _, model_class = REFERENCE_FAMILIES[config.model_type]
        return model_class(read_config(config))


# ---------------------------------------------------------------------------- the table


def test_hub_names_and_their_short_forms():
    assert hub_model("gpt2") is PRETRAINED["openai-community/gpt2"]
    assert hub_model("google-t5/t5-small").short == "t5-small"
    with pytest.raises(
        ValueError, match="no pretrained model 'gpt5'.*openai-community"
    ):
        hub_model("gpt5")


def test_reference_config_has_the_published_sizes():
    gpt2 = reference_config("gpt2")
    assert (gpt2.n_layer, gpt2.n_embd, gpt2.n_head, gpt2.vocab_size) == (
        12,
        768,
        12,
        50257,
    )
    assert reference_config("distilgpt2").n_layer == 6
    t5 = reference_config("t5-small")
    assert (t5.d_model, t5.d_ff, t5.num_layers, t5.num_heads, t5.vocab_size) == (
        512,
        2048,
        6,
        8,
        32128,
    )
    assert t5.relative_attention_num_buckets == 32 and not t5.is_gated_act
    vit = reference_config("vit-base-patch16-224")
    assert (vit.hidden_size, vit.patch_size, vit.image_size, vit.num_labels) == (
        768,
        16,
        224,
        1000,
    )
    assert reference_config("gpt2", n_layer=2).n_layer == 2  # overrides


@pytest.mark.parametrize("name", list(PRETRAINED))
def test_the_published_shapes_convert_at_full_depth(name):
    """Every key of the full-size reference fills ours, with its shape; and the size the
    table states ("124M parameters") is our model's, to within a million."""
    model = PRETRAINED[name]
    config = reference_config(name)
    with torch.device("meta"):
        reference = getattr(transformers, model.reference)(config)
    zero = torch.zeros(())
    zeros = {k: zero.expand(t.shape) for k, t in reference.state_dict().items()}
    ours = _ours_on_meta(name, config)
    if model.config_class == "ViTConfig":
        converted = vit_state_dict(zeros, ours.cfg)
    else:
        converted = REFERENCE_FAMILIES[config.model_type][1](zeros, ours.cfg)
    expected = {k: t.shape for k, t in ours.state_dict().items()}
    assert {k: t.shape for k, t in converted.items()} == expected
    stated = int(re.search(r"(\d+)M parameters", model.source).group(1))
    assert abs(count_parameters(ours) / 1e6 - stated) < 1, (
        name,
        count_parameters(ours),
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PRETRAINED))
def test_online_branch_gives_the_references_outputs(name, online, monkeypatch, capsys):
    model = PRETRAINED[name]
    torch.manual_seed(0)
    reference = getattr(transformers, model.reference)(
        reference_config(name, **TWO_BLOCKS[name])
    )
    with torch.no_grad():  # no norm weight 1 and no bias 0 left: all are checked
        for parameter in reference.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    reference.eval()
    # _download gives no tokenizer for a model that takes no text
    tokenizer = None if model.byte_tokens is None else object()
    monkeypatch.setattr(
        pretrained, "_download", lambda m, local_only: (reference, tokenizer)
    )
    loaded = load_pretrained(name)
    assert loaded.real and loaded.name == name and loaded.licence == model.licence
    notice = f"{name}: published weights, {model.licence}"
    assert capsys.readouterr().out == notice + "\n" and loaded.notice == notice
    assert loaded.source == f"huggingface.co/{name}: {model.source}"
    assert not loaded.model.training
    vocab = getattr(reference.config, "vocab_size", 1)  # a ViT reads no ids
    ids = torch.randint(0, vocab, (2, 7))
    with torch.no_grad():
        if model.config_class == "ViTConfig":
            images = torch.randn(2, 3, 224, 224)
            ours, theirs = loaded.model(images), reference(pixel_values=images).logits
            assert loaded.labels == dict(reference.config.id2label)
        elif model.config_class == "T5Config":
            targets = torch.cat([torch.zeros(2, 1, dtype=torch.long), ids[:, :4]], 1)
            ours = loaded.model(ids, targets)
            theirs = reference(input_ids=ids, decoder_input_ids=targets).logits
        else:
            ours, theirs = loaded.model(ids), reference(ids).logits
    assert loaded.tokenizer is tokenizer
    if model.config_class != "ViTConfig":
        assert loaded.labels is None
    assert (ours - theirs).abs().max() < 1e-4


# --------------------------------------------------------------------- the offline path


def test_an_offline_variable_decides_without_a_request(monkeypatch):
    def no_request(url, timeout):
        raise AssertionError("the hub was asked although an offline variable is set")

    monkeypatch.setattr(pretrained, "_probe", no_request)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_problem() == ("offline", "HF_HUB_OFFLINE=1")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "true")
    assert hub_problem() == ("offline", "TRANSFORMERS_OFFLINE=true")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")  # not set to a true value
    with pytest.raises(AssertionError, match="the hub was asked"):
        hub_problem()


def test_the_probe_asks_the_endpoint_and_obeys_the_timeout(monkeypatch):
    for variable in pretrained.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    asked = []
    monkeypatch.setattr(pretrained, "_probe", lambda url, t: asked.append((url, t)))
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example")
    assert hub_problem(0.5) is None and asked == [("https://mirror.example", 0.5)]
    with pytest.raises(ValueError, match="timeout"):
        hub_problem(0)


def test_a_hanging_probe_gives_up_after_its_timeout(monkeypatch):
    release = threading.Event()

    def hang(request, timeout):  # a name lookup that never returns
        release.wait(60)
        raise OSError("released")

    monkeypatch.setattr(urllib.request, "urlopen", hang)
    start = time.perf_counter()
    try:
        assert pretrained._probe("https://huggingface.co", 0.2) == (
            "hub too slow",
            "no answer in 0.2 s",
        )
        assert (
            time.perf_counter() - start < 10
        )  # the timeout, not the minute of hanging
    finally:
        release.set()


def test_a_refused_connection_is_no_network_and_an_http_error_an_answer(monkeypatch):
    # port 9 (discard) of this machine: nothing listens there, the connection is refused
    assert pretrained._probe("http://127.0.0.1:9", 2.0) == ("offline", "no network")

    def forbidden(request, timeout):
        raise urllib.error.HTTPError(request.full_url, 403, "Forbidden", {}, None)

    monkeypatch.setattr(urllib.request, "urlopen", forbidden)
    assert pretrained._probe("https://huggingface.co", 2.0) is None


@pytest.mark.parametrize(
    "timed_out",
    [
        urllib.error.URLError(TimeoutError("timed out")),  # while connecting
        TimeoutError("The read operation timed out"),  # while reading the answer
    ],
    ids=["connecting", "reading"],
)
def test_a_probe_that_times_out_says_the_hub_is_too_slow(timed_out, monkeypatch):
    def slow(request, timeout):
        raise timed_out

    monkeypatch.setattr(urllib.request, "urlopen", slow)
    assert pretrained._probe("https://huggingface.co", 2.0) == (
        "hub too slow",
        "no answer in 2 s",
    )


def test_offline_gives_random_weights_of_the_configuration_and_one_line(
    no_network, capsys
):
    loaded = load_pretrained("distilgpt2")
    assert no_network == [True]  # offline, only the local cache was asked
    printed = capsys.readouterr().out
    assert printed == (
        "offline (no network): random distilgpt2, byte tokens; output is noise\n"
    )
    assert not loaded.real and loaded.notice == printed.strip()
    assert loaded.labels is None and "random weights" in loaded.source
    assert loaded.licence == "Apache-2.0"
    cfg = loaded.model.cfg
    # the one loaded-model type, as load_model and load_shipped return it
    assert type(loaded) is LoadedModel and loaded.kind == "gpt" and loaded.config is cfg
    assert isinstance(loaded.model, GPT) and not loaded.model.training
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.vocab_size, cfg.max_len) == (
        6,
        768,
        12,
        50257,
        1024,
    )
    tokenizer = loaded.tokenizer
    assert isinstance(tokenizer, ByteTokenizer) and tokenizer.eos_token_id == 50256
    ids = torch.tensor(tokenizer.encode("To be, or not"))
    with torch.no_grad():
        logits = loaded.model(ids[None])
    assert logits.shape == (1, len(ids), 50257) and logits.isfinite().all()


def test_a_failed_download_online_falls_back_and_says_why(online, monkeypatch, capsys):
    def refused(model, local_only):
        assert not local_only  # online: a real download was tried
        raise ConnectionResetError("reset by peer")

    monkeypatch.setattr(pretrained, "_download", refused)
    tiny = ViT(ViTConfig(image_size=16, patch_size=8, n_classes=3, d_model=8))
    monkeypatch.setattr(pretrained, "random_model", lambda name: tiny)
    loaded = load_pretrained("google/vit-base-patch16-224", verbose=True)
    assert not loaded.real and loaded.model is tiny and loaded.tokenizer is None
    assert capsys.readouterr().out == (
        "download failed (ConnectionResetError): random vit-base-patch16-224; "
        "output is noise\n"
    )


def test_hf_hub_offline_reads_only_the_cache(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    asked = []

    def cached(model, local_only):
        asked.append(local_only)
        raise OSError("not cached")

    monkeypatch.setattr(pretrained, "_download", cached)
    monkeypatch.setattr(pretrained, "random_model", lambda name: torch.nn.Identity())
    loaded = load_pretrained("bert-base-uncased", verbose=False)
    assert asked == [True] and not loaded.real and capsys.readouterr().out == ""
    assert loaded.notice == (
        "offline (HF_HUB_OFFLINE=1): random bert-base-uncased, byte tokens; "
        "output is noise"
    )
    assert loaded.tokenizer.mask_token_id == 103


def _as_transformers_raises(root: BaseException, *, cause: bool = True) -> OSError:
    """``root`` as ``transformers`` reports it: its own ``OSError``, raised from
    huggingface_hub's ``LocalEntryNotFoundError`` (``cause``: ``raise ... from``),
    itself raised from ``root``; or (not ``cause``) raised while handling ``root``, as
    transformers 4.46 reports an HTTP error."""
    if not cause:
        wrapped = OSError("There was a specific connection error")
        wrapped.__context__ = root
        return wrapped
    hub = LocalEntryNotFoundError("cannot find the requested files in the local cache")
    hub.__cause__ = root
    wrapped = OSError("We couldn't connect to 'https://huggingface.co'")
    wrapped.__cause__ = hub
    return wrapped


def _module(*names):
    """The first of the modules ``names`` that is installed, or None."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


# huggingface_hub's HTTP library: requests before 1.0, httpx in 1.x, httpx2 from 2.0
# (each test below runs with those installed)
REQUESTS, HTTPX = _module("requests"), _module("httpx2", "httpx")


def _http_status_error(status: int):
    if REQUESTS is not None:
        response = REQUESTS.Response()
        response.status_code = status
        return REQUESTS.HTTPError(f"{status} Server Error", response=response)
    request = HTTPX.Request("GET", "https://huggingface.co")
    response = HTTPX.Response(status, request=request)
    return HTTPX.HTTPStatusError(
        f"{status} Server Error", request=request, response=response
    )


RETRY = "to wait longer: load_pretrained('bert-base-uncased', timeout=30)"

# name: (the library the case needs, None when it is not installed, True for none;
# the error the HTTP layer raised; whether transformers raises its own error from it,
# else while handling it; the kind and detail the notice gives)
FAILURES = {
    "requests read timeout": (
        REQUESTS,
        lambda: REQUESTS.exceptions.ReadTimeout("read timed out"),
        True,
        ("hub too slow", "ReadTimeout"),
    ),
    # also a requests ConnectionError: a timeout is a slow hub first
    "requests connect timeout": (
        REQUESTS,
        lambda: REQUESTS.exceptions.ConnectTimeout("connect timed out"),
        True,
        ("hub too slow", "ConnectTimeout"),
    ),
    "socket timeout": (
        True,
        lambda: TimeoutError("timed out"),
        True,
        ("hub too slow", "TimeoutError"),
    ),
    "httpx read timeout": (
        HTTPX,
        lambda: HTTPX.ReadTimeout("timed out"),
        True,
        ("hub too slow", "ReadTimeout"),
    ),
    "httpx connect error": (
        HTTPX,
        lambda: HTTPX.ConnectError("[Errno -3] Temporary failure in name resolution"),
        True,
        ("offline", "ConnectError"),
    ),
    "requests connection error": (
        REQUESTS,
        lambda: REQUESTS.exceptions.ConnectionError("Max retries exceeded"),
        True,
        ("offline", "ConnectionError"),
    ),
    "offline mode": (
        True,
        lambda: OfflineModeIsEnabled("HF_HUB_OFFLINE=1"),
        True,
        ("offline", "OfflineModeIsEnabled"),
    ),
    "HTTP 503": (
        REQUESTS or HTTPX,
        lambda: _http_status_error(503),
        False,
        ("download failed", "HTTP 503"),
    ),
    "disk full": (
        True,
        lambda: OSError(28, "No space left on device"),
        True,
        ("download failed", "OSError"),
    ),
}


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(
            name,
            marks=pytest.mark.skipif(library is None, reason="library not installed"),
        )
        for name, (library, *_) in FAILURES.items()
    ],
)
def test_a_failed_download_says_why(failure, online, monkeypatch):
    _, make, cause, (kind, detail) = FAILURES[failure]
    error = _as_transformers_raises(make(), cause=cause)

    def download(model, local_only):
        assert not local_only
        raise error

    monkeypatch.setattr(pretrained, "_download", download)
    monkeypatch.setattr(pretrained, "random_model", lambda name: torch.nn.Identity())
    loaded = load_pretrained("bert-base-uncased", verbose=False)
    assert not loaded.real
    expected = (
        f"{kind} ({detail}): random bert-base-uncased, byte tokens; output is noise"
    )
    if kind == "hub too slow":  # and how to wait longer
        expected += "; " + RETRY
    assert loaded.notice == expected


def test_a_slow_probe_reads_the_cache_and_says_how_to_wait_longer(monkeypatch):
    for variable in pretrained.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(
        pretrained, "_probe", lambda url, t: ("hub too slow", f"no answer in {t:g} s")
    )
    asked = []

    def cached(model, local_only):
        asked.append(local_only)
        raise LocalEntryNotFoundError("not in the local cache")

    monkeypatch.setattr(pretrained, "_download", cached)
    monkeypatch.setattr(pretrained, "random_model", lambda name: torch.nn.Identity())
    assert load_pretrained("bert-base-uncased", verbose=False).notice == (
        "hub too slow (no answer in 3 s): random bert-base-uncased, byte tokens; "
        "output is noise; " + RETRY
    )
    notice = load_pretrained("bert-base-uncased", timeout=30, verbose=False).notice
    assert notice.endswith("timeout=300)") and asked == [True, True]


def test_the_timeout_raises_huggingface_hubs_own_waits_for_the_download(
    online, monkeypatch
):
    from huggingface_hub import constants

    before = [getattr(constants, name) for name in pretrained.HUB_TIMEOUTS]
    seen = []

    def download(model, local_only):
        seen.append([getattr(constants, name) for name in pretrained.HUB_TIMEOUTS])
        raise OSError("stop here")

    monkeypatch.setattr(pretrained, "_download", download)
    monkeypatch.setattr(pretrained, "random_model", lambda name: torch.nn.Identity())
    load_pretrained("bert-base-uncased", timeout=45, verbose=False)
    load_pretrained("bert-base-uncased", timeout=0.5, verbose=False)
    # raised to 45 s for the first; never lowered; restored after each
    assert seen == [[45, 45], before] and max(before) < 45
    assert [getattr(constants, name) for name in pretrained.HUB_TIMEOUTS] == before


def test_random_model_builds_the_published_configuration_untrained():
    """T5-small is the smallest of the text models: its start id, sizes and buckets."""
    model = random_model("t5-small")
    assert isinstance(model, T5) and model.start_id == 0 and not model.training
    cfg = model.cfg
    assert (cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.decoder_layers, cfg.n_heads) == (
        512,
        2048,
        6,
        6,
        8,
    )
    assert (cfg.t5_num_buckets, cfg.activation, cfg.vocab_size) == (32, "relu", 32128)


# ------------------------------------------------------------------- the byte tokenizer


def test_byte_tokenizer_round_trip_and_special_tokens():
    bert = ByteTokenizer(**hub_model("bert-base-uncased").byte_tokens)
    text = "Le café est [MASK]."
    ids = bert.encode(text)
    assert ids[0] == 101 and ids[-1] == 102 and ids.count(103) == 1
    assert len(ids) == 2 + len("Le café est ".encode()) + 1 + 1
    assert all(0 <= i < 30522 for i in ids)
    assert bert.decode(ids) == f"[CLS]{text}[SEP]"
    assert bert.decode(ids, skip_special_tokens=True) == "Le café est ."
    assert bert.encode(text, add_special_tokens=False) == ids[1:-1]
    # an id that is not a byte, and bytes that are not UTF-8, stay readable
    assert bert.decode(torch.tensor([1000 + 104, 29999, 29998])) == "h <29999> <29998>"
    assert bert.decode([1000 + 0xE9, 1000 + 0x21]) == "\\xe9!"
    assert bert.decode([1000 + 0xC3, 1000 + 0xA9]) == "é"  # a whole character
    assert (bert.mask_token, bert.pad_token_id, bert.eos_token_id) == (
        "[MASK]",
        0,
        None,
    )
    t5 = ByteTokenizer(**hub_model("t5-small").byte_tokens)
    assert t5.encode("hi")[-1] == 1 and t5.decode(t5.encode("hi"), True) == "hi"
    with pytest.raises(ValueError, match="offset"):
        ByteTokenizer(100, offset=0)  # 256 bytes do not fit in 100 ids


# ----------------------------------------------------------------- shipped checkpoints


def _tiny_gpt() -> tuple[GPT, CharTokenizer]:
    torch.manual_seed(0)
    tokenizer = CharTokenizer("to be or not to be, that is the question")
    cfg = TransformerConfig(
        vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_layers=2, max_len=32
    )
    return GPT(cfg), tokenizer


def test_a_gpt_and_its_tokenizer_ship_and_come_back(tmp_path):
    model, tokenizer = _tiny_gpt()
    path = save_shipped(
        model,
        "tiny-gpt",
        tokenizer=tokenizer,
        metrics={"val_loss": 1.25},
        record="book/results/tiny.json",
        command="python -m lib.runs tiny",
        directory=tmp_path,
    )
    assert path == tmp_path / "tiny-gpt.pt" and shipped_names(tmp_path) == ["tiny-gpt"]
    entry = json.loads((tmp_path / "manifest.json").read_text())["tiny-gpt"]
    assert (
        entry["sha256"] == sha256_file(path) and entry["bytes"] == path.stat().st_size
    )
    assert entry["kind"] == "gpt" and entry["dtype"] == "float32"
    assert entry["parameters"] == count_parameters(model)
    assert entry["metrics"] == {"val_loss": 1.25} and entry["file"] == "tiny-gpt.pt"
    assert entry["command"] == "python -m lib.runs tiny"
    assert entry["record"] == "book/results/tiny.json"

    shipped = load_shipped("tiny-gpt", directory=tmp_path)
    assert isinstance(shipped.model, GPT) and not shipped.model.training
    assert shipped.model.cfg == model.cfg and shipped.entry == entry
    assert shipped.tokenizer.chars == tokenizer.chars
    ids = torch.tensor([tokenizer.encode("to be")])
    with torch.no_grad():
        assert torch.equal(shipped.model(ids), model.eval()(ids))
    assert not list(tmp_path.glob(".*.tmp"))  # the partial file was moved into place
    assert shipped.metadata["name"] == "tiny-gpt"  # the file holds its metadata


def test_a_vit_ships_without_a_tokenizer(tmp_path):
    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=28, patch_size=7, n_classes=10, d_model=16))
    save_shipped(vit, "tiny-vit", directory=tmp_path)
    save_shipped(_tiny_gpt()[0], "tiny-gpt", directory=tmp_path)  # one manifest, two
    assert shipped_names(tmp_path) == ["tiny-gpt", "tiny-vit"]
    shipped = load_shipped("tiny-vit", directory=tmp_path)
    assert shipped.tokenizer is None and shipped.model.cfg == vit.cfg
    images = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(shipped.model(images), vit.eval()(images))


def test_large_weights_ship_in_float16_with_tied_matrices_once(tmp_path, monkeypatch):
    model, tokenizer = _tiny_gpt()
    monkeypatch.setattr(pretrained, "FP32_LIMIT", 1000)
    path = save_shipped(model, "half", tokenizer=tokenizer, directory=tmp_path)
    assert json.loads((tmp_path / "manifest.json").read_text())["half"]["dtype"] == (
        "float16"
    )
    stored = torch.load(path, weights_only=True)["state_dict"]
    assert stored["head.weight"].dtype == torch.float16
    assert stored["head.weight"].data_ptr() == stored["embed.tokens.weight"].data_ptr()
    shipped = load_shipped("half", directory=tmp_path)
    assert next(shipped.model.parameters()).dtype == torch.float32
    ids = torch.tensor([tokenizer.encode("that is")])
    with torch.no_grad():
        gap = (shipped.model(ids) - model.eval()(ids)).abs().max()
    assert 0 < gap < 1e-2  # rounded to float16, nothing more


def test_a_missing_unknown_or_altered_checkpoint_is_a_clear_error(tmp_path):
    model, tokenizer = _tiny_gpt()
    path = save_shipped(model, "tiny-gpt", tokenizer=tokenizer, directory=tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"lists no 'other' \(it lists: tiny-gpt"
    ):
        load_shipped("other", directory=tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    path.write_bytes(bytes(data))
    with pytest.raises(
        ChecksumError, match=re.escape(str(path)) + ".*corrupt or was altered"
    ):
        load_shipped("tiny-gpt", directory=tmp_path)
    path.unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(path)) + " is missing"):
        load_shipped("tiny-gpt", directory=tmp_path)
    assert shipped_names(tmp_path / "nowhere") == []


def test_save_shipped_refuses_what_it_cannot_ship(tmp_path):
    model = _tiny_gpt()[0]
    with pytest.raises(TypeError, match="takes a registered kind, got Linear"):
        save_shipped(torch.nn.Linear(2, 2), "linear", directory=tmp_path)
    with pytest.raises(ValueError, match="lower-case"):
        save_shipped(model, "../escape", directory=tmp_path)
    with pytest.raises(TypeError, match="tokenizer"):
        save_shipped(model, "gpt", tokenizer="abc", directory=tmp_path)
    with pytest.raises(TypeError, match="JSON serializable"):
        save_shipped(
            model, "gpt", metrics={"loss": torch.tensor(1.0)}, directory=tmp_path
        )
    assert list(tmp_path.iterdir()) == []  # nothing was written


@pytest.mark.parametrize("name", shipped_names())
def test_every_checkpoint_the_course_ships_loads(name):
    shipped = load_shipped(name)  # its sha256 checked against the manifest
    assert not shipped.model.training
    assert count_parameters(shipped.model) == shipped.entry["parameters"]


def test_the_shipped_vit_says_how_to_prepare_its_images():
    """The manifest's ``inputs`` are what the shipped ViT needs: with them it
    scores its recorded accuracy on the held-out images, without them it fails."""
    from lib.datasets import load_mnist

    shipped = load_shipped("vit-mnist")
    inputs = shipped.entry["inputs"]
    images_u8, labels = load_mnist()
    # chapter 10's split: the first 1,000 of a seed-0 permutation are held out
    held_out = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    held_out = held_out[:1_000]
    pixels = images_u8[held_out].float().div(255).unsqueeze(1)
    with torch.no_grad():
        prepared = shipped.model((pixels - inputs["mean"]) / inputs["std"])
        raw = shipped.model(pixels)
    accuracy = (prepared.argmax(-1) == labels[held_out]).float().mean().item()
    raw_accuracy = (raw.argmax(-1) == labels[held_out]).float().mean().item()
    assert accuracy == pytest.approx(shipped.entry["metrics"]["val_accuracy"], abs=1e-3)
    assert raw_accuracy < 0.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_named():
    with pytest.raises(RuntimeError, match="'cuda' was asked for, but CUDA is not"):
        load_shipped("vit-mnist", device="cuda")


# ------------------------------------------------ issue 30: one model file, layers down


def _models_and_tokenizers():
    """One model of each registered kind, with a tokenizer where it reads text."""
    from lib.models import BERT, SequenceClassifier
    from lib.tokenizer import BPETokenizer

    torch.manual_seed(0)
    bpe = BPETokenizer().train("low lower lowest newer newest " * 4, 262, ["<eos>"])
    text = dict(
        vocab_size=bpe.vocab_size, d_model=16, n_heads=2, n_layers=1, max_len=16
    )
    char_gpt, chars = _tiny_gpt()
    t5_cfg = TransformerConfig(**text, positions="t5", n_decoder_layers=2)
    classifier = SequenceClassifier(BERT(TransformerConfig(**text)), 3, dropout=0.2)
    vit = ViT(ViTConfig(image_size=28, patch_size=7, n_classes=10, d_model=16,
                        attention_dropout=0.1))  # fmt: skip
    ids = torch.tensor([bpe.encode("lowest newer")])
    return {
        "gpt": (char_gpt, chars, (torch.tensor([chars.encode("to be")]),)),
        "bert": (BERT(TransformerConfig(**text)), bpe, (ids,)),
        "classifier": (classifier, bpe, (ids,)),
        "t5": (T5(t5_cfg, start_id=5), bpe, (ids, ids[:, :3])),
        "vit": (vit, None, (torch.rand(2, 1, 28, 28),)),
    }


@pytest.mark.parametrize("kind", ["gpt", "bert", "classifier", "t5", "vit"])
def test_save_model_and_load_model_round_trip_each_kind(tmp_path, kind):
    from lib.model_file import load_model, save_model

    model, tokenizer, inputs = _models_and_tokenizers()[kind]
    path = save_model(tmp_path / f"{kind}.pt", model, tokenizer, step=7, note="x")
    saved = load_model(path)  # nothing else to know: kind, config, tokenizer
    assert saved.kind == kind and type(saved.model) is type(model)
    assert saved.config == model.cfg and not saved.model.training
    assert saved.metadata == {"step": 7, "note": "x"} and saved.path == path
    stored = torch.load(path, weights_only=True)
    assert saved.sha256 == stored["sha256"] and stored["kind"] == kind
    assert saved.dtype == "float32"
    for key, value in model.state_dict().items():
        assert torch.equal(saved.model.state_dict()[key], value), key
    with torch.no_grad():
        assert torch.equal(saved.model(*inputs), model.eval()(*inputs))
    if tokenizer is None:
        assert saved.tokenizer is None
    else:
        assert type(saved.tokenizer) is type(tokenizer)
        sample = "to be" if kind == "gpt" else "lowest newer<eos>"
        assert saved.tokenizer.encode(sample) == tokenizer.encode(sample)
    if kind == "t5":
        assert saved.model.start_id == 5
    if kind == "classifier":
        assert saved.model.head.out_features == 3 and saved.model.dropout.p == 0.2


def test_load_model_changes_runtime_fields_only(tmp_path):
    from lib.model_file import load_model, save_model

    model, tokenizer = _tiny_gpt()
    path = save_model(tmp_path / "m.pt", model, tokenizer)
    saved = load_model(path, attn_backend="math", dropout=0.0)
    assert saved.config.attn_backend == "math"
    with pytest.raises(ValueError, match="norm_eps cannot change at loading"):
        load_model(path, norm_eps=1e-3)


def test_a_damaged_or_foreign_model_file_is_a_clear_error(tmp_path):
    from lib.model_file import ModelFileError, load_model, save_model

    model, tokenizer = _tiny_gpt()
    with pytest.raises(TypeError, match="save_model takes a model of a registered"):
        save_model(tmp_path / "l.pt", torch.nn.Linear(2, 2))
    path = save_model(tmp_path / "m.pt", model, tokenizer)
    data = bytearray(path.read_bytes())
    weight = model.embed.tokens.weight.detach().numpy().tobytes()[:64]
    data[data.find(weight) + 9] ^= 0x10  # one flipped bit inside a weight
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="is damaged: not its sha256") as info:
        load_model(path)
    assert info.value.damaged
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ModelFileError, match="is not a model file"):
        load_model(tmp_path / "other.pt")
    with pytest.raises(ModelFileError, match="no model file at"):
        load_model(tmp_path / "missing.pt")


def test_a_model_file_whose_weights_do_not_fit_its_kind_is_named(tmp_path):
    """The stored weights are compared with the model the file's configuration builds
    before any is loaded (lib.model_file, with no lib.hf_weights)."""
    from lib.model_file import (
        ModelFileError,
        atomic_save,
        content_sha256,
        load_model,
        pack_model,
    )

    model, tokenizer = _tiny_gpt()
    packed = pack_model(model, tokenizer)
    packed["state_dict"].pop("decoder.final_norm.bias")
    packed["state_dict"]["extra.weight"] = torch.zeros(2)
    del packed["sha256"]
    packed["sha256"] = content_sha256(packed)  # intact, but not this GPT's
    path = atomic_save(packed, tmp_path / "odd.pt")
    with pytest.raises(ModelFileError, match="does not fit the gpt") as info:
        load_model(path)
    assert "missing keys: decoder.final_norm.bias" in str(info.value)
    assert "unexpected keys: extra.weight" in str(info.value)


def test_lib_pretrained_works_without_lib_vit_which_registers_itself():
    """Layers point down: lib.pretrained (chapter 7) imports nothing of lib.vit
    (chapter 10); a file or a hub entry that needs it names it, and it registers its
    kind and its hub loader when it is imported."""
    code = textwrap.dedent(
        """
        import sys
        import lib.model_file as m
        import lib.pretrained as p
        assert "lib.vit" not in sys.modules and "lib.training" not in sys.modules
        assert "vit" not in m.MODEL_KINDS and not p.HUB_LOADERS
        gpt = p.load_shipped("char-gpt-shakespeare")
        assert "lib.vit" not in sys.modules, "a GPT needs no ViT"
        vit = p.load_shipped("vit-mnist")  # its file names lib.vit
        import lib.vit
        assert type(vit.model) is lib.vit.ViT and "vit" in m.MODEL_KINDS
        assert p._hub_loader(p.hub_model("vit-base-patch16-224")) is not None
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_shipped_checkpoints_are_model_files():
    from lib.model_file import MODEL_FORMAT, LoadedModel, load_model

    for name in shipped_names():
        shipped = load_shipped(name)
        path = pretrained.CHECKPOINTS / shipped.entry["file"]
        saved = load_model(path)  # the same file, by path
        assert torch.load(path, weights_only=True)["format"] == MODEL_FORMAT
        assert saved.kind == shipped.entry["kind"] and saved.metadata["name"] == name
        assert saved.metadata["inputs"] == shipped.entry["inputs"]
        assert "metrics" not in saved.metadata  # re-measuring leaves the file alone
        assert (saved.tokenizer is None) == (name == "vit-mnist")
        # one loaded-model type: the shipped one is the file's, with its name
        assert type(shipped) is type(saved) is LoadedModel
        assert (shipped.name, shipped.sha256) == (name, saved.sha256)
