"""lib.ledger: Muon (Newton-Schulz against the SVD, a step against its formula, the AdamW
groups against torch's AdamW, checkpoints), the warm-up-stable-decay schedule, z-loss."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from lib.batches import lm_batches
from lib.ledger import (
    NEWTON_SCHULZ_COEFFICIENTS,
    CrossEntropyZLoss,
    Muon,
    WarmupStableDecaySchedule,
    muon_optimizer,
    newton_schulz,
    z_loss,
)
from lib.models import BERT, GPT, SequenceClassifier, TransformerConfig
from lib.objectives import IGNORE_INDEX
from lib.training import (
    CheckpointError,
    WarmupCosineSchedule,
    cross_entropy,
    evaluate,
    load_checkpoint,
    make_scheduler,
    model_loss,
    save_checkpoint,
    train,
)

STREAM = torch.randint(0, 20, (2_000,), generator=torch.Generator().manual_seed(0))
BATCHES = lm_batches(STREAM, batch_size=4, seq_len=16, seed=0)


def tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    cfg = TransformerConfig(
        vocab_size=20, d_model=16, n_heads=2, n_layers=2, max_len=16, positions="rope"
    )
    return GPT(cfg)


def quintic(sigma: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The map Newton-Schulz applies to each normalised singular value."""
    a, b, c = NEWTON_SCHULZ_COEFFICIENTS
    for _ in range(steps):
        sigma = a * sigma + b * sigma**3 + c * sigma**5
    return sigma


def by_svd(matrix: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """U·φ^steps(S/(‖matrix‖_F + eps))·Vᵀ: what newton_schulz computes, via the SVD."""
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    return u @ torch.diag(quintic(s / (s.norm() + eps), steps)) @ vh


# --- Newton-Schulz --------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(24, 40), (40, 24), (32, 32)])
@pytest.mark.parametrize("steps", [1, 5])
def test_newton_schulz_is_the_quintic_on_the_singular_values(shape, steps):
    torch.manual_seed(0)
    g = torch.randn(shape, dtype=torch.float64)
    assert torch.allclose(newton_schulz(g, steps), by_svd(g, steps), atol=1e-12)


def test_five_steps_put_the_singular_values_in_the_stated_band():
    # the docstring: every singular value of at least 1/500 of the Frobenius norm ends
    # in [0.68, 1.21]; a random Gaussian matrix's are all that large
    start = torch.linspace(1 / 500, 1.0, 100_001, dtype=torch.float64)
    assert 0.68 <= quintic(start).min() and quintic(start).max() <= 1.21
    torch.manual_seed(1)
    for shape in [(64, 256), (256, 64), (128, 384)]:
        g = torch.randn(shape)
        sv = torch.linalg.svdvals(newton_schulz(g))
        assert 0.68 <= sv.min() and sv.max() <= 1.21
        # the same singular vectors as the SVD's U·Vᵀ: Uᵀ·NS(G)·V is diagonal
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        inner = u.mT @ newton_schulz(g) @ vh.mT
        off_diagonal = inner - torch.diag(torch.diagonal(inner))
        assert off_diagonal.abs().max() < 1e-4


def test_newton_schulz_keeps_the_dtype_and_takes_a_stack_of_matrices():
    torch.manual_seed(2)
    stack = torch.randn(3, 8, 12)
    each = torch.stack([newton_schulz(m) for m in stack])
    assert torch.allclose(newton_schulz(stack), each, atol=1e-6)
    half = newton_schulz(stack[0].bfloat16())
    assert half.dtype == torch.bfloat16 and half.shape == (8, 12)


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((torch.ones(5),), ValueError, r"matrix must have shape \(\.\.\. rows cols\)"),
        ((torch.ones(3, 3, dtype=torch.long),), TypeError, "floating-point"),
        ((torch.ones(3, 3), 0), ValueError, "steps must be an int >= 1"),
        (([[1.0, 2.0]],), TypeError, "matrix must be a torch.Tensor"),
    ],
)
def test_newton_schulz_refuses_bad_arguments(args, error, message):
    with pytest.raises(error, match=message):
        newton_schulz(*args)


# --- Muon -----------------------------------------------------------------------------------


@pytest.mark.parametrize("nesterov", [True, False])
def test_two_muon_steps_equal_the_formula(nesterov):
    torch.manual_seed(3)
    weight = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    grads = [torch.randn(5, 3, dtype=torch.float64) for _ in range(2)]
    lr, decay, mu = 0.05, 0.1, 0.9
    group = dict(params=[weight], muon=True)
    optimizer = Muon([group], lr, weight_decay=decay, momentum=mu, nesterov=nesterov)
    expected, buffer = weight.detach().clone(), torch.zeros(5, 3, dtype=torch.float64)
    for grad in grads:
        weight.grad = grad.clone()
        optimizer.step()
        buffer = mu * buffer + grad
        u = grad + mu * buffer if nesterov else buffer
        step = 0.2 * math.sqrt(5) * by_svd(u)  # Moonshot's scale: 0.2·√max(5, 3)
        expected = expected * (1 - lr * decay) - lr * step
    assert torch.allclose(weight.detach(), expected, atol=1e-12)
    # the momentum is SGD's (PyTorch's convention, dampening 0)
    sgd_weight = torch.zeros(5, 3, dtype=torch.float64, requires_grad=True)
    sgd = torch.optim.SGD([sgd_weight], lr=0.0, momentum=mu, nesterov=nesterov)
    for grad in grads:
        sgd_weight.grad = grad.clone()
        sgd.step()
    assert torch.allclose(
        optimizer.state[weight]["momentum_buffer"],
        sgd.state[sgd_weight]["momentum_buffer"],
    )


def test_the_step_of_a_full_rank_matrix_has_an_rms_near_0_2():
    # Moonshot's rule: the RMS of the step does not depend on the matrix's shape
    for shape in [(16, 16), (64, 16), (16, 64), (48, 32)]:
        torch.manual_seed(4)
        weight = torch.zeros(shape, requires_grad=True)
        optimizer = Muon([dict(params=[weight], muon=True)], 1.0, momentum=0.0)
        weight.grad = torch.randn(shape)
        optimizer.step()
        rms = weight.detach().pow(2).mean().sqrt()
        assert 0.2 * 0.68 <= rms <= 0.2 * 1.21


def test_the_adamw_groups_equal_torchs_adamw():
    model, reference = tiny_gpt(), tiny_gpt()
    settings = dict(betas=(0.9, 0.95), eps=1e-8)
    decayed = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    ours = Muon(
        [
            dict(params=decayed, muon=False, weight_decay=0.1),
            dict(params=others, muon=False, lr=3e-3),
        ],
        1e-2,
        **settings,
    )
    theirs = torch.optim.AdamW(
        [
            dict(params=[p for p in reference.parameters() if p.dim() == 2]),
            dict(
                params=[p for p in reference.parameters() if p.dim() != 2],
                lr=3e-3,
                weight_decay=0.0,
            ),
        ],
        lr=1e-2,
        weight_decay=0.1,
        foreach=False,
        **settings,
    )
    for step in range(3):
        for net, optimizer in [(model, ours), (reference, theirs)]:
            optimizer.zero_grad()
            model_loss(net, BATCHES(step)).backward()
            optimizer.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_muon_optimizer_gives_muon_the_blocks_matrices_and_adamw_the_rest():
    model = tiny_gpt()
    optimizer = muon_optimizer(model, 1e-3, adamw_lr=2e-3, weight_decay=0.05)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [
        (
            g["muon"],
            g["lr"],
            g["weight_decay"],
            sorted(names[id(p)] for p in g["params"]),
        )
        for g in optimizer.param_groups
    ]
    assert [g[:3] for g in groups] == [(True, 1e-3, 0.05), (False, 2e-3, 0.0)]
    hidden = sorted(
        n for n, p in model.named_parameters() if "blocks" in n and p.dim() == 2
    )
    assert groups[0][3] == hidden and len(hidden) == 8
    assert "embed.tokens.weight" in groups[1][3]
    everything = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(everything) == len(list(model.parameters()))
    # a classifier's nn.Linear head is no hidden matrix: AdamW, decayed
    bert = BERT(TransformerConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1))
    classifier = SequenceClassifier(bert, n_classes=3)
    groups = muon_optimizer(classifier, 1e-3).param_groups
    assert [g["muon"] for g in groups] == [True, False, False]
    assert [id(p) for p in groups[1]["params"]] == [id(classifier.head.weight)]
    assert groups[1]["weight_decay"] == 0.1


def test_one_scheduler_and_clipping_drive_every_group():
    model = tiny_gpt()
    optimizer = muon_optimizer(model, 1e-2)
    schedule = WarmupStableDecaySchedule(2, 6)
    scheduler = make_scheduler(optimizer, schedule)
    history = train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=6)
    assert history.lrs == pytest.approx([1e-2 * schedule(s) for s in range(6)])
    for group in optimizer.param_groups:
        assert group["lr"] == pytest.approx(1e-2 * schedule(6))


def test_a_resumed_muon_run_repeats_the_uninterrupted_run(tmp_path):
    def fresh(seed=0):
        model = tiny_gpt(seed)
        optimizer = muon_optimizer(model, 1e-2)
        schedule = WarmupStableDecaySchedule(2, 6, decay_fraction=0.5)
        return model, optimizer, make_scheduler(optimizer, schedule)

    def run(model, optimizer, scheduler, **saving):
        return train(
            model,
            BATCHES,
            optimizer=optimizer,
            scheduler=scheduler,
            loss_fn=CrossEntropyZLoss(1e-3),
            **saving,
        )

    whole = run(*fresh(), n_steps=6)
    run(*fresh(), n_steps=3, checkpoint_dir=tmp_path, checkpoint_every=3)
    torch.manual_seed(1234)  # a new process has another random state
    resumed = run(*fresh(seed=99), n_steps=6, checkpoint_dir=tmp_path, resume=True)
    assert resumed.steps == [1, 2, 3, 4, 5, 6]
    assert resumed.losses == whole.losses and resumed.lrs == whole.lrs


def test_a_checkpoint_of_another_split_is_refused_before_anything_loads(tmp_path):
    model = tiny_gpt()
    optimizer = muon_optimizer(model, 1e-2)
    model_loss(model, BATCHES(0)).backward()
    optimizer.step()
    path = save_checkpoint(tmp_path / "step-00000001.pt", model=model, step=1,
                           optimizer=optimizer)  # fmt: skip
    # the same parameters, grouped otherwise: two groups, muon flags swapped
    other = tiny_gpt(seed=5)
    params = list(other.parameters())
    matrices = [p for p in params if p.dim() == 2]
    rest = [p for p in params if p.dim() != 2]
    swapped = Muon(
        [dict(params=rest, muon=False), dict(params=matrices, muon=False)], 1e-2
    )
    with pytest.raises(CheckpointError):
        load_checkpoint(path, model=other, optimizer=swapped)
    before = [p.detach().clone() for p in other.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters()))
    # groups that fit in size, flagged otherwise: Muon's own check
    state = optimizer.state_dict()
    sizes = [list(g["params"]) for g in muon_optimizer(other, 1e-2).param_groups]
    all_adamw = Muon([dict(params=p, muon=False) for p in sizes], 1e-2)
    with pytest.raises(
        ValueError, match=r"muon flags \[False, False\], saved \[True, False\]"
    ):
        all_adamw.load_state_dict(state)


@pytest.mark.parametrize(
    ("groups", "settings", "error", "message"),
    [
        (lambda m, v: [m], {}, ValueError, "each group needs a flag, muon=True|False"),
        (
            lambda m, v: [dict(params=[m, v], muon=True)],
            {},
            ValueError,
            r"muon=True takes 2-D matrices, not \[\(4,\)\]",
        ),
        (lambda m, v: [dict(params=m, muon=1)], {}, TypeError, "muon must be True"),
        (
            lambda m, v: [dict(params=m, muon=True, lr=-1.0)],
            {},
            ValueError,
            "lr must be a finite number >= 0",
        ),
        (
            lambda m, v: [dict(params=m, muon=True)],
            dict(momentum=1.0),
            ValueError,
            r"momentum must be a finite number in \[0, 1\)",
        ),
        (
            lambda m, v: [dict(params=m, muon=True)],
            dict(ns_steps=0),
            ValueError,
            "ns_steps must be an int >= 1",
        ),
        (
            lambda m, v: [dict(params=v, muon=False)],
            dict(betas=0.9),
            TypeError,
            "betas must be a pair",
        ),
        (
            lambda m, v: [dict(params=v, muon=False)],
            dict(betas=(0.9, 1.0)),
            ValueError,
            r"betas\[1\] must be",
        ),
        (
            lambda m, v: [dict(params=v, muon=False)],
            dict(eps=0.0),
            ValueError,
            "eps must be a finite number > 0",
        ),
        (
            lambda m, v: [dict(params=v, muon=False, weight_decay=math.nan)],
            {},
            ValueError,
            "weight_decay must be a finite number",
        ),
    ],
)
def test_muon_refuses_bad_groups_and_settings(groups, settings, error, message):
    matrix = torch.zeros(3, 4, requires_grad=True)
    vector = torch.zeros(4, requires_grad=True)
    with pytest.raises(error, match=message):
        Muon(groups(matrix, vector), 0.1, **settings)


def test_muon_optimizer_refuses_a_model_without_transformer_blocks():
    with pytest.raises(ValueError, match="no nn.Linear in a TransformerBlock"):
        muon_optimizer(nn.Sequential(nn.Linear(4, 4)), 1e-3)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        muon_optimizer("gpt", 1e-3)


# --- warm-up, stable, decay -----------------------------------------------------------------


def test_wsd_values_at_its_joints():
    wsd = WarmupStableDecaySchedule(50, 1000)
    assert wsd(0) == pytest.approx(1 / 50) and wsd(49) == 1.0
    assert wsd(400) == 1.0 and wsd.decay_start == 800 and wsd(800) == 1.0
    assert wsd(900) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(0.5)))
    assert wsd(1000) == pytest.approx(0.1) and wsd(5000) == pytest.approx(0.1)
    linear = WarmupStableDecaySchedule(50, 1000, shape="linear", min_ratio=0.0)
    assert linear(900) == pytest.approx(0.5) and linear(1000) == 0.0
    short = WarmupStableDecaySchedule(0, 10, decay_fraction=0.01)
    assert short.decay_steps == 1 and short(8) == 1.0 and short(9) == 1.0
    assert short(10) == pytest.approx(0.1)


def test_wsds_plateau_does_not_depend_on_the_length():
    # a decay can branch off any checkpoint of the plateau
    long, short = (
        WarmupStableDecaySchedule(10, 1000),
        WarmupStableDecaySchedule(10, 300),
    )
    assert [short(s) for s in range(241)] == [long(s) for s in range(241)]
    assert short(250) < long(250)
    cosine_long, cosine_short = (
        WarmupCosineSchedule(10, 1000),
        WarmupCosineSchedule(10, 300),
    )
    assert cosine_short(20) != cosine_long(20)


def test_a_decay_branches_off_a_plateau_checkpoint(tmp_path):
    def fresh(total):
        model = tiny_gpt()
        optimizer = muon_optimizer(model, 1e-2)
        schedule = WarmupStableDecaySchedule(1, total, decay_fraction=0.5)
        return model, optimizer, make_scheduler(optimizer, schedule), schedule

    model, optimizer, scheduler, _ = fresh(total=100)  # a long run's plateau
    common = dict(checkpoint_dir=tmp_path, checkpoint_every=2)
    train(model, BATCHES, optimizer=optimizer, scheduler=scheduler, n_steps=2, **common)
    model, optimizer, scheduler, schedule = fresh(total=4)  # its branch: decay now
    history = train(model, BATCHES, optimizer=optimizer, scheduler=scheduler,
                    n_steps=4, checkpoint_dir=tmp_path, resume=True)  # fmt: skip
    # the plateau's two steps (from the checkpoint's history), then the decay
    assert history.lrs == pytest.approx(
        [1e-2, 1e-2, 1e-2 * schedule(2), 1e-2 * schedule(3)]
    )
    assert history.lrs[3] < history.lrs[2]


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        (dict(warmup=5, total=0), ValueError, "total must be an int >= 1"),
        (dict(warmup=11, total=10), ValueError, r"warmup must be an int in 0\.\.10"),
        (dict(warmup=9, total=10), ValueError, "warm-up and decay overlap"),
        (dict(warmup=1, total=10, decay_fraction=0.0), ValueError, "decay_fraction"),
        (dict(warmup=1, total=10, min_ratio=1.5), ValueError, "min_ratio"),
        (dict(warmup=1, total=10, shape="cosine"), ValueError, "shape must be one of"),
    ],
)
def test_wsd_refuses_bad_fields(fields, error, message):
    with pytest.raises(error, match=message):
        WarmupStableDecaySchedule(**fields)


# --- z-loss ---------------------------------------------------------------------------------


def test_z_loss_value_and_gradient_equal_the_formula():
    torch.manual_seed(6)
    logits = torch.randn(3, 7, 11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (3, 7))
    targets[0, :4] = IGNORE_INDEX
    keep = targets != IGNORE_INDEX
    log_z = torch.logsumexp(logits.detach(), dim=-1)
    expected = 1e-3 * log_z[keep].square().mean()
    value = z_loss(logits, targets, coefficient=1e-3)
    assert value.item() == pytest.approx(expected.item(), rel=1e-6)
    value.backward()
    # ∂/∂z_i of c·mean(log² Z) = 2c·log Z·softmax(z)_i / n_kept; nothing where ignored
    formula = 2e-3 * log_z[..., None] * logits.detach().softmax(-1) / keep.sum()
    formula = formula * keep[..., None]
    assert torch.allclose(logits.grad.double(), formula, rtol=1e-5, atol=1e-12)
    # no targets: every position counts; every target ignored: 0
    assert z_loss(logits.detach(), coefficient=1.0).item() == pytest.approx(
        log_z.square().mean().item(), rel=1e-6
    )
    ignored = torch.full((3, 7), IGNORE_INDEX)
    assert z_loss(logits.detach(), ignored).item() == 0.0


def test_z_loss_ignores_a_nan_at_an_ignored_position():
    logits = torch.zeros(1, 3, 5)
    logits[0, 0] = math.nan
    targets = torch.tensor([[IGNORE_INDEX, 1, 2]])
    value = z_loss(logits, targets, coefficient=1.0)
    assert value.item() == pytest.approx(math.log(5) ** 2, rel=1e-6)


def test_cross_entropy_z_loss_adds_z_loss_in_training_only():
    model, batch = tiny_gpt(), BATCHES(0)
    plain = model_loss(model, batch)
    assert torch.equal(CrossEntropyZLoss(0.0)(model, batch), plain)
    with torch.no_grad():
        logits = model(batch["inputs"])
    expected = cross_entropy(logits, batch["targets"]) + z_loss(
        logits, batch["targets"], coefficient=1e-2
    )
    assert torch.allclose(CrossEntropyZLoss(1e-2)(model, batch), expected)
    model.eval()
    assert torch.equal(CrossEntropyZLoss(1e-2)(model, batch), plain)
    # train's evaluations: the cross-entropy alone, comparable across rows
    assert evaluate(model, [batch], loss_fn=CrossEntropyZLoss(1.0)) == pytest.approx(
        evaluate(model, [batch])
    )
    smoothed = CrossEntropyZLoss(0.0, label_smoothing=0.1)(model, batch)
    assert torch.equal(smoothed, model_loss(model, batch, label_smoothing=0.1))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: z_loss(torch.ones(3, 4).long()), TypeError, "floating-point"),
        (lambda: z_loss(torch.ones(3, 4), torch.ones(4).long()), ValueError, "shape"),
        (lambda: z_loss(torch.ones(3, 4), torch.ones(3)), TypeError, "integer"),
        (lambda: z_loss(torch.ones(3, 4), coefficient=-1.0), ValueError, "coefficient"),
        (lambda: CrossEntropyZLoss(-1e-4), ValueError, "coefficient"),
        (lambda: CrossEntropyZLoss(1e-4, label_smoothing=1.0), ValueError, "smoothing"),
        (lambda: CrossEntropyZLoss()(tiny_gpt(), {"inputs": 1}), ValueError, "targets"),
    ],
)
def test_z_loss_refuses_bad_arguments(call, error, message):
    with pytest.raises(error, match=message):
        call()


# The ledger's statistics and runner.
from lib.ledger import (  # noqa: E402
    LEDGER_CPU_SIZES,
    holm,
    ledger_main,
    ledger_rows,
    ledger_sizes,
    ledger_table,
    mean_interval,
    paired_t_test,
    run_ledger,
    t_quantile,
    t_two_sided_p,
)
from lib.runs import RecipeChange  # noqa: E402


@pytest.mark.parametrize(
    ("t", "df"), [(12.7062, 1), (4.3027, 2), (3.1824, 3), (2.7764, 4), (2.5706, 5)]
)
def test_t_tail_matches_the_tables_97_5_percent_points(t, df):
    assert t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-5)
    assert t_quantile(0.975, df) == pytest.approx(t, abs=2e-4)


def test_t_tail_tends_to_the_normal_and_is_symmetric():
    assert t_two_sided_p(1.959964, 100_000) == pytest.approx(0.05, abs=1e-4)
    assert t_two_sided_p(-2.0, 4) == t_two_sided_p(2.0, 4)
    assert t_two_sided_p(0.0, 3) == pytest.approx(1.0)


def test_holm_multiplies_by_rank_and_keeps_the_order():
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.3, 0.9]) == [0.6, 0.9]  # capped at 1, never below the last
    assert holm([]) == []


def test_mean_interval_and_paired_test_by_hand():
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    half = 4.302653 * 1.0 / 3**0.5  # t(0.975, 2) · sd / √n, sd = 1
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - half, 2.0 + half), abs=1e-5)
    changed, base = [1.5, 1.6, 1.55, 1.52, 1.58], [1.6, 1.62, 1.6, 1.61, 1.63]
    difference, low, high, p = paired_t_test(changed, base)
    assert difference == pytest.approx(-0.062)
    assert low < difference < high < 0 and p < 0.05
    # the same shift on every seed: no spread, a certain change
    assert paired_t_test([2.0, 3.0], [1.0, 2.0])[3] == 0.0
    assert paired_t_test([1.0, 2.0], [1.0, 2.0])[3] == 1.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: mean_interval([1.0]), "2 or more"),
        (lambda: mean_interval([1.0, float("nan")]), "finite"),
        (lambda: paired_t_test([1.0, 2.0], [1.0]), "a pair for each seed"),
        (lambda: t_two_sided_p(1.0, 0), "df"),
        (lambda: run_ledger(["baseline"], seeds=[0]), "2 or more distinct"),
        (lambda: run_ledger(["baseline"], seeds=[0, 0]), "2 or more distinct"),
        (lambda: run_ledger(["no such row"], seeds=[0, 1]), "no row 'no such row'"),
        (lambda: run_ledger([], seeds=[0, 1]), "rows is empty"),
        (lambda: run_ledger(None, seeds=[0, 1], workers=0), "workers"),
        (lambda: ledger_table({"QK-norm": []}), "no 'baseline' row"),
    ],
)
def test_ledger_refuses_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _runs(**losses):
    return {
        name: [dict(seed=s, loss=v, seconds=1.0) for s, v in enumerate(values)]
        for name, values in losses.items()
    }


def test_ledger_table_pairs_by_seed_and_corrects_for_the_rows():
    runs = _runs(
        baseline=[2.0, 2.1, 2.2], better=[1.9, 2.0, 2.12], same=[2.01, 2.09, 2.2]
    )
    lines = {line["row"]: line for line in ledger_table(runs)}
    assert "difference" not in lines["baseline"]
    assert lines["better"]["difference"] == pytest.approx(-0.28 / 3)
    assert lines["better"]["bits_per_byte"] == pytest.approx(
        lines["better"]["loss"] / math.log(2)
    )
    ps = [lines[name]["p"] for name in ("better", "same")]
    assert [lines[name]["p_holm"] for name in ("better", "same")] == holm(ps)
    unpaired = _runs(baseline=[2.0, 2.1], other=[2.0, 2.1])
    unpaired["other"][1]["seed"] = 7
    with pytest.raises(ValueError, match="pair them by seed"):
        ledger_table(unpaired)


def test_the_ledger_has_the_rows_the_page_names():
    rows = ledger_rows(ledger_sizes("smoke", **LEDGER_CPU_SIZES))
    assert len(rows) >= 8 and next(iter(rows)) == "baseline"
    assert rows["baseline"] == RecipeChange()
    moe = rows["4 experts, top 2"].model
    # two experts half as wide as the dense FFN (4 · d_model): the same work
    assert moe["experts_top_k"] * moe["d_ff"] == 4 * LEDGER_CPU_SIZES["d_model"]
    sizes = ledger_sizes("smoke", **LEDGER_CPU_SIZES)
    assert sizes["eval_every"] == sizes["n_steps"] == 1000  # one evaluation


def test_run_ledger_pairs_a_readers_row_with_the_baseline(monkeypatch):
    monkeypatch.setenv("TFS_DRY", "1")  # one step a run
    mine = RecipeChange("rotary", model=dict(positions="rope"))
    ledger = run_ledger(["baseline", mine], seeds=[0, 1], profile=None, progress=False)
    assert ledger["sizes"]["n_steps"] == 1
    assert [r["seed"] for r in ledger["runs"]["rotary"]] == [0, 1]
    lines = ledger_table(ledger["runs"])
    assert lines[1]["row"] == "rotary" and math.isfinite(lines[1]["p"])


def test_ledger_main_writes_a_record_with_every_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("TFS_DRY", "1")
    out = tmp_path / "ledger"
    argv = ["--rows", "baseline", "Muon", "--seeds", "2", "--out", str(out)]
    result = ledger_main([*argv, "--profile", "smoke"])
    record = json.loads((out / "metrics.json").read_text())
    assert record["config"]["rows"] == ["baseline", "Muon"]
    assert [r["seed"] for r in record["extra"]["runs"]["Muon"]] == [0, 1]
    assert record["metrics"]["Muon"]["difference"] == pytest.approx(
        result["table"][1]["difference"]
    )
    assert str(tmp_path) not in record["command"]  # no path of this machine
