"""lib.training: loss, optimiser, schedules, checkpoints, the loop, DDP; with the
batches of lib.batches and the memory and speed helpers of lib.efficiency."""

from __future__ import annotations

import copy
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

from lib.batches import as_batch, lm_batches, lm_eval_batches
from lib.efficiency import (
    disable_activation_checkpointing,
    distributed_setup,
    enable_activation_checkpointing,
    gpu_seconds,
    peak_flops,
    training_flops_per_token,
)
from lib.models import BERT, GPT, T5, SequenceClassifier, TransformerConfig
from lib.objectives import IGNORE_INDEX
from lib.training import (
    CheckpointError,
    NoamSchedule,
    NonFiniteLossError,
    WarmupCosineSchedule,
    adamw_step,
    clip_grad_norm,
    cross_entropy,
    evaluate,
    latest_checkpoint,
    load_checkpoint,
    make_optimizer,
    make_scheduler,
    model_loss,
    parameter_groups,
    save_checkpoint,
    set_rng_states,
    shard_batch,
    train,
    unwrap_model,
)

# one torch thread for every test here (conftest.py says why)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
    with pytest.raises(
        ValueError,
        match=r"targets must be in 0\.\.4, got 0\.\.5; a target to skip is ignore_index=-100",
    ):
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


def test_make_optimizer_fuses_on_the_cpu_and_gives_the_unfused_update():
    """PyTorch's fused AdamW is make_optimizer's default on the CPU as on CUDA: the
    same update as the unfused one, over steps with weight decay and without."""
    fused_model, plain_model = tiny_gpt(), tiny_gpt()
    fused = make_optimizer(fused_model, 1e-2, betas=(0.9, 0.99), eps=1e-8)
    plain = make_optimizer(plain_model, 1e-2, betas=(0.9, 0.99), eps=1e-8, fused=False)
    assert fused.defaults["fused"] is True and not plain.defaults["fused"]
    for step in range(5):
        ids = STREAM[32 * step : 32 * step + 32].view(2, 16)
        for model, optimizer in ((fused_model, fused), (plain_model, plain)):
            optimizer.zero_grad()
            model(ids).logsumexp(-1).mean().backward()
            optimizer.step()
    moved = [
        (a - b).abs().max()
        for a, b in zip(fused_model.parameters(), tiny_gpt().parameters())
    ]
    assert max(moved) > 1e-3  # the steps moved the weights
    # the same update up to fp32 rounding (each step moves a weight by up to lr = 1e-2)
    for a, b in zip(fused_model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)


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
    # resume says so too, and falls back to the newest intact checkpoint (issue 19)
    model, optimizer, _ = fresh()
    with pytest.warns(
        UserWarning, match="older checkpoint: .*not a readable checkpoint"
    ):
        history = train(
            model,
            BATCHES,
            optimizer=optimizer,
            n_steps=6,
            checkpoint_dir=tmp_path,
            resume=True,
        )
    assert history.steps == [1, 2, 3, 4, 5, 6]  # 1, 2 from step-2's history, then 3..6
    assert load_checkpoint(tmp_path / "step-00000002.pt", model=fresh()[0])["step"] == 2


def test_interrupted_write_leaves_the_last_good_checkpoint(tmp_path, monkeypatch):
    model = tiny_gpt()
    good = save_checkpoint(tmp_path / "last.pt", model=model, step=1)
    before = good.read_bytes()

    def dies_halfway(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a file")
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
        state["model"]["config"]["d_model"] == 16
        and state["model"]["kind"] == "gpt"
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
    # the last batch is shorter: the loss per target, not the batches' mean
    assert model.training and len(full[-1]["targets"]) < len(full[0]["targets"])
    summed = [model_loss(model.eval(), b).item() * b["targets"].numel() for b in full]
    assert loss == pytest.approx(sum(summed) / targets.numel(), rel=1e-5)


def _per_target_loss(model: nn.Module, batches: list[dict]) -> float:
    """The mean cross-entropy over every target of ``batches``, straight from the
    logits (``IGNORE_INDEX`` left out): what evaluate() must return."""
    with torch.no_grad():
        logits = torch.cat([model.eval()(b["inputs"]).flatten(0, 1) for b in batches])
    targets = torch.cat([b["targets"].flatten() for b in batches])
    summed = F.cross_entropy(
        logits, targets, ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return summed.item() / int((targets != IGNORE_INDEX).sum())


def test_evaluate_is_the_mean_over_targets_of_batches_of_any_size():
    """A short batch, and one whose targets are mostly ignored, count for their targets
    only: evaluate() is the loss per target of all the batches, not a mean of means."""
    model = tiny_gpt()
    with torch.no_grad():  # sharper logits: losses that differ from batch to batch
        for p in model.parameters():
            p.mul_(4)
    windows = lm_eval_batches(STREAM[:600], batch_size=8, seq_len=16)
    assert [len(b["targets"]) for b in windows] == [8, 8, 8, 8, 5]
    padded = {k: v.clone() for k, v in windows[0].items()}
    padded["targets"][:, 3:] = IGNORE_INDEX  # 3 targets of 16 left per row
    padded["targets"][5:] = IGNORE_INDEX  # and 3 rows with none at all
    for batches in (windows, [*windows, padded]):
        means = [model_loss(model, b).item() for b in batches]
        direct = _per_target_loss(model, batches)
        assert evaluate(model, batches) == pytest.approx(direct, rel=1e-5)
        assert sum(means) / len(means) != pytest.approx(direct, rel=1e-3)
    # n_batches of a callable: the first n, weighted the same way
    assert evaluate(model, lambda i: windows[i], n_batches=5) == pytest.approx(
        _per_target_loss(model, windows), rel=1e-5
    )
    nothing = {**padded, "targets": torch.full_like(padded["targets"], IGNORE_INDEX)}
    assert evaluate(model, [nothing, windows[-1]]) == pytest.approx(
        _per_target_loss(model, windows[-1:]), rel=1e-5
    )
    with pytest.raises(ValueError, match="no targets"):
        evaluate(model, [nothing])


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


def test_gpu_seconds():
    assert gpu_seconds(6.5e13, peak="T4", mfu=0.5) == pytest.approx(2.0)
    assert gpu_seconds(1e15, 400, peak=1e15, mfu=1.0, step_overhead=0.005) == (
        pytest.approx(1.0 + 2.0)
    )
    with pytest.raises(ValueError, match="unknown GPU 'TPU'"):
        gpu_seconds(1e12, peak="TPU")
    with pytest.raises(ValueError, match="mfu must be in"):
        gpu_seconds(1e12, mfu=1.5)


# --- data parallel: two CPU processes with gloo ------------------------------------------------

# The processes are spawned, not forked: a process forked from a pytest worker whose
# torch has started its thread pool can hang on a lock held by a thread it did not
# inherit (seen here: a forked gloo worker waited forever on a futex under xdist).
START_METHOD = "spawn"


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
    mp.start_processes(
        _ddp_worker, args=(2, port, str(tmp_path)), nprocs=2, start_method=START_METHOD
    )
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


# --- issue 19: training you can trust --------------------------------------------------------


def test_non_finite_step_between_logs_reaches_neither_weights_nor_checkpoints(tmp_path):
    model, optimizer, _ = fresh()
    calls = iter(range(100))

    def going_bad(net, batch):  # step 5 (unlogged with log_every=3) goes NaN
        loss = model_loss(net, batch)
        return loss * math.nan if next(calls) == 4 else loss

    with pytest.raises(
        NonFiniteLossError, match=r"loss is nan at step 5; found at step 6"
    ) as info:
        train(model, BATCHES, optimizer=optimizer, n_steps=8, loss_fn=going_bad,
              log_every=3, checkpoint_dir=tmp_path, checkpoint_every=2)  # fmt: skip
    assert (
        info.value.step == 5 and info.value.checkpoint == tmp_path / "step-00000004.pt"
    )
    assert "no non-finite value reached the weights" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000002.pt",
        "step-00000004.pt",
    ]  # no checkpoint after the bad step
    assert all(torch.isfinite(p).all() for p in model.parameters())
    state = load_checkpoint(info.value.checkpoint, model=fresh()[0])
    weights = state["model"]["state_dict"].values()
    assert all(torch.isfinite(v).all() for v in weights)


def test_non_finite_gradient_between_logs_is_found_at_the_end():
    model, optimizer, _ = fresh()
    calls = iter(range(100))

    def nan_gradient_at_step_2(net, batch):
        loss = model_loss(net, batch)
        if next(calls) == 1:  # a finite loss whose gradient is NaN (sqrt at 0)
            loss = loss + torch.sqrt(net.embed.tokens.weight[0, 0] * 0.0)
        return loss

    with pytest.raises(NonFiniteLossError, match="gradient norm is nan at step 2"):
        train(model, BATCHES, optimizer=optimizer, n_steps=3, log_every=5,
              loss_fn=nan_gradient_at_step_2)  # fmt: skip
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_checkpoint_options_are_checked(tmp_path):
    model, optimizer, _ = fresh()
    common = dict(optimizer=optimizer, n_steps=1)
    for options, message in (
        (dict(checkpoint_every=1), "checkpoint_every and resume need a checkpoint_dir"),
        (dict(resume=True), "checkpoint_every and resume need a checkpoint_dir"),
        (dict(eval_every=1), "eval_every needs eval_batches"),
        (dict(eval_every=1, eval_batches=BATCHES), "or with eval_iters"),
        (dict(checkpoint_dir=tmp_path, keep_checkpoints=0), "keep_checkpoints must be"),
        (
            dict(checkpoint_dir=tmp_path, keep_checkpoints=-1),
            "keep_checkpoints must be",
        ),
        (dict(max_grad_norm=-1.0), "max_norm must be > 0"),
        (dict(eval_every=-1), "eval_every must be an int >= 0"),
    ):
        with pytest.raises(ValueError, match=message):
            train(model, BATCHES, **common, **options)
    assert not list(tmp_path.iterdir())
    with pytest.raises(TypeError, match="optimizer must be an optimizer"):
        train(model, BATCHES, optimizer=model.parameters(), n_steps=1)
    with pytest.raises(TypeError, match="resume must be True or False"):
        train(model, BATCHES, **common, checkpoint_dir=tmp_path, resume="yes")
    with pytest.raises(TypeError, match="must be callable"):
        train(model, [BATCHES(0)], **common)


def test_checkpoint_extra_is_made_plain_or_refused(tmp_path):
    import numpy as np

    extra = {
        "n": np.int64(3),
        "x": np.float32(0.5),
        "where": tmp_path,
        "a": np.arange(3),
    }
    path = save_checkpoint(tmp_path / "c.pt", model=tiny_gpt(), step=1, extra=extra)
    state = load_checkpoint(path, model=tiny_gpt())
    assert state["extra"]["n"] == 3 and type(state["extra"]["n"]) is int
    assert state["extra"]["where"] == str(tmp_path) and state["extra"]["x"] == 0.5
    assert torch.equal(state["extra"]["a"], torch.arange(3))
    with pytest.raises(CheckpointError, match=r"cannot save extra\['model'\], a GPT"):
        save_checkpoint(tmp_path / "d.pt", model=tiny_gpt(), step=1,
                        extra={"model": tiny_gpt()})  # fmt: skip
    assert not (tmp_path / "d.pt").exists()


def test_an_unreadable_checkpoint_error_keeps_the_whole_cause(tmp_path):
    path = save_checkpoint(tmp_path / "step-00000001.pt", model=tiny_gpt(), step=1)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="not a readable checkpoint") as info:
        load_checkpoint(path, model=tiny_gpt())
    cause = info.value.__cause__
    assert info.value.damaged and f"{type(cause).__name__}: {cause}" in str(info.value)


def _flip_a_byte_inside_a_tensor(path: Path, tensor: torch.Tensor) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(tensor.numpy().tobytes()[:64])
    assert at > 0
    data[at + 17] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_found_and_resume_falls_back_to_an_intact_checkpoint(
    tmp_path,
):
    model, optimizer, scheduler = fresh()
    train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=4,
          checkpoint_dir=tmp_path, checkpoint_every=2)  # fmt: skip
    newest = tmp_path / "step-00000004.pt"
    _flip_a_byte_inside_a_tensor(newest, model.embed.tokens.weight.detach())
    with pytest.raises(CheckpointError, match="is damaged: not its sha256"):
        load_checkpoint(newest, model=fresh()[0])
    model, optimizer, scheduler = fresh()
    with pytest.warns(
        UserWarning, match="older checkpoint: .*step-00000004.pt is damaged"
    ):
        history = train(model, BATCHES, optimizer=optimizer, scheduler=scheduler,
                        n_steps=5, checkpoint_dir=tmp_path, checkpoint_every=5,
                        resume=True)  # fmt: skip
    assert history.steps == [1, 2, 3, 4, 5]  # resumed after step 2
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["step-00000004.pt", "step-00000005.pt"]  # the damaged 4, a new 5
    newest = tmp_path / "step-00000005.pt"  # damage it too: nothing intact is left
    saved = torch.load(newest, weights_only=True)["model"]["state_dict"]
    _flip_a_byte_inside_a_tensor(newest, saved["embed.tokens.weight"])
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="no intact"):
        train(fresh()[0], BATCHES, optimizer=fresh()[1], n_steps=6,
              checkpoint_dir=tmp_path, resume=True)  # fmt: skip


# a process id that no process has (above Linux's largest, 2**22)
DEAD_PID = 2**30 + 17


def test_stale_temporaries_of_a_killed_save_are_removed_on_start(tmp_path):
    stale = tmp_path / f".step-00000002.pt.{DEAD_PID}.tmp"
    stale.write_bytes(b"PK\x03\x04 half a file")
    model, optimizer, _ = fresh()
    train(model, BATCHES, optimizer=optimizer, n_steps=1, checkpoint_dir=tmp_path)
    assert not stale.exists()


def test_resume_refuses_another_configuration_naming_the_fields(tmp_path):
    model, optimizer, _ = fresh()
    train(model, BATCHES, optimizer=optimizer, n_steps=2,
          checkpoint_dir=tmp_path, checkpoint_every=2)  # fmt: skip
    # the same shapes, another model: its weights would compute another thing
    model = tiny_gpt(activation="relu", dropout=0.1)
    before = copy.deepcopy(model.state_dict())
    optimizer = make_optimizer(model, 1e-2)
    with pytest.raises(
        CheckpointError, match=r"activation: 'gelu' in the checkpoint, 'relu' now"
    ):
        train(model, BATCHES, optimizer=optimizer, n_steps=4,
              checkpoint_dir=tmp_path, resume=True)  # fmt: skip
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_resume_keeps_the_new_schedule_and_learning_rate(tmp_path):
    """The rule: the checkpoint gives the state and the position, the caller the
    settings. A run extended from 4 to 40 steps follows its 40-step schedule, at the
    new base rate, and the caller's schedule object is not overwritten."""
    model, optimizer, scheduler = fresh(total=4)
    train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=4,
          checkpoint_dir=tmp_path, checkpoint_every=4)  # fmt: skip
    model = tiny_gpt(7, dropout=0.1)
    optimizer = make_optimizer(model, 2e-2, betas=(0.9, 0.99), eps=1e-8)
    longer = WarmupCosineSchedule(2, 40)
    scheduler = make_scheduler(optimizer, longer)
    history = train(model, BATCHES, optimizer=optimizer, scheduler=scheduler,
                    n_steps=7, checkpoint_dir=tmp_path, resume=True)  # fmt: skip
    assert longer.total == 40 and scheduler.lr_lambdas[0] is longer
    assert history.lrs[4:] == [2e-2 * longer(step) for step in (4, 5, 6)]
    assert history.lrs[:4] == [1e-2 * WarmupCosineSchedule(2, 4)(s) for s in range(4)]
    assert optimizer.state_dict()["state"][0]["step"] == 7  # Adam's moments went on


def test_bad_inputs_name_the_argument():
    w = torch.zeros(3)
    cases = [
        (lambda: adamw_step(w, w, w, w, 1, lr=-1e-3), ValueError, "lr must be"),
        (lambda: adamw_step(w, w, w, w, 1, lr=1e-3, betas=(1.0, 0.999)), ValueError,
         r"betas\[0\] must be a finite number in \[0, 1\)"),
        (lambda: adamw_step(w, w, w, w, 1, lr=1e-3, betas=0.9), TypeError, "betas must be a pair"),
        (lambda: adamw_step(w, w[:2], w, w, 1, lr=1e-3), ValueError, "share a shape"),
        (lambda: adamw_step(w, w.long(), w, w, 1, lr=1e-3), TypeError, "grad"),
        (lambda: adamw_step(w, w, w, w, 1, lr=1e-3, eps=0.0), ValueError, "eps must be"),
        (lambda: make_optimizer(tiny_gpt(), math.inf), ValueError, "lr must be a finite"),
        (lambda: make_optimizer(tiny_gpt(), 1e-3, weight_decay=-0.1), ValueError,
         "weight_decay must be"),
        (lambda: parameter_groups("gpt", 0.1), TypeError, "model must be a torch.nn.Module"),
        (lambda: clip_grad_norm([], -1.0), ValueError, "max_norm must be > 0"),
        (lambda: clip_grad_norm([], math.nan), ValueError, "max_norm must be > 0"),
        (lambda: clip_grad_norm([], "1"), TypeError, "max_norm must be a number"),
        (lambda: WarmupCosineSchedule(warmup=2.5, total=10), TypeError, "warmup must be an int"),
        (lambda: WarmupCosineSchedule(2, 10, min_ratio=math.nan), ValueError, "min_ratio"),
        (lambda: NoamSchedule(d_model=16, warmup=4.0), TypeError, "warmup must be an int"),
        (lambda: make_scheduler(tiny_gpt(), NoamSchedule(16, 4)), TypeError, "optimizer must be an optimizer"),
        (lambda: shard_batch(BATCHES(0), 3, 3), ValueError, r"rank must be an int in 0\.\.2"),
        (lambda: shard_batch(BATCHES(0), 0, 0), ValueError, "world_size must be an int >= 1"),
        (lambda: as_batch([1, 2]), TypeError, "batch must be a batch dict"),
        (lambda: as_batch({"inputs": [1, 2]}), TypeError, "inputs must be a"),
        (lambda: lm_batches(STREAM.float(), 2, 4), TypeError, "tokens must be integer ids"),
        (lambda: lm_batches(STREAM, 2, 4, seed=-1), ValueError, "seed must be an int >= 0"),
        (lambda: lm_batches(STREAM, 2, 4, objective=3), TypeError, "objective must be"),
        (lambda: lm_batches(STREAM, 0, 4), ValueError, "batch_size must be"),
        (lambda: model_loss(tiny_gpt(), {"inputs": STREAM[:4][None]}), ValueError,
         "a batch is a dict with 'inputs' and 'targets'"),
        (lambda: evaluate(tiny_gpt(), []), ValueError, "non-empty list"),
        (lambda: evaluate(tiny_gpt(), BATCHES), ValueError, "with n_batches"),
        (lambda: evaluate(tiny_gpt(), BATCHES, n_batches=0), ValueError, "n_batches must be"),
        (lambda: train(tiny_gpt(), BATCHES, optimizer=fresh()[1], n_steps=0), ValueError,
         "n_steps must be"),
        (lambda: save_checkpoint("x.pt", model=tiny_gpt(), step=-1), ValueError, "step must be"),
        (lambda: load_checkpoint("x.pt", model=tiny_gpt(), restore_rng="no"), TypeError,
         "restore_rng must be True or False"),
        (lambda: set_rng_states({}), ValueError, "states must be a dict of rng_states"),
        (lambda: unwrap_model("model"), TypeError, "model must be a torch.nn.Module"),
        (lambda: training_flops_per_token(tiny_gpt(), 0), ValueError, "seq_len must be"),
        (lambda: distributed_setup(backend="mpi"), ValueError, "backend must be one of"),
        (lambda: gpu_seconds(math.nan), ValueError, "flops must be a finite number"),
        (lambda: gpu_seconds(1e12, -3), ValueError, "steps must be a finite number >= 0"),
    ]  # fmt: skip
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


def _seq2seq_batch() -> dict[str, torch.Tensor]:
    """Six source/target pairs whose targets are padded (IGNORE_INDEX) unevenly, so the
    shards of 2 or 3 processes hold different numbers of targets."""
    gen = torch.Generator().manual_seed(3)
    targets = torch.randint(1, 20, (6, 7), generator=gen)
    for row, length in enumerate((7, 6, 2, 1, 5, 3)):
        targets[row, length:] = IGNORE_INDEX
    src = torch.randint(1, 20, (6, 5), generator=gen)
    decoder_inputs = torch.cat(
        [torch.zeros(6, 1, dtype=torch.long), targets[:, :-1]], 1
    )
    return {
        "inputs": src,
        "mask": torch.ones_like(src, dtype=torch.bool),
        "decoder_inputs": decoder_inputs.clamp(min=0),
        "targets": targets,
    }


def _tiny_t5() -> T5:
    torch.manual_seed(0)
    return T5(tiny_cfg(positions="t5", norm="rmsnorm", bias=False, attn_scale=1.0))


def _t5_step_and_evaluations(model: T5) -> dict[str, object]:
    """One SGD step of train() on the padded batch, then evaluate() on uneven batches."""
    batch = _seq2seq_batch()
    history = train(model, lambda step: batch, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), n_steps=1)  # fmt: skip
    uneven = [
        {k: v[:5] for k, v in batch.items()},
        {k: v[5:] for k, v in batch.items()},
    ]
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "loss": history.losses,
        "eval": evaluate(model, uneven),  # 5 rows and 1 row over 3 processes
    }


def _t5_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))  # fmt: skip
    torch.set_num_threads(1)
    distributed_setup(backend="gloo")
    result = _t5_step_and_evaluations(_tiny_t5())
    if rank == 0:
        torch.save(result, Path(out) / "t5.pt")
    dist.destroy_process_group()


def test_padded_targets_give_the_same_step_on_3_processes_as_on_one(tmp_path):
    """The loss is a mean over every target of the step, not a mean of the processes'
    means: T5's padded targets give the same gradient with 3 processes as with one."""
    batch = _seq2seq_batch()
    model = _tiny_t5()
    whole = torch.autograd.grad(model_loss(model, batch), list(model.parameters()))
    shards = [shard_batch(batch, rank, 3) for rank in range(3)]
    means = [torch.autograd.grad(model_loss(model, s), list(model.parameters())) for s in shards]  # fmt: skip
    mean_of_means = [sum(parts) / 3 for parts in zip(*means)]
    assert not all(
        torch.allclose(a, b, atol=1e-4) for a, b in zip(whole, mean_of_means)
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(
        _t5_worker, args=(3, port, str(tmp_path)), nprocs=3, start_method=START_METHOD
    )
    parallel = torch.load(tmp_path / "t5.pt", weights_only=True)
    single = _t5_step_and_evaluations(_tiny_t5())
    assert parallel["loss"] == pytest.approx(single["loss"], rel=1e-6)
    assert parallel["eval"] == pytest.approx(single["eval"], rel=1e-6)
    for got, want in zip(parallel["params"], single["params"]):
        assert torch.allclose(got, want, atol=1e-6)


# --- issue 30: one model file inside each checkpoint; issue 32: bad input -------------


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_load_checkpoint_changes_nothing_when_the_optimizer_does_not_fit(tmp_path):
    model, optimizer, scheduler = fresh()
    train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=2)
    path = save_checkpoint(tmp_path / "c.pt", model=model, optimizer=optimizer,
                           scheduler=scheduler, step=2)  # fmt: skip
    target = tiny_gpt(seed=5)  # the same shapes, other weights
    before = _weights(target)
    one_group = torch.optim.AdamW(target.parameters(), lr=1e-3)  # the file: two
    frozen = tiny_gpt(seed=5)
    frozen.embed.tokens.weight.requires_grad_(False)  # a group holds one fewer
    other_shapes = make_optimizer(tiny_gpt(d_model=32), 1e-3)  # same group sizes
    sched = make_scheduler(one_group, WarmupCosineSchedule(2, 6))
    for optim, message in (
        (one_group, "the optimizer has 1 parameter groups, the file 2"),
        (make_optimizer(frozen, 1e-3), r"the optimizer's groups hold \[\d+, \d+\]"),
        (
            other_shapes,
            r"exp_avg of parameter \d+: \(\d+, 16\) in the checkpoint, \(\d+, 32\)",
        ),
    ):
        draw = torch.get_rng_state()
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(path, model=target, optimizer=optim,
                            scheduler=sched if optim is one_group else None)  # fmt: skip
        assert _unchanged(target, before)  # the model was not half-loaded
        assert not optim.state  # nor the optimiser
        assert torch.equal(torch.get_rng_state(), draw)  # nor the generators
    assert sched.last_epoch == 0
    # the same objects with an optimiser that fits load at once
    state = load_checkpoint(path, model=target, optimizer=make_optimizer(target, 1e-3))
    assert state["step"] == 2 and _unchanged(target, _weights(model))


def test_resume_across_attention_backend_and_dropout(tmp_path):
    """What only changes how a model runs may differ: a run checkpointed with one
    backend and dropout resumes with others (a GPU's flash_triton, a CPU's sdpa)."""
    model = tiny_gpt(attn_backend="math", dropout=0.1)
    optimizer = make_optimizer(model, 1e-2)
    train(model, BATCHES, optimizer=optimizer, n_steps=2,
          checkpoint_dir=tmp_path, checkpoint_every=2)  # fmt: skip
    resumed = tiny_gpt(seed=3, attn_backend="sdpa", dropout=0.0)
    history = train(resumed, BATCHES, optimizer=make_optimizer(resumed, 1e-2),
                    n_steps=3, checkpoint_dir=tmp_path, resume=True)  # fmt: skip
    assert history.steps == [1, 2, 3]  # 1, 2 from the checkpoint, then 3
    assert resumed.cfg.attn_backend == "sdpa" and resumed.cfg.dropout == 0.0


def test_strict_config_false_resumes_another_configuration_on_purpose(tmp_path):
    model, optimizer, _ = fresh()
    train(model, BATCHES, optimizer=optimizer, n_steps=2,
          checkpoint_dir=tmp_path, checkpoint_every=2)  # fmt: skip
    relu = tiny_gpt(seed=3, activation="relu")
    with pytest.warns(UserWarning, match="activation: 'gelu' in the checkpoint"):
        history = train(relu, BATCHES, optimizer=make_optimizer(relu, 1e-2),
                        n_steps=2, checkpoint_dir=tmp_path, resume=True,
                        strict_config=False)  # fmt: skip
    assert history.steps == [1, 2] and _unchanged(relu, _weights(model))
    # what cannot load stays refused
    wider = tiny_gpt(d_model=32)
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_checkpoint(tmp_path / "step-00000002.pt", model=wider,
                        strict_config=False)  # fmt: skip
    with pytest.raises(TypeError, match="strict_config must be True or False"):
        train(relu, BATCHES, optimizer=make_optimizer(relu, 1e-2), n_steps=1,
              strict_config="no")  # fmt: skip


def test_a_checkpoint_holds_a_model_file_that_load_model_reads(tmp_path):
    from lib.model_file import load_model

    model, optimizer, _ = fresh()
    train(model, BATCHES, optimizer=optimizer, n_steps=2,
          checkpoint_dir=tmp_path, checkpoint_every=2)  # fmt: skip
    saved = load_model(tmp_path / "step-00000002.pt", dropout=0.0)
    assert saved.kind == "gpt" and saved.config == replace_cfg(model.cfg, dropout=0.0)
    ids = BATCHES(0)["inputs"]
    with torch.no_grad():
        assert torch.equal(saved.model(ids), model.eval()(ids))


def _tokenizers() -> dict[str, object]:
    from lib.tokenizer import BPETokenizer, CharTokenizer

    bpe = BPETokenizer().train("low lower lowest newer newest " * 4, 262, ["<eos>"])
    return {"none": None, "char": CharTokenizer("to be or not"), "bpe": bpe}


@pytest.mark.parametrize("which", ["none", "char", "bpe"])
def test_a_checkpoint_carries_its_tokenizer(tmp_path, which):
    """Issue 40: save_checkpoint(tokenizer=...) stores it in the checkpoint's model
    file; load_checkpoint gives it back, rebuilt, as ``state["tokenizer"]``, and
    lib.model_file.load_model reads it from the same file."""
    from lib.model_file import load_model

    tokenizer = _tokenizers()[which]
    path = save_checkpoint(tmp_path / "step-00000001.pt", model=tiny_gpt(), step=1,
                           tokenizer=tokenizer)  # fmt: skip
    state = load_checkpoint(path, model=tiny_gpt(seed=1), restore_rng=False)
    again = load_model(path).tokenizer
    if tokenizer is None:
        assert state["tokenizer"] is None and again is None
        return
    sample = "to be" if which == "char" else "lowest newer<eos>"
    for back in (state["tokenizer"], again):
        assert type(back) is type(tokenizer)
        assert back.encode(sample) == tokenizer.encode(sample)
        assert back.vocab_size == tokenizer.vocab_size


def test_a_checkpoint_refuses_what_is_not_a_tokenizer_before_writing(tmp_path):
    with pytest.raises(TypeError, match="tokenizer must be a CharTokenizer"):
        save_checkpoint(tmp_path / "c.pt", model=tiny_gpt(), step=1, tokenizer="abc")
    assert not (tmp_path / "c.pt").exists()


def test_a_checkpoint_with_a_tokenizer_of_another_format_is_named(tmp_path):
    from lib.model_file import content_sha256

    path = save_checkpoint(tmp_path / "c.pt", model=tiny_gpt(), step=1,
                           tokenizer=_tokenizers()["bpe"])  # fmt: skip
    state = torch.load(path, weights_only=True)
    packed = state["model"]
    packed["tokenizer"]["version"] = -1  # a BPE this library cannot read
    packed["sha256"] = content_sha256(
        {k: v for k, v in packed.items() if k != "sha256"}
    )
    state["sha256"] = content_sha256(
        {k: v for k, v in state.items() if k != "sha256"} | {"model": packed["sha256"]}
    )
    torch.save(state, path)
    target = tiny_gpt(seed=1)
    before = copy.deepcopy(target.state_dict())
    with pytest.raises(CheckpointError, match=r"c\.pt: its BPE tokenizer has another"):
        load_checkpoint(path, model=target)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_lib_training_imports_the_model_file_not_the_hub():
    """Issue 40: the model file is a module of its own; lib.training needs it, and
    nothing of lib.pretrained (the hub, the shipped checkpoints)."""
    import subprocess
    import sys

    code = (
        "import sys, lib.training\n"
        "assert 'lib.model_file' in sys.modules\n"
        "assert 'lib.pretrained' not in sys.modules, 'lib.training imports the hub'\n"
    )
    root = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root}, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def replace_cfg(cfg, **changes):
    from dataclasses import replace

    return replace(cfg, **changes)


def test_a_checkpoint_of_the_previous_format_still_loads(tmp_path):
    from dataclasses import asdict

    from lib.model_file import content_sha256
    from lib.training import rng_states

    model = tiny_gpt(seed=4)
    state = dict(format="lib.training/2", step=3, model=model.state_dict())
    state |= dict(optimizer=None, scheduler=None, scaler=None, rng=rng_states())
    state["extra"] = dict(config=asdict(model.cfg))
    state["sha256"] = content_sha256(state)
    torch.save(state, tmp_path / "old.pt")
    target = tiny_gpt()
    assert load_checkpoint(tmp_path / "old.pt", model=target)["step"] == 3
    assert _unchanged(target, _weights(model))
    with pytest.raises(CheckpointError, match="activation: 'gelu' in the checkpoint"):
        load_checkpoint(tmp_path / "old.pt", model=tiny_gpt(activation="relu"))


def test_train_refuses_a_schedule_it_cannot_use_before_the_first_step():
    model, optimizer, _ = fresh()
    called = []

    def batches(step):
        called.append(step)
        return BATCHES(step)

    schedule = WarmupCosineSchedule(2, 6)  # a function, not a scheduler
    with pytest.raises(TypeError, match=r"has no step.*make_scheduler\(optimizer"):
        train(model, batches, optimizer=optimizer, n_steps=2, scheduler=schedule)
    other = make_scheduler(make_optimizer(tiny_gpt(), 1e-3), schedule)
    with pytest.raises(ValueError, match="drives another optimizer"):
        train(model, batches, optimizer=optimizer, n_steps=2, scheduler=other)
    assert called == []  # refused at the front door


def test_lm_batches_given_text_says_to_encode_it():
    for builder in (lm_batches, lm_eval_batches):
        with pytest.raises(TypeError, match="got text: encode it first"):
            builder("to be or not to be, " * 20, 2, 4)


def test_evaluate_and_train_name_too_many_batches_asked_of_a_list():
    batches = [BATCHES(i) for i in range(3)]
    with pytest.raises(
        ValueError, match=r"n_batches=5 batches asked for, but the list holds 3"
    ):
        evaluate(tiny_gpt(), batches, n_batches=5)
    assert evaluate(tiny_gpt(), batches, n_batches=3) > 0
    model, optimizer, _ = fresh()
    called = []

    def counted(step):
        called.append(step)
        return BATCHES(step)

    with pytest.raises(ValueError, match="eval_iters=4 batches asked for"):
        train(model, counted, optimizer=optimizer, n_steps=2, eval_every=1,
              eval_batches=batches, eval_iters=4)  # fmt: skip
    assert called == []


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"WORLD_SIZE": "two"}, r"WORLD_SIZE='two' must be a whole number >= 1"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE='0' must be a whole number >= 1"),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "1.5"}, r"LOCAL_RANK='1\.5' must be"),
    ],
)
def test_distributed_setup_names_a_bad_environment_variable(
    monkeypatch, variables, message
):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        distributed_setup()
    assert not dist.is_initialized()


def test_the_next_save_removes_the_temporaries_of_a_killed_save(tmp_path):
    stale = tmp_path / f".step-00000001.pt.{DEAD_PID}.tmp"  # its process is gone
    stale.write_bytes(b"PK\x03\x04 half a file")
    running = tmp_path / f".other.pt.{os.getpid()}.tmp"  # a save still running
    running.write_bytes(b"PK\x03\x04 being written")
    save_checkpoint(tmp_path / "step-00000002.pt", model=tiny_gpt(), step=2)
    assert not stale.exists() and running.exists()


def test_resume_skips_a_step_file_that_lib_training_did_not_write(tmp_path):
    model, optimizer, _ = fresh()
    train(model, BATCHES, optimizer=optimizer, n_steps=2,
          checkpoint_dir=tmp_path, checkpoint_every=2)  # fmt: skip
    foreign = tmp_path / "step-00000009.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)  # readable, not ours
    with pytest.raises(CheckpointError, match="not a checkpoint written") as info:
        load_checkpoint(foreign, model=tiny_gpt())
    assert info.value.damaged
    model, optimizer, _ = fresh()
    with pytest.warns(UserWarning, match="step-00000009.pt is not a checkpoint"):
        history = train(model, BATCHES, optimizer=optimizer, n_steps=3,
                        checkpoint_dir=tmp_path, resume=True)  # fmt: skip
    assert history.steps == [1, 2, 3]  # resumed from step 2


def test_pruning_keeps_this_runs_checkpoints_beside_later_foreign_files(tmp_path):
    """Step files of later steps (a foreign file, another run's checkpoint) are left
    alone and cannot push the run's own checkpoints out (they used to delete them)."""
    model, optimizer, _ = fresh()
    train(model, BATCHES, optimizer=optimizer, n_steps=2,
          checkpoint_dir=tmp_path, checkpoint_every=1)  # fmt: skip
    torch.save({"hello": 1}, tmp_path / "step-00000008.pt")  # readable, not ours
    (tmp_path / "step-00000009.pt").write_bytes(b"junk")  # damaged
    model, optimizer, _ = fresh()
    with pytest.warns(UserWarning, match="resuming from an older checkpoint"):
        train(model, BATCHES, optimizer=optimizer, n_steps=3,
              checkpoint_dir=tmp_path, checkpoint_every=1, resume=True)  # fmt: skip
    names = sorted(p.name for p in tmp_path.glob("step-*.pt"))
    assert names == [
        "step-00000002.pt", "step-00000003.pt", "step-00000008.pt", "step-00000009.pt"
    ]  # fmt: skip
    model, optimizer, _ = fresh()
    with pytest.warns(UserWarning):  # the two later files, skipped again
        history = train(model, BATCHES, optimizer=optimizer, n_steps=4,
                        checkpoint_dir=tmp_path, checkpoint_every=1, resume=True)  # fmt: skip
    assert history.steps == [1, 2, 3, 4]  # resumed from step 3, this run's newest


def test_non_finite_loss_names_the_batch_that_held_it():
    model, optimizer, _ = fresh()
    bad = BATCHES(4)["inputs"]

    def nan_on_that_batch(net, batch):
        loss = model_loss(net, batch)
        return loss * math.nan if torch.equal(batch["inputs"], bad) else loss

    with pytest.raises(NonFiniteLossError, match=r"Step 5's batch is batches\(4\)") as info:  # fmt: skip
        train(model, BATCHES, optimizer=optimizer, n_steps=7,
              loss_fn=nan_on_that_batch)  # fmt: skip
    assert (info.value.step, info.value.batch_index) == (5, 4)


def test_a_loose_load_refuses_untied_weights_for_a_tied_model(tmp_path):
    """strict_config=False lets runtime and configuration fields differ, but weights
    the model ties must hold one value in the file: loading wrote the head over the
    embedding before."""
    cfg = dict(vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_len=16)
    untied = GPT(TransformerConfig(**cfg, tie_embeddings=False))
    tied_model = GPT(TransformerConfig(**cfg, tie_embeddings=True))
    path = save_checkpoint(tmp_path / "step-00000001.pt", model=untied, step=1)
    before = tied_model.embed.tokens.weight.clone()
    with pytest.raises(
        CheckpointError, match="tied weights embed.tokens.weight, head.weight"
    ):
        load_checkpoint(path, model=tied_model, strict_config=False)
    assert torch.equal(tied_model.embed.tokens.weight, before)  # nothing assigned


def test_a_run_without_a_loss_scaler_resumes_with_one(tmp_path):
    """A checkpoint of a CPU or bf16 run (no scaler state) resumes on an fp16 GPU with a
    fresh scaler and a warning (a T4 reader resuming a CPU run was refused before)."""
    model, optimizer, _ = fresh()
    path = save_checkpoint(tmp_path / "step-00000001.pt", model=model,
                           optimizer=optimizer, step=1)  # fmt: skip
    scaler = torch.amp.GradScaler("cpu", enabled=True, init_scale=2.0**10)
    model, optimizer, _ = fresh()
    with pytest.warns(UserWarning, match="holds no loss-scaler state"):
        load_checkpoint(path, model=model, optimizer=optimizer, scaler=scaler)
    assert scaler.get_scale() == 2.0**10  # its own initial scale


def test_train_names_a_batch_that_is_not_a_dict():
    model, optimizer, _ = fresh()

    def tuples(step):
        batch = BATCHES(step)
        return batch["inputs"], batch["targets"]

    with pytest.raises(
        TypeError, match=r"batches\(0\) returned tuple: a batch is a dict"
    ):
        train(model, tuples, optimizer=optimizer, n_steps=2)


# --- keeping the best weights ----------------------------------------------------------


def _scripted_evaluations(monkeypatch, losses: list[float]) -> None:
    """Make train's evaluations return ``losses`` in turn (what held-out data would
    say), so that the best step is known in advance."""
    import lib.training

    queue = list(losses)
    monkeypatch.setattr(lib.training, "evaluate", lambda *a, **k: queue.pop(0))


def test_keep_best_hands_back_the_best_evaluations_weights(monkeypatch, tmp_path):
    # the weights after 4 steps, trained on their own
    reference, optimizer, scheduler = fresh(dropout=0.0)
    train(reference, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=4)
    _scripted_evaluations(monkeypatch, [3.0, 1.0, 2.0])
    model, optimizer, scheduler = fresh(dropout=0.0)
    history = train(
        model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=6,
        eval_batches=BATCHES, eval_every=2, eval_iters=1, keep_best=True,
        checkpoint_dir=tmp_path,
    )  # fmt: skip
    assert (history.best_step, history.best_eval_loss) == (4, 1.0)
    assert history.eval_losses == [3.0, 1.0, 2.0]  # every evaluation kept
    for ours, theirs in zip(
        model.state_dict().values(), reference.state_dict().values()
    ):
        torch.testing.assert_close(ours, theirs)
    # the saved best.pt holds the same weights
    saved = tiny_gpt(5, dropout=0.0)
    assert (
        load_checkpoint(tmp_path / "best.pt", model=saved, restore_rng=False)["step"]
        == 4
    )
    for ours, theirs in zip(
        saved.state_dict().values(), reference.state_dict().values()
    ):
        torch.testing.assert_close(ours, theirs)


def test_keep_best_without_it_keeps_the_last_weights(monkeypatch):
    last, optimizer, scheduler = fresh(dropout=0.0)
    train(last, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=6)
    _scripted_evaluations(monkeypatch, [3.0, 1.0, 2.0])
    model, optimizer, scheduler = fresh(dropout=0.0)
    history = train(
        model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=6,
        eval_batches=BATCHES, eval_every=2, eval_iters=1,
    )  # fmt: skip
    assert history.best_step == 0 and history.best_eval_loss is None
    for ours, theirs in zip(model.state_dict().values(), last.state_dict().values()):
        torch.testing.assert_close(ours, theirs)


def test_keep_best_survives_a_resume(monkeypatch, tmp_path):
    reference, optimizer, scheduler = fresh(dropout=0.0)
    train(reference, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=2)
    # the first process: its best is step 2; it stops after step 4
    _scripted_evaluations(monkeypatch, [1.0, 2.0])
    common = dict(
        eval_batches=BATCHES, eval_every=2, eval_iters=1, keep_best=True,
        checkpoint_dir=tmp_path, checkpoint_every=2,
    )  # fmt: skip
    model, optimizer, scheduler = fresh(dropout=0.0)
    train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=4, **common)
    # a new process resumes at step 4; its later evaluations are worse
    _scripted_evaluations(monkeypatch, [5.0])
    model, optimizer, scheduler = fresh(seed=3, dropout=0.0)
    history = train(
        model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=6,
        resume=True, **common,
    )  # fmt: skip
    assert (history.best_step, history.best_eval_loss) == (2, 1.0)
    for ours, theirs in zip(
        model.state_dict().values(), reference.state_dict().values()
    ):
        torch.testing.assert_close(ours, theirs)
    # without the file, the resumed run cannot hand back its best: it says so
    (tmp_path / "best.pt").unlink()
    model, optimizer, scheduler = fresh(dropout=0.0)
    with pytest.raises(CheckpointError, match="best weights .step 2. are not in"):
        train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=6,
              resume=True, **common)  # fmt: skip


def test_keep_best_needs_evaluations():
    model, optimizer, _ = fresh()
    with pytest.raises(ValueError, match="keep_best needs eval_every"):
        train(model, BATCHES, optimizer=optimizer, n_steps=1, keep_best=True)
