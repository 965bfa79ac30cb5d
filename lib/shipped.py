# This file is generated from chapters/08-4-shipped.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/08-4-shipped.md, section "The recipes at the size of a CPU".
"""The models the course ships (``lib/data/checkpoints/``), as chapter 8's
recipes at the size of a CPU (page 8.4).

* :data:`SHIPPED_SIZES`: the sizes of :func:`lib.runs.bert_run` and
  :func:`lib.runs.t5_run` for the shipped BERTs and translator, over the
  smoke profile's (``run_sizes(run, "smoke", **SHIPPED_SIZES[run])``).
* :func:`char_gpt_held_out`, :func:`bert_held_out`: a shipped file's
  held-out numbers with 95 % intervals, by its recipe's own measure.
* :func:`linear_pixels_accuracy`: the ViT's baseline, a linear model on the
  raw pixels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from einops import rearrange
from torch import nn

from lib.batches import lm_eval_batches
from lib.models import GPT, SequenceClassifier
from lib.runs import (
    bert_data,
    classifier_accuracy,
    masked_lm_scores,
    shakespeare_ids,
    wilson_interval,
)
from lib.tokenizer import BPETokenizer

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "SHIPPED_SIZES",
    "char_gpt_held_out",
    "bert_held_out",
    "linear_pixels_accuracy",
]


# the CPU recipes of the models lib ships (lib/data/checkpoints/): sizes
# over the smoke profile's, with which scripts/train_shipped.py trains them
SHIPPED_SIZES = {
    "bert": dict(
        vocab_size=4000,
        d_model=192,
        n_layers=4,
        seq_len=128,
        batch_size=32,
        dropout=0.1,
        n_steps=4000,
        lr=2e-3,
        warmup=100,
        eval_every=250,
        eval_iters=10,
        mlm_test_batches=20,
        finetune_steps=300,
        finetune_lr=3e-4,
        test_per_book=200,
    ),
    "t5": dict(
        vocab_size=4000,
        d_model=192,
        d_ff=768,
        n_layers=3,
        max_tokens=4096,
        dropout=0.1,
        n_steps=3400,
        lr=1e-3,
        warmup=300,
        eval_every=340,
        eval_pairs=512,
        max_train_pairs=0,
        bleu_sentences=0,
    ),
}


@torch.no_grad()
def char_gpt_held_out(model: GPT, sizes: Mapping[str, Any]) -> dict:
    """:func:`lib.runs.char_gpt_val_loss` with a 95 % interval:
    ``val_loss`` ± 1.96 standard errors of the held-out windows' losses (the
    windows, all of ``seq_len`` characters, taken as independent), and
    their number."""
    val_ids = shakespeare_ids()[2]
    windows = lm_eval_batches(val_ids, 4 * sizes["batch_size"], sizes["seq_len"])
    was_training = model.training
    model.eval()
    losses = []  # one per window
    for window in windows:
        log_p = model(window["inputs"]).double().log_softmax(-1)
        targets = window["targets"][..., None]  # (batch seq 1)
        losses.append(-log_p.gather(-1, targets)[..., 0].mean(-1))
    losses = torch.cat(losses)
    model.train(was_training)
    mean, half = (
        float(losses.mean()),
        1.96 * float(losses.std()) / math.sqrt(len(losses)),
    )
    return {
        "val_loss": mean,
        "val_loss_low": mean - half,
        "val_loss_high": mean + half,
        "windows": len(losses),
    }


def bert_held_out(
    model: nn.Module, tokenizer: BPETokenizer, sizes: Mapping[str, Any], seed: int = 0
) -> dict[str, Any]:
    """A trained BERT's held-out measures on the recipe's test data
    (:func:`lib.runs.bert_data` with its ``tokenizer``): a book classifier's
    accuracy with its Wilson interval, or a masked LM's
    :func:`lib.runs.masked_lm_scores`."""
    data = bert_data(tokenizer, sizes, seed)
    if not isinstance(model, SequenceClassifier):
        return masked_lm_scores(
            model, data["mlm_test"], data["unigram"], data["mask_id"]
        )
    value = classifier_accuracy(model, data["test"])
    n = sum(len(b["targets"]) for b in data["test"])
    low, high = wilson_interval(round(value * n), n)
    return {
        "accuracy_pretrained": value,
        "accuracy_pretrained_low": low,
        "accuracy_pretrained_high": high,
        "test_passages": n,
    }


# From chapters/08-4-shipped.md, section "Every run against a baseline".
def linear_pixels_accuracy(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    iterations: int = 100,
) -> float:
    """The baseline of an image classifier: multinomial logistic regression
    on the raw pixels (standardised with the training images' mean and
    std), fitted by full-batch L-BFGS; its accuracy on ``val_x``."""
    mean, std = train_x.mean(), train_x.std()
    flat = rearrange((train_x - mean) / std, "n ... -> n (...)")
    held = rearrange((val_x - mean) / std, "n ... -> n (...)")
    n_classes = int(train_y.max()) + 1
    linear = nn.Linear(flat.shape[1], n_classes)
    with torch.no_grad():  # a convex problem: start from zero
        linear.weight.zero_()
        linear.bias.zero_()
    optimizer = torch.optim.LBFGS(
        linear.parameters(), max_iter=iterations, line_search_fn="strong_wolfe"
    )

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = nn.functional.cross_entropy(linear(flat), train_y)
        # a little L2, so that separable classes keep finite weights
        value = value + 1e-4 * linear.weight.pow(2).sum()
        value.backward()
        return value

    optimizer.step(loss)
    with torch.no_grad():
        return float((linear(held).argmax(-1) == val_y).float().mean())
