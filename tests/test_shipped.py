"""lib.shipped: the shipped models' sizes and the measures that re-check a shipped file."""

from __future__ import annotations

import pytest
import torch

from lib.models import GPT, TransformerConfig
from lib.runs import char_gpt_val_loss, run_sizes
from lib.shipped import SHIPPED_SIZES, char_gpt_held_out, linear_pixels_accuracy

# one torch thread for every test here (conftest.py says why)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_shipped_sizes_are_sizes_of_the_recipes():
    for run, sizes in SHIPPED_SIZES.items():
        full = run_sizes(run, "smoke", **sizes)  # unknown keys would raise
        assert all(full[key] == value for key, value in sizes.items())
    with pytest.raises(ValueError, match="no size"):
        run_sizes("bert", "smoke", **SHIPPED_SIZES["bert"], batchsize=3)


def test_char_gpt_held_out_is_the_val_loss_with_its_interval():
    torch.manual_seed(0)
    cfg = TransformerConfig(
        vocab_size=65, d_model=16, n_heads=2, n_layers=1, max_len=64
    )
    model = GPT(cfg)
    sizes = dict(seq_len=64, batch_size=64)
    found = char_gpt_held_out(model, sizes)
    # every window has seq_len characters: the mean of the windows' means is the mean
    assert found["val_loss"] == pytest.approx(char_gpt_val_loss(model, sizes), rel=1e-5)
    assert found["val_loss_low"] < found["val_loss"] < found["val_loss_high"]
    assert found["windows"] == (111_540 - 1) // 64


def test_a_linear_model_on_pixels_separates_what_a_line_separates():
    generator = torch.Generator().manual_seed(0)
    # two classes of 8x8 "images": bright on the left half, or on the right
    left = torch.rand(60, 1, 8, 8, generator=generator) * 0.2
    right = left.clone()
    left[..., :4] += 0.8
    right[..., 4:] += 0.8
    x, y = torch.cat([left, right]), torch.tensor([0] * 60 + [1] * 60)
    assert linear_pixels_accuracy(x[::2], y[::2], x[1::2], y[1::2]) == 1.0
    # labels that have nothing to do with the pixels: about chance
    shuffled = y[torch.randperm(len(y), generator=generator)]
    assert linear_pixels_accuracy(x[::2], shuffled[::2], x[1::2], shuffled[1::2]) < 0.8


# -- the shipped runs and the measures of shipped files ------------------------------------
def test_every_shipped_run_is_registered_with_sizes_its_recipe_takes():
    from lib.shipped import REGISTERED_LATER, SHIPPED_RUNS, shipped_runs
    from lib.vit_training import mnist_vit_sizes

    runs = shipped_runs()  # imports the later chapters' modules that register theirs
    assert list(runs) == ["bert", "t5", "vit-mnist"] and runs == SHIPPED_RUNS
    assert set(REGISTERED_LATER) == {"vit-mnist", "vit"}
    assert runs["bert"].sizes is SHIPPED_SIZES["bert"]
    assert [run.record for run in runs.values()] == [
        "08-training-bert-cpu", "08-training-t5-cpu", "10-vit-mnist-cpu"
    ]  # fmt: skip
    for name in ("bert", "t5"):  # the CPU sizes and the dry run's: unknown keys raise
        sizes = run_sizes(name, "smoke", **(runs[name].sizes | runs[name].dry))
        assert sizes["n_steps"] == 4 and runs[name].checkpoints
    vit = runs["vit-mnist"]
    cfg, budget = mnist_vit_sizes("smoke", **(vit.sizes | vit.dry))
    assert (
        budget["steps"] == 4 and cfg.d_model == 32 and not runs["vit-mnist"].checkpoints
    )


def test_train_shipped_run_names_what_it_cannot_do():
    from lib.shipped import train_shipped_run

    with pytest.raises(ValueError, match="no shipped run 'gpt2'; known: bert, t5, vit"):
        train_shipped_run("gpt2")
    with pytest.raises(ValueError, match="the vit-mnist run takes no checkpoint_dir"):
        train_shipped_run("vit-mnist", resume=True)


def test_the_files_of_a_bert_and_a_t5_result_say_how_to_feed_them():
    from types import SimpleNamespace

    from lib.shipped import bert_files, t5_files

    tokenizer = SimpleNamespace(special_tokens={"<pad>": 7, "<mask>": 8, "</s>": 9})
    metrics = {"mlm_test_loss": 3.5, "unigram_test_loss": 6.6, "accuracy_pretrained": 0.6,
               "test_passages": 12, "parameters": 5, "chance": 0.2}  # fmt: skip
    result = dict(
        tokenizer=tokenizer, metrics=metrics, samples={"books": ["a", "b"]},
        config={"sizes": {"seq_len": 128, "passage_len": 64}},
        models={"mlm": "the masked LM", "classifier": "the classifier", "t5": "t5"},
    )  # fmt: skip
    mlm, books = bert_files(result).values()
    assert list(bert_files(result)) == ["bert-gutenberg-mlm", "bert-gutenberg-books"]
    assert mlm["model"] == "the masked LM" and mlm["tokenizer"] is tokenizer
    assert mlm["metrics"] == {"mlm_test_loss": 3.5, "unigram_test_loss": 6.6}
    assert mlm["inputs"] == {"pad_id": 7, "mask_id": 8, "max_len": 128}
    assert books["metrics"] == {"accuracy_pretrained": 0.6, "test_passages": 12}
    assert books["inputs"] == {
        "labels": ["a", "b"],
        "pad_id": 7,
        "passage": "64 tokens",
    }
    ((name, t5),) = t5_files(result).items()
    assert name == "t5-tatoeba-en-fr" and t5["metrics"] is metrics
    assert (t5["inputs"]["pad_id"], t5["inputs"]["eos_id"]) == (7, 9)


def test_held_out_finds_each_kinds_measure_and_its_interval():
    from lib.pretrained import load_shipped
    from lib.shipped import (
        HELD_OUT,
        HeldOut,
        held_out,
        held_out_interval,
        register_held_out,
    )

    vit = load_shipped("vit-mnist")  # chapter 10's kind: its measure registered too
    assert {"gpt", "bert", "classifier", "t5", "vit"} <= set(HELD_OUT)
    assert HELD_OUT["t5"].slow and not HELD_OUT["vit"].slow
    found = held_out_interval(vit)
    assert found["metric"] == "val_accuracy" and found["n"] == 1000
    assert found["value"] == 0.976  # 976 of 1,000 images
    assert found["value"] == pytest.approx(vit.entry["metrics"]["val_accuracy"])
    assert found["low"] < found["value"] < found["high"]
    assert held_out(vit)["val_images"] == 1000
    vit.entry = {**vit.entry, "kind": "cnn"}
    with pytest.raises(ValueError, match="no measure of the kind 'cnn'; known: bert"):
        held_out(vit)
    with pytest.raises(TypeError, match="HeldOut"):
        register_held_out("cnn", lambda shipped, record: {})
    assert "cnn" not in HELD_OUT and isinstance(HELD_OUT["vit"], HeldOut)


def test_training_of_a_record_is_its_own_until_it_is_re_measured():
    from lib.shipped import TRAINING_KEYS, training_of

    own = {key: f"the {key}" for key in TRAINING_KEYS}
    own["command"] = "python -m lib.runs --checkpoint-dir /scratch/run"
    record = {**own, "extra": {}}
    assert training_of(record) == {
        **own, "command": "python -m lib.runs --checkpoint-dir CHECKPOINT_DIR"
    }  # fmt: skip
    kept = {**own, "command": "python scripts/train_shipped.py bert"}
    again = {**own, "command": "evaluate", "extra": {"training": kept}}
    assert training_of(again) == kept


def test_reevaluate_shipped_writes_the_numbers_and_keeps_the_files_bytes(tmp_path):
    """A copy of the shipped ViT, its record in a folder of its own: re-measured, the
    record and the manifest entry get the numbers, the file keeps its sha256."""
    import json
    import shutil

    from lib.pretrained import CHECKPOINTS, MANIFEST, load_shipped
    from lib.shipped import reevaluate_shipped
    from lib.utils import PROJECT_ROOT, read_record

    entry = json.loads((CHECKPOINTS / MANIFEST).read_text())["vit-mnist"]
    shutil.copy(CHECKPOINTS / entry["file"], tmp_path / entry["file"])
    (tmp_path / "record").mkdir()
    shutil.copy(PROJECT_ROOT / entry["record"], tmp_path / "record" / "metrics.json")
    metrics = {k: v for k, v in entry["metrics"].items() if k != "val_loss"}
    moved = {
        **entry,
        "record": str(tmp_path / "record" / "metrics.json"),
        "metrics": metrics,
    }
    (tmp_path / MANIFEST).write_text(json.dumps({"vit-mnist": moved}))
    before = read_record(tmp_path / "record")
    new = reevaluate_shipped(
        "vit-mnist", commit="0" * 40, command="python scripts/train_shipped.py evaluate",
        directory=tmp_path,
    )  # fmt: skip
    after = read_record(tmp_path / "record")
    assert new["val_accuracy"] == 0.976 and after["commit"] == "0" * 40
    assert after["metrics"] == {**before["metrics"], **new}
    assert after["extra"]["training"]["commit"] == before["extra"]["training"]["commit"]
    assert after["profile"] == before["profile"] and after["curves"] == before["curves"]
    again = load_shipped("vit-mnist", directory=tmp_path)  # its sha256, checked
    assert again.entry["sha256"] == entry["sha256"]
    assert again.entry["metrics"] == {
        **metrics,
        **new,
    }  # val_loss back, and the interval
