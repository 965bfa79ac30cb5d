"""lib.training: loss, optimiser, schedules, checkpoints, the loop, DDP, the runs' plumbing."""

from __future__ import annotations

import copy
import json
import math
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lib.datasets import load_tiny_shakespeare
from lib.models import BERT, GPT, T5, TransformerConfig
from lib.objectives import IGNORE_INDEX
from lib.training import (
    RUN_SIZES,
    CharVocabulary,
    CheckpointError,
    NoamSchedule,
    NonFiniteLossError,
    SequenceClassifier,
    WarmupCosineSchedule,
    adamw_step,
    as_batch,
    clip_grad_norm,
    cross_entropy,
    disable_activation_checkpointing,
    distributed_setup,
    enable_activation_checkpointing,
    estimate_run_seconds,
    evaluate,
    gpu_seconds,
    latest_checkpoint,
    lm_batches,
    lm_eval_batches,
    load_checkpoint,
    main,
    make_optimizer,
    make_scheduler,
    model_loss,
    parameter_groups,
    peak_flops,
    run_flops,
    save_checkpoint,
    shard_batch,
    split_pairs_by_source,
    train,
    training_flops_per_token,
)
from lib.utils import PROFILES


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run as fast on one thread, and much faster on a busy shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


STREAM = torch.randint(0, 20, (2_000,), generator=torch.Generator().manual_seed(0))


def tiny_cfg(**changes) -> TransformerConfig:
    return TransformerConfig(
        **{
            "vocab_size": 20,
            "d_model": 16,
            "n_heads": 2,
            "n_layers": 2,
            "max_len": 16,
            **changes,
        }
    )


def tiny_gpt(seed: int = 0, **changes) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_cfg(**changes))


def fresh(seed: int = 0, dropout: float = 0.1, total: int = 6):
    """Model, optimiser and scheduler as a new process builds them (seeded)."""
    model = tiny_gpt(seed, dropout=dropout)
    optimizer = make_optimizer(model, 1e-2, betas=(0.9, 0.99), eps=1e-8)
    return model, optimizer, make_scheduler(optimizer, WarmupCosineSchedule(2, total))


BATCHES = lm_batches(STREAM, batch_size=4, seq_len=16, seed=0)


# --- loss --------------------------------------------------------------------------------


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_cross_entropy_equals_pytorch(smoothing):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 13, generator=gen)
    targets = torch.randint(0, 13, (3, 5), generator=gen)
    targets[1, 2:] = IGNORE_INDEX
    ours = cross_entropy(logits, targets, label_smoothing=smoothing)
    theirs = F.cross_entropy(
        logits.reshape(-1, 13), targets.flatten(), label_smoothing=smoothing
    )
    assert torch.allclose(ours, theirs, atol=1e-6)
    # classification shape (batch vocab), half-precision logits are computed in float32
    ours = cross_entropy(logits[:, 0].half(), targets[:, 0].clamp(min=0))
    assert ours.dtype == torch.float32
    theirs = F.cross_entropy(logits[:, 0].half().float(), targets[:, 0].clamp(min=0))
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_cross_entropy_gradient_equals_pytorch():
    logits = torch.randn(4, 9, requires_grad=True)
    targets = torch.tensor([1, IGNORE_INDEX, 3, 8])
    (ours,) = torch.autograd.grad(
        cross_entropy(logits, targets, label_smoothing=0.1), logits
    )
    loss = F.cross_entropy(logits, targets, label_smoothing=0.1)
    (theirs,) = torch.autograd.grad(loss, logits)
    assert torch.allclose(ours, theirs, atol=1e-7)


def test_cross_entropy_all_ignored_is_zero_not_nan():
    loss = cross_entropy(torch.randn(2, 3, 5), torch.full((2, 3), IGNORE_INDEX))
    assert loss.item() == 0.0


def test_cross_entropy_bad_input():
    with pytest.raises(ValueError, match="must have the shape of logits"):
        cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="int64"):
        cross_entropy(torch.randn(2, 5), torch.zeros(2))
    with pytest.raises(ValueError, match=r"must be in 0\.\.4 or -100, got 0\.\.5"):
        cross_entropy(torch.randn(2, 5), torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="label_smoothing"):
        cross_entropy(torch.randn(2, 5), torch.tensor([0, 1]), label_smoothing=1.0)


# --- optimiser -------------------------------------------------------------------------------


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_step_equals_torch(weight_decay):
    torch.manual_seed(0)
    weight = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    settings = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    reference = torch.optim.AdamW([weight], **settings)
    ours, m, v = (
        weight.detach().clone(),
        torch.zeros_like(weight),
        torch.zeros_like(weight),
    )
    for t in range(1, 6):
        grad = torch.randn_like(weight)
        weight.grad = grad.clone()
        reference.step()
        before = ours.clone()
        ours, m, v = adamw_step(ours, grad, m, v, t, **settings)
        if t == 1 and weight_decay == 0.0:  # the first step is lr·sign(g)
            assert torch.allclose(ours - before, -3e-3 * grad.sign(), rtol=1e-4)
    assert torch.allclose(ours, weight.detach(), atol=1e-12)
    with pytest.raises(ValueError, match="counts from 1"):
        adamw_step(ours, grad, m, v, 0, lr=1e-3)


@pytest.mark.parametrize(
    "model",
    [
        GPT(tiny_cfg()),
        GPT(
            tiny_cfg(positions="rope", norm="rmsnorm", bias=False, tie_embeddings=False)
        ),
        BERT(tiny_cfg(n_token_types=2, embedding_norm=True, norm_position="post")),
        T5(tiny_cfg(positions="t5", norm="rmsnorm", bias=False, attn_scale=1.0)),
    ],
    ids=["gpt2", "llama", "bert", "t5"],
)
def test_parameter_groups_decay_linear_matrices_only(model):
    decayed, exempt = parameter_groups(model, 0.1)
    assert decayed["weight_decay"] == 0.1 and exempt["weight_decay"] == 0.0
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    assert {id(p) for p in decayed["params"]} == linear
    everything = list(model.parameters())
    assert len(decayed["params"]) + len(exempt["params"]) == len(everything)
    names = {id(p): n for n, p in model.named_parameters()}
    for p in exempt["params"]:
        name = names[id(p)]
        assert (
            p.dim() == 1 or "embed" in name or "position" in name or "head" in name
        ), name
    optimizer = make_optimizer(model, 1e-3)
    assert isinstance(optimizer, torch.optim.AdamW) and len(optimizer.param_groups) == 2


def test_clip_grad_norm_equals_torch():
    a, b = tiny_gpt(), tiny_gpt()
    for model in (a, b):
        model(STREAM[:32].view(2, 16)).pow(2).sum().mul(100).backward()
    ours = clip_grad_norm(a.parameters(), 0.5)
    theirs = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.5)
    assert torch.allclose(ours, theirs)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad)
    # below the threshold nothing changes
    grads = [p.grad.clone() for p in a.parameters()]
    clip_grad_norm(a.parameters(), 10.0)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, a.parameters()))


# --- schedules -------------------------------------------------------------------------------


def test_noam_and_cosine_schedules():
    noam = NoamSchedule(d_model=512, warmup=4000)
    values = [noam(s) for s in range(10_000)]
    assert values.index(max(values)) == 3999
    assert math.isclose(max(values), 512**-0.5 * 4000**-0.5)
    cosine = WarmupCosineSchedule(warmup=10, total=110, min_ratio=0.1)
    assert cosine(0) == pytest.approx(0.1) and cosine(9) == pytest.approx(1.0)
    assert cosine(60) == pytest.approx(0.55) and cosine(110) == pytest.approx(0.1)
    assert cosine(500) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="warmup"):
        WarmupCosineSchedule(warmup=20, total=10)
    with pytest.raises(ValueError, match="d_model"):
        NoamSchedule(d_model=0, warmup=10)


def test_scheduler_state_survives_a_weights_only_round_trip(tmp_path):
    model = tiny_gpt()
    optimizer = make_optimizer(model, 1.0)
    scheduler = make_scheduler(optimizer, NoamSchedule(16, 4))
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    torch.save(scheduler.state_dict(), tmp_path / "s.pt")
    other = make_scheduler(make_optimizer(model, 1.0), NoamSchedule(16, 4))
    other.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert other.last_epoch == 3 and other.get_last_lr() == scheduler.get_last_lr()


# --- checkpoints -----------------------------------------------------------------------------


def test_checkpoint_round_trip_restores_everything(tmp_path):
    model, optimizer, scheduler = fresh()
    train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=2)
    path = save_checkpoint(
        tmp_path / "step-00000002.pt",
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        step=2,
        extra={"note": "hello"},
    )
    draws = (
        torch.rand(2),
        __import__("random").random(),
        __import__("numpy").random.rand(),
    )
    other, other_opt, other_sched = fresh(seed=5)
    state = load_checkpoint(
        path, model=other, optimizer=other_opt, scheduler=other_sched
    )
    again = (
        torch.rand(2),
        __import__("random").random(),
        __import__("numpy").random.rand(),
    )
    assert torch.equal(draws[0], again[0]) and draws[1:] == again[1:]
    assert state["step"] == 2 and state["extra"] == {"note": "hello"}
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    assert other_sched.last_epoch == 2
    assert (
        other_opt.state_dict()["state"][0]["step"]
        == optimizer.state_dict()["state"][0]["step"]
    )
    assert latest_checkpoint(tmp_path) == path
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_checkpoint_of_another_config_names_keys_and_shapes(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", model=tiny_gpt(), step=0)
    with pytest.raises(
        CheckpointError,
        match=r"embed\.tokens\.weight \(20, 16\) in the checkpoint, \(20, 32\)",
    ):
        load_checkpoint(path, model=tiny_gpt(d_model=32))
    with pytest.raises(CheckpointError, match=r"missing keys: decoder\.blocks\.2\."):
        load_checkpoint(path, model=tiny_gpt(n_layers=3))
    with pytest.raises(CheckpointError, match=r"unexpected keys: decoder\.blocks\.1\."):
        load_checkpoint(path, model=tiny_gpt(n_layers=1))


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_checkpoint_is_a_clear_error_and_the_previous_one_survives(
    tmp_path, damage
):
    model, optimizer, scheduler = fresh()
    train(
        model,
        BATCHES,
        optimizer=optimizer,
        scheduler=scheduler,
        n_steps=4,
        checkpoint_dir=tmp_path,
        checkpoint_every=2,
    )
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step-00000004.pt"
    data = latest.read_bytes()
    if damage == "truncate":
        latest.write_bytes(data[: len(data) // 2])
    else:
        latest.write_bytes(b"\x00garbage" + data[8:])
    with pytest.raises(
        CheckpointError, match=r"not a readable checkpoint.*step-00000002\.pt"
    ):
        load_checkpoint(latest, model=fresh()[0])
    with pytest.raises(
        CheckpointError, match="not a readable checkpoint"
    ):  # resume says so too
        train(
            fresh()[0],
            BATCHES,
            optimizer=fresh()[1],
            n_steps=6,
            checkpoint_dir=tmp_path,
            resume=True,
        )
    assert load_checkpoint(tmp_path / "step-00000002.pt", model=fresh()[0])["step"] == 2


def test_interrupted_write_leaves_the_last_good_checkpoint(tmp_path, monkeypatch):
    model = tiny_gpt()
    good = save_checkpoint(tmp_path / "last.pt", model=model, step=1)
    before = good.read_bytes()

    def dies_halfway(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt  # the process is killed mid-write

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path / "last.pt", model=model, step=2)
    assert good.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == [
        "last.pt"
    ]
    monkeypatch.undo()
    assert load_checkpoint(good, model=tiny_gpt())["step"] == 1


def test_load_checkpoint_rejects_other_files(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "missing.pt", model=tiny_gpt())
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(
        CheckpointError, match="not a checkpoint written by lib.training"
    ):
        load_checkpoint(tmp_path / "other.pt", model=tiny_gpt())


# --- the loop --------------------------------------------------------------------------------


def test_resumed_run_repeats_the_uninterrupted_run_exactly(tmp_path):
    model, optimizer, scheduler = fresh()
    whole = train(
        model,
        BATCHES,
        optimizer=optimizer,
        scheduler=scheduler,
        n_steps=6,
        grad_accum=2,
    )
    model, optimizer, scheduler = fresh()
    train(
        model,
        BATCHES,
        optimizer=optimizer,
        scheduler=scheduler,
        n_steps=3,
        grad_accum=2,
        checkpoint_dir=tmp_path,
        checkpoint_every=3,
    )
    model, optimizer, scheduler = fresh(seed=99)
    torch.manual_seed(1234)  # a new process has another random state
    resumed = train(
        model,
        BATCHES,
        optimizer=optimizer,
        scheduler=scheduler,
        n_steps=6,
        grad_accum=2,
        checkpoint_dir=tmp_path,
        resume=True,
    )
    assert resumed.losses == whole.losses and resumed.lrs == whole.lrs
    assert resumed.steps == [1, 2, 3, 4, 5, 6]
    state = torch.load(tmp_path / "step-00000003.pt", weights_only=True)
    assert (
        state["extra"]["config"]["d_model"] == 16
        and state["extra"]["data_position"] == 3
    )


def test_gradient_accumulation_equals_one_big_batch():
    results = []
    for accumulate in (1, 4):
        model = tiny_gpt()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        history = train(
            model, BATCHES, optimizer=optimizer, n_steps=2, grad_accum=accumulate
        )
        results.append(
            (history.losses, [p.detach().clone() for p in model.parameters()])
        )
    (losses_1, params_1), (losses_4, params_4) = results
    assert losses_1 == pytest.approx(losses_4, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(params_1, params_4))


def test_non_finite_loss_stops_with_the_step_and_keeps_the_last_checkpoint(tmp_path):
    model, optimizer, _ = fresh()
    calls = iter(range(100))

    def going_bad(net, batch):
        loss = model_loss(net, batch)
        return loss * math.inf if next(calls) == 4 else loss

    snapshot = {}

    def remember(step):
        snapshot.update({k: v.clone() for k, v in model.state_dict().items()})
        return BATCHES(step)

    with pytest.raises(
        NonFiniteLossError, match=r"loss is (nan|inf) at step 5.*step-00000004\.pt"
    ) as info:
        train(
            model,
            remember,
            optimizer=optimizer,
            n_steps=6,
            loss_fn=going_bad,
            checkpoint_dir=tmp_path,
            checkpoint_every=2,
        )
    assert (
        info.value.step == 5 and info.value.checkpoint == tmp_path / "step-00000004.pt"
    )
    for key, value in model.state_dict().items():  # the bad step was not applied
        assert torch.equal(value, snapshot[key]), key
    assert load_checkpoint(info.value.checkpoint, model=fresh()[0])["step"] == 4


def test_non_finite_gradient_norm_stops_too():
    model, optimizer, _ = fresh()

    def finite_loss_nan_gradient(
        net, batch
    ):  # sqrt at 0: value 0, gradient inf · 0 = nan
        return model_loss(net, batch) + torch.sqrt(net.embed.tokens.weight[0, 0] * 0.0)

    with pytest.raises(NonFiniteLossError, match="gradient norm is nan at step 1"):
        train(
            model,
            BATCHES,
            optimizer=optimizer,
            n_steps=2,
            loss_fn=finite_loss_nan_gradient,
        )


def test_bad_data_is_a_clear_error():
    with pytest.raises(
        ValueError, match=r"holds 10 tokens, fewer than one window of seq_len \+ 1 = 17"
    ):
        lm_batches(torch.arange(10), batch_size=2, seq_len=16)
    with pytest.raises(ValueError, match="fewer than one window"):
        lm_eval_batches(torch.arange(16), batch_size=2, seq_len=16)
    batch = BATCHES(0)
    with pytest.raises(ValueError, match="4 rows does not divide across 3 processes"):
        shard_batch(batch, 0, 3)
    model, optimizer, _ = fresh()
    with pytest.raises(ValueError, match="grad_accum=3"):
        train(model, BATCHES, optimizer=optimizer, n_steps=1, grad_accum=3)


def test_batches_depend_on_the_step_only_and_eval_covers_the_stream():
    again = lm_batches(STREAM, batch_size=4, seq_len=16, seed=0)
    assert torch.equal(BATCHES(7)["inputs"], again(7)["inputs"])
    assert not torch.equal(BATCHES(7)["inputs"], BATCHES(8)["inputs"])
    batch = BATCHES(3)
    assert torch.equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    full = lm_eval_batches(STREAM, batch_size=8, seq_len=16)
    targets = torch.cat([b["targets"] for b in full])
    assert targets.shape == ((len(STREAM) - 1) // 16, 16)
    assert torch.equal(targets.flatten(), STREAM[1 : 1 + targets.numel()])
    model = tiny_gpt().train()
    loss = evaluate(model, full)
    assert model.training and loss == pytest.approx(
        sum(model_loss(model.eval(), b).item() for b in full) / len(full), rel=1e-5
    )


def test_as_batch_and_train_on_every_family():
    from lib.objectives import causal_lm_batch

    assert set(as_batch(causal_lm_batch(STREAM[:34].view(2, 17)))) == {
        "inputs",
        "targets",
    }
    src = torch.randint(1, 20, (4, 7))
    seq2seq = {
        "inputs": src,
        "mask": torch.ones_like(src, dtype=torch.bool),
        "decoder_inputs": torch.randint(0, 20, (4, 5)),
        "targets": torch.randint(0, 20, (4, 5)),
    }
    t5 = T5(tiny_cfg(positions="t5", norm="rmsnorm", bias=False, attn_scale=1.0))
    history = train(
        t5, lambda step: seq2seq, optimizer=make_optimizer(t5, 1e-2), n_steps=5
    )
    assert history.losses[-1] < history.losses[0]
    classifier = SequenceClassifier(BERT(tiny_cfg()), n_classes=3)
    labelled = {"inputs": src, "mask": src > 3, "targets": torch.tensor([0, 1, 2, 1])}
    history = train(
        classifier,
        lambda step: labelled,
        optimizer=make_optimizer(classifier, 1e-2),
        n_steps=5,
    )
    assert history.losses[-1] < history.losses[0] and history.tokens == 5 * src.numel()


# --- memory and speed ---------------------------------------------------------------------------


def test_activation_checkpointing_keeps_gradients_and_generation():
    for model in (
        tiny_gpt(dropout=0.1),
        T5(
            tiny_cfg(
                positions="t5", norm="rmsnorm", bias=False, attn_scale=1.0, dropout=0.1
            )
        ),
    ):
        model.train()
        ids = STREAM[:32].view(2, 16)

        def grads(model=model, ids=ids):
            model.zero_grad()
            torch.manual_seed(0)
            out = model(ids) if isinstance(model, GPT) else model(ids, ids[:, :8])
            out.float().pow(2).mean().backward()
            return [p.grad.clone() for p in model.parameters()]

        plain = grads()
        assert enable_activation_checkpointing(model) == len(model.decoder.blocks) + (
            len(model.encoder.blocks) if isinstance(model, T5) else 0
        )
        checkpointed = grads()
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, checkpointed))
        copied = copy.deepcopy(model)  # the bound forward follows the copy
        assert copied.decoder.blocks[0].forward.__self__ is copied.decoder.blocks[0]
        if isinstance(model, GPT):
            with torch.no_grad():
                _, cache = model.eval().step(ids[:, :4])  # the cached path still works
            assert cache.seq_len == 4
        disable_activation_checkpointing(model)
        assert "forward" not in vars(model.decoder.blocks[0])
    with pytest.raises(ValueError, match="no TransformerBlock"):
        enable_activation_checkpointing(nn.Linear(2, 2))


def test_flops_and_peak():
    model = tiny_gpt()
    n = (
        sum(p.numel() for p in model.parameters()) - 16 * 16
    )  # without the position table
    assert training_flops_per_token(model, 16) == 6 * n + 12 * 2 * 16 * 16
    assert peak_flops("cpu") is None


# --- runs' plumbing ----------------------------------------------------------------------------


def test_char_vocabulary_and_pair_split():
    vocab = CharVocabulary("hello", specials=("<pad>", "</s>"))
    assert vocab["<pad>"] == 0 and vocab.vocab_size == 2 + 4
    assert vocab.decode([*vocab.encode("hole"), 1]) == "hole"
    assert vocab.decode([0, *vocab.encode("he")], skip_specials=False) == "<pad>he"
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        vocab.encode("zoo")
    pairs = [(f"s{i % 40}", f"t{i}") for i in range(100)]
    train_part, test_part = split_pairs_by_source(pairs, 0.25, seed=3)
    assert sorted(train_part + test_part) == sorted(pairs)
    assert not {s for s, _ in train_part} & {s for s, _ in test_part}
    assert len({s for s, _ in test_part}) == 10


def test_every_run_has_every_profile_and_colab_keeps_the_full_models():
    for run, by_profile in RUN_SIZES.items():
        assert set(by_profile) == set(PROFILES), run
        colab, full = by_profile["colab"], by_profile["full"]
        assert set(colab) == set(full), run
        for key in ("d_model", "n_heads", "n_layers", "seq_len"):
            assert colab.get(key) == full.get(key), (run, key)
        assert colab["n_steps"] < full["n_steps"]


def test_progress_bar_in_colab_and_full_not_in_smoke(monkeypatch, capsys):
    for profile, shown in (("smoke", False), ("colab", True), ("full", True)):
        monkeypatch.setenv("TFS_PROFILE", profile)
        model, optimizer, scheduler = fresh()
        train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=2)
        assert ("train:" in capsys.readouterr().err) == shown, profile


def test_run_flops_counts_the_gpt_run_tokens():
    sizes = RUN_SIZES["gpt"]["smoke"]
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


def test_run_flops_samples_t5_batches_close_to_the_exact_count():
    from lib.training import _t5_data, _tokens_in

    sizes = RUN_SIZES["t5"]["smoke"]
    _, _, _, batch_at, _ = _t5_data(sizes, 0)
    exact = sum(_tokens_in(batch_at(step)) for step in range(sizes["n_steps"]))
    work = run_flops("t5", "smoke")
    assert work["train_tokens"] == pytest.approx(exact, rel=0.05)
    assert work["steps"] == sizes["n_steps"]


def test_gpu_seconds():
    assert gpu_seconds(6.5e13, peak="T4", mfu=0.5) == pytest.approx(2.0)
    assert gpu_seconds(1e15, 400, peak=1e15, mfu=1.0, step_overhead=0.005) == (
        pytest.approx(1.0 + 2.0)
    )
    with pytest.raises(ValueError, match="unknown GPU 'TPU'"):
        gpu_seconds(1e12, peak="TPU")
    with pytest.raises(ValueError, match="mfu must be in"):
        gpu_seconds(1e12, mfu=1.5)


def test_estimate_run_seconds():
    flops = run_flops("bert", "colab")["flops"]
    assert estimate_run_seconds("bert", "colab") == pytest.approx(flops / (65e12 * 0.3))
    seconds = estimate_run_seconds("bert", "colab", peak=1e15, mfu=0.5)
    assert seconds == pytest.approx(flops / 5e14)
    h100 = estimate_run_seconds("bert", "colab", peak="H100", mfu=0.3)
    assert h100 == pytest.approx(flops / (989e12 * 0.3))
    # step_overhead: seconds per optimiser step on top of the FLOPs' time
    sizes = RUN_SIZES["bert"]["colab"]
    steps = sizes["n_steps"] + 2 * sizes["finetune_steps"]  # pre-training, 2 fine-tunes
    assert run_flops("bert", "colab")["steps"] == steps
    slow = estimate_run_seconds("bert", "colab", mfu=0.1, step_overhead=0.005)
    assert slow == pytest.approx(flops / (65e12 * 0.1) + steps * 0.005)
    overhead_only = slow - estimate_run_seconds("bert", "colab", mfu=0.1)
    assert overhead_only == pytest.approx(steps * 0.005)
    for run in RUN_SIZES:  # more work in colab than in smoke, less than in full
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


def test_main_rejects_an_unknown_profile(capsys):
    with pytest.raises(SystemExit):
        main(["--run", "gpt", "--profile", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_main_writes_the_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TFS_PROFILE", "smoke")
    record = main(["--run", "gpt", "--steps", "2", "--out", str(tmp_path), "--quiet"])
    saved = json.loads((tmp_path / "metrics.json").read_text())
    for key in (
        "metrics",
        "wall_seconds",
        "gpu",
        "torch",
        "commit",
        "command",
        "curves",
    ):
        assert key in saved
    assert (
        saved["command"]
        == f"python -m lib.training --run gpt --steps 2 --out {tmp_path} --quiet"
    )
    assert saved["torch"] == torch.__version__ and record["metrics"] == saved["metrics"]
    assert (tmp_path / "loss.png").is_file() and (tmp_path / "gpt_train.csv").is_file()
    lines = (tmp_path / "gpt_train.csv").read_text().splitlines()
    assert lines[0] == "step,loss,lr" and len(lines) == 3


# --- data parallel: two CPU processes with gloo ------------------------------------------------


def _ddp_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    got_rank, got_world, device = distributed_setup(backend="gloo")
    assert (got_rank, got_world, device.type) == (rank, world, "cpu")
    model = tiny_gpt(dropout=0.0)
    ddp = DistributedDataParallel(model)
    model_loss(ddp, shard_batch(BATCHES(0), rank, world)).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    trained = tiny_gpt(dropout=0.0)
    history = train(
        trained,
        BATCHES,
        optimizer=torch.optim.SGD(trained.parameters(), lr=0.5),
        n_steps=3,
    )
    if rank == 0:
        torch.save(
            {
                "grads": grads,
                "params": list(trained.state_dict().values()),
                "losses": history.losses,
            },
            Path(out) / "ddp.pt",
        )
    dist.destroy_process_group()


def test_two_process_ddp_equals_one_process_on_the_combined_batch(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    parallel = torch.load(tmp_path / "ddp.pt", weights_only=True)
    model = tiny_gpt(dropout=0.0)
    model_loss(model, BATCHES(0)).backward()
    for got, want in zip(parallel["grads"], [p.grad for p in model.parameters()]):
        assert torch.allclose(got, want, atol=1e-6)
    single = tiny_gpt(dropout=0.0)
    history = train(
        single,
        BATCHES,
        optimizer=torch.optim.SGD(single.parameters(), lr=0.5),
        n_steps=3,
    )
    assert parallel["losses"] == pytest.approx(history.losses, rel=1e-5)
    for got, want in zip(parallel["params"], single.state_dict().values()):
        assert torch.allclose(got, want, atol=1e-5)
