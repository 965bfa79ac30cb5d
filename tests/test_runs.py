"""lib.runs: chapter 8's three runs, their sizes, cost, entry point and records."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib.datasets import load_tiny_shakespeare
from lib.efficiency import training_flops_per_token
from lib.models import BERT, GPT, SequenceClassifier, TransformerConfig
from lib.runs import (
    RUNS,
    char_gpt_run,
    estimate_run_seconds,
    main,
    run_flops,
    run_sizes,
    split_pairs_by_source,
)
from lib.training import tokens_in
from lib.utils import PROFILES, read_record

ROOT = Path(__file__).resolve().parent.parent


# one torch thread for every test here (conftest.py says why)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_pair_split_keeps_every_source_on_one_side():
    pairs = [(f"s{i % 40}", f"t{i}") for i in range(100)]
    train_part, test_part = split_pairs_by_source(pairs, 0.25, seed=3)
    assert sorted(train_part + test_part) == sorted(pairs)
    assert not {s for s, _ in train_part} & {s for s, _ in test_part}
    assert len({s for s, _ in test_part}) == 10


def test_every_run_has_every_profile_and_colab_keeps_the_full_models():
    for run in RUNS:
        by_profile = {profile: run_sizes(run, profile) for profile in PROFILES}
        colab, full = by_profile["colab"], by_profile["full"]
        assert set(colab) == set(full) == set(by_profile["smoke"]), run
        for key in ("d_model", "n_heads", "n_layers", "seq_len"):
            assert colab.get(key) == full.get(key), (run, key)
        assert colab["n_steps"] < full["n_steps"]
        assert {s["profile"] for s in by_profile.values()} == set(PROFILES)


def test_run_sizes_follow_the_active_profile_and_take_overrides(monkeypatch):
    monkeypatch.setenv("TFS_PROFILE", "colab")
    assert run_sizes("gpt") == run_sizes("gpt", "colab")
    quick = run_sizes("bert", "full", n_steps=3)
    assert quick["n_steps"] == quick["finetune_steps"] == quick["warmup"] == 3
    assert run_sizes("t5", "smoke", max_tokens=6, lr=1e-2)["max_tokens"] == 6
    with pytest.raises(ValueError, match=r"no size \['width'\] in 'gpt'; known: "):
        run_sizes("gpt", width=3)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        run_sizes("gpt", batch_size=2.5)
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        run_sizes("gpt", lr=math.inf)
    with pytest.raises(ValueError, match="run must be one of"):
        run_sizes("gpt2")
    with pytest.raises(ValueError, match="profile must be one of"):
        run_sizes("gpt", "tpu")


def test_run_flops_counts_the_gpt_run_tokens():
    sizes = run_sizes("gpt", "smoke")
    batch, seq, steps = sizes["batch_size"], sizes["seq_len"], sizes["n_steps"]
    work = run_flops("gpt", "smoke")
    assert work["train_tokens"] == steps * batch * seq
    assert work["steps"] == steps
    n_evals = steps // sizes["eval_every"]  # 200 steps, every 50: 4, the last at 200
    n_text = len(load_tiny_shakespeare())  # characters: one token each
    n_val = n_text - int(0.9 * n_text)
    final = (n_val - 1) // seq * seq
    assert work["forward_tokens"] == n_evals * sizes["eval_iters"] * batch * seq + final
    cfg = TransformerConfig(
        vocab_size=65,
        d_model=sizes["d_model"],
        n_heads=sizes["n_heads"],
        n_layers=sizes["n_layers"],
        max_len=seq,
    )
    per_token = training_flops_per_token(GPT(cfg), seq)
    expected = per_token * (work["train_tokens"] + work["forward_tokens"] / 3)
    assert work["flops"] == pytest.approx(expected)


def test_run_flops_counts_t5_batches_close_to_the_exact_count():
    """Batches by length hold nearly max_tokens padded tokens a stack: run_flops's
    count without building them is within 5 % of the batches' own."""
    from lib.runs import t5_data

    sizes = run_sizes("t5", "smoke")
    batch_at = t5_data(sizes, 0)["batch_at"]
    exact = sum(tokens_in(batch_at(step)) for step in range(sizes["n_steps"]))
    work = run_flops("t5", "smoke")
    assert work["train_tokens"] == pytest.approx(exact, rel=0.05)
    assert work["steps"] == sizes["n_steps"]


def test_estimate_run_seconds():
    flops = run_flops("bert", "colab")["flops"]
    assert estimate_run_seconds("bert", "colab") == pytest.approx(flops / (65e12 * 0.3))
    seconds = estimate_run_seconds("bert", "colab", peak=1e15, mfu=0.5)
    assert seconds == pytest.approx(flops / 5e14)
    h100 = estimate_run_seconds("bert", "colab", peak="H100", mfu=0.3)
    assert h100 == pytest.approx(flops / (989e12 * 0.3))
    # step_overhead: seconds per optimiser step on top of the FLOPs' time
    sizes = run_sizes("bert", "colab")
    steps = sizes["n_steps"] + 2 * sizes["finetune_steps"]  # pre-training, 2 fine-tunes
    assert run_flops("bert", "colab")["steps"] == steps
    slow = estimate_run_seconds("bert", "colab", mfu=0.1, step_overhead=0.005)
    assert slow == pytest.approx(flops / (65e12 * 0.1) + steps * 0.005)
    overhead_only = slow - estimate_run_seconds("bert", "colab", mfu=0.1)
    assert overhead_only == pytest.approx(steps * 0.005)
    for run in RUNS:  # more work in colab than in smoke, less than in full
        smoke, colab, full = (run_flops(run, p) for p in PROFILES)
        assert smoke["flops"] < colab["flops"] < full["flops"]
        assert colab["steps"] < full["steps"]
    with pytest.raises(ValueError, match="unknown GPU 'TPU'"):
        estimate_run_seconds("gpt", "colab", peak="TPU")
    with pytest.raises(ValueError, match="mfu must be in"):
        estimate_run_seconds("gpt", "colab", mfu=0.0)
    with pytest.raises(ValueError, match="peak must be positive"):
        estimate_run_seconds("gpt", "colab", peak=-1.0)
    with pytest.raises(ValueError, match="step_overhead must be"):
        estimate_run_seconds("gpt", "colab", step_overhead=-0.001)
    with pytest.raises(ValueError, match="profile must be one of"):
        run_flops("gpt", "tpu")
    with pytest.raises(ValueError, match="run must be one of"):
        run_flops("gpt2", "smoke")


def test_main_rejects_an_unknown_profile_and_bad_settings(capsys):
    with pytest.raises(SystemExit):
        main(["--run", "gpt", "--profile", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--run", "gpt", "--set", "batch_size=six"])
    assert "--set takes KEY=NUMBER, got 'batch_size=six'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--run", "gpt", "--resume"])
    assert "--resume needs --checkpoint-dir" in capsys.readouterr().err


def test_main_writes_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TFS_PROFILE", "smoke")
    argv = ["--run", "gpt", "--steps", "2", "--out", str(tmp_path), "--quiet"]
    result = main(argv)
    saved = read_record(tmp_path)  # the schema of lib.utils.write_record
    assert saved["name"] == "08-training-gpt" and saved["profile"] == "smoke"
    # a folder outside the project is no path of this machine in the record
    portable = " ".join(argv).replace(str(tmp_path), "OUT")
    assert saved["command"] == f"python -m lib.runs {portable}"
    assert saved["torch"] == torch.__version__ and result["metrics"] == saved["metrics"]
    assert (
        saved["config"]["sizes"]["n_steps"] == 2 and saved["extra"]["world_size"] == 1
    )
    assert saved["samples"] == result["samples"] and saved["wall_seconds"] > 0
    assert (tmp_path / "curves.png").is_file()
    lines = (tmp_path / "train.csv").read_text().splitlines()
    assert lines[0] == "step,loss,lr" and len(lines) == 3
    assert json.loads((tmp_path / "metrics.json").read_text())["schema"] == 1


# --- the real entry point under torchrun: N processes equal one ---------------------------

TINY = {  # sizes whose evaluation sets do not divide by 2 or 3 processes
    "gpt": "d_model=16 n_heads=2 n_layers=1 seq_len=32 batch_size=6 n_steps=3 "
    "eval_every=2 eval_iters=2",  # final evaluation: 3485 windows, the last batch 5
    "bert": "vocab_size=300 d_model=16 n_heads=2 n_layers=1 seq_len=16 batch_size=5 "
    "n_steps=2 eval_every=1 eval_iters=1 mlm_test_batches=1 passage_len=16 "
    "labelled_per_book=3 test_per_book=7",  # 5-row batches, a last one of 2
    "t5": "vocab_size=300 d_model=16 d_ff=32 n_heads=2 n_layers=1 max_tokens=200 "
    "n_steps=2 eval_every=1 max_train_pairs=3000 eval_pairs=53 bleu_sentences=30 "
    "beam_size=2",  # 53 held-out pairs: a last batch of 3 or 4 rows under DDP
}


def _args(run: str, out: Path) -> list[str]:
    settings = [arg for s in TINY[run].split() for arg in ("--set", s)]
    return ["--run", run, "--profile", "smoke", *settings, "--out", str(out), "--quiet"]


# One torchrun launch runs all three: each worker calls the entry point once per run, as
# `python -m lib.runs` does (runpy, with the run's own argv). The process group stays up
# from one run to the next (distributed_setup joins it once; under torchrun a destroyed
# group cannot be joined again) and the last run ends it. Starting the processes, not
# training the tiny models, is most of the time: one launch instead of three.
ALL_RUNS_SCRIPT = """\
import json, runpy, sys
import torch.distributed as dist

end_group = dist.destroy_process_group
argvs = json.loads(sys.argv[1])
for i, argv in enumerate(argvs):
    last = i == len(argvs) - 1
    dist.destroy_process_group = end_group if last else (lambda *args, **kwargs: None)
    sys.argv = ["lib.runs", *argv]
    runpy.run_module("lib.runs", run_name="__main__", alter_sys=True)
"""


def _launch_all(n_processes: int, folder: Path) -> None:
    """Every run of RUNS under one torchrun launch of ``n_processes``; their records
    go to ``folder/<run>``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "all_runs.py"
    script.write_text(ALL_RUNS_SCRIPT, encoding="utf-8")
    argvs = json.dumps([_args(run, folder / run) for run in RUNS])
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*torchrun, f"--nproc_per_node={n_processes}", str(script), "--", argvs]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TFS_PROFILE": "smoke"}
    env["PYTHONPATH"] = path
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """``one_process(run)``: the record of ``run`` by the same entry point in this
    process (one start less), once per module."""
    made = {}

    def record(run: str) -> dict:
        if run not in made:
            out = tmp_path_factory.mktemp(f"one-process-{run}")
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("TFS_PROFILE", "smoke")  # main sets it: undone here
                main(_args(run, out))
            made[run] = read_record(out)
        return made[run]

    return record


def _losses(record: dict) -> dict[str, float]:
    """Every loss a record holds: the curves' and the metrics'."""
    found = {k: v for k, v in record["metrics"].items() if k.endswith("loss")}
    for name, columns in record["curves"].items():
        found.update(
            {f"{name}@{s}": x for s, x in zip(columns["step"], columns["loss"])}
        )
    return found


@pytest.mark.slow
@pytest.mark.parametrize("n_processes", [2, 3])
def test_torchrun_with_n_processes_equals_one_process(
    n_processes, tmp_path, one_process
):
    _launch_all(n_processes, tmp_path)
    for run in RUNS:
        expected = _losses(one_process(run))
        assert len(expected) >= 5, run
        assert all(math.isfinite(x) for x in expected.values()), run
        parallel = read_record(tmp_path / run)
        assert parallel["extra"]["world_size"] == n_processes
        assert "torchrun --standalone --nproc_per_node=" in parallel["command"]
        got = _losses(parallel)
        assert got.keys() == expected.keys(), run
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-5), (run, n_processes, key)


def test_bad_inputs_of_the_runs_name_the_argument(tmp_path):
    cfg = TransformerConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, max_len=8)
    cases = [
        (lambda: SequenceClassifier(GPT(cfg), 3), TypeError, "takes a BERT"),
        (lambda: SequenceClassifier(BERT(cfg), 0), ValueError, "n_classes must be"),
        (lambda: SequenceClassifier(BERT(cfg), 3, dropout=1.0), ValueError, "dropout"),
        (lambda: split_pairs_by_source([], 0.1), ValueError, "non-empty list"),
        (lambda: split_pairs_by_source([("a", 1)], 0.1), TypeError, "pairs of strings"),
        (lambda: split_pairs_by_source([("a", "b")], 1.0), ValueError, r"test_fraction must be in \(0, 1\)"),
        (lambda: split_pairs_by_source([("a", "b")], 0.5, seed=1.5), TypeError, "seed must be an int"),
        (lambda: char_gpt_run("smoke", compile="no"), TypeError, "compile must be True or False"),
        (lambda: char_gpt_run("smoke", seed=-1), ValueError, "seed must be an int >= 0"),
        (lambda: char_gpt_run("smoke", progress=1), ValueError, "progress must be one of"),
        (lambda: char_gpt_run("smoke", resume=True), ValueError, "resume needs a checkpoint_dir"),
        (lambda: char_gpt_run("smoke", sizes={"depth": 2}), ValueError, r"no size \['depth'\]"),
        (lambda: char_gpt_run("tpu"), ValueError, "profile must be one of"),
    ]  # fmt: skip
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


def test_a_run_checkpoints_and_resumes(tmp_path, monkeypatch):
    """With a checkpoint folder a run writes one at each evaluation; resumed, a finished
    run trains no more and gives the same result."""
    sizes = dict(d_model=16, n_heads=2, n_layers=1, seq_len=16, batch_size=4,
                 n_steps=4, eval_every=2, eval_iters=1)  # fmt: skip
    first = char_gpt_run("smoke", sizes=sizes, checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best.pt",  # the best evaluation's weights, which the run keeps
        "step-00000002.pt",
        "step-00000004.pt",
    ]
    again = char_gpt_run("smoke", sizes=sizes, checkpoint_dir=tmp_path, resume=True)
    assert again["curves"] == first["curves"]
    assert again["metrics"]["val_loss"] == first["metrics"]["val_loss"]


def test_mfu_divides_by_the_peak_of_every_process(monkeypatch):
    """Under DDP, tokens_per_second counts every process's tokens (the whole
    batch of each step), so the MFU divides by the peak of all the GPUs."""
    import lib.runs as runs
    from lib.training import TrainHistory

    cfg = TransformerConfig(
        vocab_size=50, d_model=32, n_heads=2, n_layers=1, max_len=16
    )
    model = GPT(cfg)
    history = TrainHistory(tokens=6_000, train_seconds=2.0)
    monkeypatch.setattr(runs, "peak_flops", lambda device: 1e9)
    alone = runs._speed(model, history, 16)["mfu"]
    assert alone == pytest.approx(training_flops_per_token(model, 16) * 3_000 / 1e9)
    monkeypatch.setattr(runs.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(runs.dist, "get_world_size", lambda: 4)
    assert runs._speed(model, history, 16)["mfu"] == pytest.approx(alone / 4)


def test_seconds_to_loss_reads_the_first_evaluation_at_or_below_the_target():
    """The char-GPT's 'time to nanoGPT's 1.47': the first evaluation that reaches the
    target, from the evaluation times train records (none if none reaches it, or if a
    resumed history lacks times)."""
    from lib.runs import seconds_to_loss
    from lib.training import TrainHistory

    history = TrainHistory(
        eval_steps=[100, 200, 300],
        eval_losses=[2.0, 1.46, 1.40],
        eval_seconds=[5.0, 9.0, 13.0],
    )
    assert seconds_to_loss(history, 1.47) == 9.0
    assert seconds_to_loss(history, 1.47, since=3.0) == 12.0
    assert seconds_to_loss(history, 1.40) == 13.0
    assert seconds_to_loss(history, 1.0) is None
    history.eval_seconds = [5.0]  # an older checkpoint's history, resumed
    assert seconds_to_loss(history, 1.47) is None


# --- the BERT recipe's pieces ------------------------------------------------------------


def test_unwrap_paragraphs_joins_each_paragraphs_lines():
    from lib.runs import unwrap_paragraphs

    text = 'It was a\ndark night.\n\n  "Who\n  is there?"\n\n\n\nCHAPTER II\n'
    assert (
        unwrap_paragraphs(text) == 'It was a dark night.\n"Who is there?"\nCHAPTER II'
    )


def test_gutenberg_split_holds_out_every_fifth_chapter_of_each_book():
    from lib.datasets import load_gutenberg
    from lib.runs import book_chapters, gutenberg_split, unwrap_paragraphs

    names, seen, held = gutenberg_split()
    books = load_gutenberg()
    assert names == list(books) and len(names) == 6
    for name, train_text, held_text in zip(names, seen, held):
        chapters = book_chapters(books[name])
        assert len(chapters) >= 10, name
        fifth, sixth = (unwrap_paragraphs(chapters[i]) for i in (4, 5))
        assert fifth in held_text and fifth not in train_text
        assert sixth in train_text and sixth not in held_text
        # no line of the text is wrapped any more: paragraphs run long
        assert max(len(line) for line in train_text.splitlines()) > 500
    with pytest.raises(ValueError, match="held_out_every"):
        gutenberg_split(1)


def test_wilson_interval_matches_its_formula_and_stays_in_range():
    from lib.runs import wilson_interval

    # 80 right of 100: centre (0.8 + 1.96^2/200) / (1 + 1.96^2/100)
    low, high = wilson_interval(80, 100)
    assert (round(low, 4), round(high, 4)) == (0.7112, 0.8666)
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0, abs=1e-12)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="n must be"):
        wilson_interval(0, 0)


def test_naive_bayes_names_the_class_whose_words_a_passage_uses():
    from lib.runs import naive_bayes_accuracy

    labelled = {
        "inputs": torch.tensor([[0, 0, 1], [2, 3, 3]]),
        "targets": torch.tensor([0, 1]),
    }
    test = [{"inputs": torch.tensor([[1, 0, 0], [3, 2, 2], [0, 3, 3]]),
             "targets": torch.tensor([0, 1, 0])}]  # fmt: skip
    # the third passage is mostly class 1's words: one of three wrong
    assert naive_bayes_accuracy(labelled, test, 2, 4) == pytest.approx(2 / 3)


def test_masked_lm_scores_against_a_model_that_knows_the_answer():
    from lib.objectives import IGNORE_INDEX
    from lib.runs import masked_lm_scores, unigram_log_probs

    unigram = unigram_log_probs(torch.tensor([0, 0, 0, 1, 2]), 5)
    # add-one counts 4, 2, 2, 1, 1 of 10
    assert torch.allclose(unigram.exp(), torch.tensor([4, 2, 2, 1, 1]) / 10.0)
    mask_id, ignore = 4, IGNORE_INDEX
    # chosen at positions 0, 2 and 3; masked at 0 and 2, kept (given away) at 3
    inputs = torch.tensor([[mask_id, 1, mask_id, 0]])
    targets = torch.tensor([[1, ignore, 3, 0]])

    class Oracle(torch.nn.Module):
        """Puts probability 1/2 on the right id wherever there is one."""

        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(()))

        def forward(self, ids):
            logits = torch.zeros(*ids.shape, 5)
            right = targets.clamp(min=0)[..., None]
            return logits.scatter(-1, right, math.log(4.0))  # 4 / (4 + 4) = 1/2

    batch = {"inputs": inputs, "targets": targets}
    scores = masked_lm_scores(Oracle(), [batch], unigram, mask_id)
    assert scores["masked_tokens"] == 2  # the kept token is not counted
    assert scores["mlm_test_loss"] == pytest.approx(math.log(2.0))
    assert scores["mlm_test_top1"] == 1.0
    expected = -(unigram[1] + unigram[3]).item() / 2
    assert scores["unigram_test_loss"] == pytest.approx(expected)
    assert scores["unigram_test_top1"] == 0.0  # id 0, the commonest, is never masked
    gains = torch.tensor([-unigram[t].item() - math.log(2.0) for t in (1, 3)])
    assert scores["mlm_gain"] == pytest.approx(gains.mean().item(), abs=1e-5)
    half = 1.96 * gains.std().item() / math.sqrt(2)
    assert scores["mlm_gain_low"] == pytest.approx(gains.mean().item() - half, abs=1e-5)


def test_labelled_batches_draw_only_the_labelled_passages():
    from lib.runs import book_passages, labelled_batches

    books = [torch.arange(100), torch.arange(1000, 1100)]
    (labelled,) = book_passages(books, 3, 10, 100)
    assert labelled["inputs"].shape == (6, 10)
    assert labelled["targets"].tolist() == [0, 0, 0, 1, 1, 1]
    assert labelled["inputs"][:, 0].tolist() == [0, 45, 90, 1000, 1045, 1090]
    batch_at = labelled_batches(labelled, 8, seed=0)
    rows = {tuple(r) for r in labelled["inputs"].tolist()}
    for step in range(3):
        batch = batch_at(step)
        assert {tuple(r) for r in batch["inputs"].tolist()} <= rows
        assert (batch["targets"] == (batch["inputs"][:, 0] >= 1000).long()).all()
    assert torch.equal(
        batch_at(2)["inputs"], labelled_batches(labelled, 8, 0)(2)["inputs"]
    )


def test_bert_sizes_refuse_a_passage_longer_than_the_model_reads():
    with pytest.raises(
        ValueError, match="passage_len=65 is longer than the model's seq_len=64"
    ):
        run_sizes("bert", "smoke", passage_len=65)


# --- the T5 recipe's pieces ------------------------------------------------------------


def test_length_batches_cover_each_epoch_once_within_the_token_budget():
    from lib.runs import length_batches

    lengths = [3, 9, 4, 4, 12, 7, 2, 9, 5, 6, 11, 3]
    batch_rows = length_batches(lengths, max_tokens=20, seed=1)
    seen, step = [], 0
    while len(seen) < len(lengths):  # the first epoch
        rows = batch_rows(step)
        assert len(rows) * max(lengths[i] for i in rows) <= 20 or len(rows) == 1
        seen += rows
        step += 1
    assert sorted(seen) == list(range(len(lengths)))  # each row once
    # similar lengths together: a batch spans less than the whole range
    assert all(
        max(lengths[i] for i in batch_rows(s)) - min(lengths[i] for i in batch_rows(s))
        < 10
        for s in range(step)
    )
    # the next epoch is drawn anew, and the same seed draws the same batches
    again = length_batches(lengths, max_tokens=20, seed=1)
    assert [again(s) for s in range(2 * step)] == [
        batch_rows(s) for s in range(2 * step)
    ]


def test_bleu_references_keep_every_translation_and_copying_scores_low():
    from lib.runs import bleu_references, corpus_bleu

    pairs = [("Go.", "Va !"), ("Hi.", "Salut !"), ("Go.", "Bouge !"), ("Hi.", "Salut.")]
    english, streams = bleu_references(pairs)
    assert english == ["Go.", "Hi."]
    assert streams == [["Va !", "Salut !"], ["Bouge !", "Salut."]]
    assert bleu_references(pairs, 1) == (["Go."], [["Va !"], ["Bouge !"]])
    sentence = "Je suis très content de te voir ici ce soir."
    assert corpus_bleu([sentence], [[sentence]]) == pytest.approx(100.0)
    assert corpus_bleu(english, streams) < 1.0


def test_char_ngram_losses_learn_what_counting_can():
    from lib.runs import char_ngram_losses

    # "abcabc...": a letter says nothing alone, its predecessor says everything
    train_ids, val_ids = torch.arange(3).repeat(400), torch.arange(3).repeat(50)
    losses = char_ngram_losses(train_ids, val_ids, 3, max_order=3, prior=0.01)
    assert losses[1] == pytest.approx(math.log(3), abs=1e-3)
    assert losses[2] < 1e-4 and losses[3] < 1e-4
    with pytest.raises(ValueError, match="overflow"):
        char_ngram_losses(train_ids, val_ids, 10_000, max_order=5)
    with pytest.raises(ValueError, match="max_order"):
        char_ngram_losses(train_ids, val_ids, 3, max_order=0)


def test_bleu_interval_brackets_the_corpus_bleu():
    from lib.runs import bleu_interval, corpus_bleu

    refs = [
        f"le chat noir est assis sur le tapis numéro {i} ce soir" for i in range(30)
    ]
    hyps = [r if i % 3 else "un chien blanc dort" for i, r in enumerate(refs)]
    low, high = bleu_interval(hyps, [refs], n_resamples=100)
    assert low < corpus_bleu(hyps, [refs]) < high
    assert bleu_interval(refs, [refs], n_resamples=20) == pytest.approx((100.0, 100.0))
