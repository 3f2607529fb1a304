"""Tests for optimizers and the LR schedule: linear scaling rule, warm-up, decay, state round trip."""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn

from scaletrain.config.sections import OptimConfig
from scaletrain.train.optim import LRSchedule, build_optimizer, build_scheduler, peak_lr


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 2 * 2, 5))


# ------------------------------------------------------------------ peak_lr

def test_peak_lr_without_scaling_is_the_base_lr():
    cfg = OptimConfig(lr=0.1, batch_size=64, ref_batch=256)
    assert peak_lr(cfg, 1) == 0.1 and peak_lr(cfg, 16) == 0.1


@pytest.mark.parametrize("lr, batch, world, ref, expected", [
    (0.1, 64, 8, 256, 0.2),
    (0.1, 64, 1, 256, 0.025),
    (0.4, 32, 4, 128, 0.4),
    (0.05, 128, 16, 256, 0.4),
])
def test_peak_lr_linear_scaling_rule(lr, batch, world, ref, expected):
    cfg = OptimConfig(lr=lr, batch_size=batch, ref_batch=ref, scale_lr=True)
    assert peak_lr(cfg, world) == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------------ LRSchedule

def sched(steps_per_epoch=10, world=8, **kw) -> LRSchedule:
    base = dict(lr=0.1, batch_size=64, ref_batch=256, scale_lr=True, epochs=10)
    return LRSchedule(OptimConfig(**{**base, **kw}), steps_per_epoch, world)


def test_warmup_starts_at_base_over_peak_and_reaches_one_at_its_end():
    s = sched(warmup_epochs=2.0)  # peak 0.2 -> start 0.5; warm-up = 20 steps
    assert s(0) == pytest.approx(0.5, abs=1e-15)
    assert s(19) < 1.0
    assert s(20) == 1.0


def test_warmup_is_linear():
    s = sched(warmup_epochs=2.0)
    values = [s(i) for i in range(21)]
    for i, v in enumerate(values):
        assert v == pytest.approx(0.5 + 0.5 * i / 20, abs=1e-12)
    diffs = [b - a for a, b in zip(values, values[1:])]
    assert max(diffs) - min(diffs) < 1e-12


def test_fractional_warmup_epochs_round_to_steps():
    s = sched(warmup_epochs=0.5, steps_per_epoch=10)  # 5 steps
    assert s(4) < 1.0 and s(5) == 1.0


def test_warmup_is_flat_when_the_lr_is_not_scaled_up():
    s = sched(warmup_epochs=2.0, scale_lr=False)
    assert [s(i) for i in range(21)] == [1.0] * 21


@pytest.mark.parametrize("warmup", [0.0, 2.0])
def test_cosine_is_monotone_after_warmup_and_ends_near_zero(warmup):
    s = sched(warmup_epochs=warmup, schedule="cosine", steps_per_epoch=20)
    total, w = 200, int(warmup * 20)
    after = [s(i) for i in range(w, total)]
    assert after[0] == 1.0
    assert all(b <= a for a, b in zip(after, after[1:]))
    assert all(0.0 <= v <= 1.0 for v in after)
    assert after[-1] < 1e-3
    mid = w + (total - w) // 2
    assert s(mid) == pytest.approx(0.5, abs=1e-12)
    assert s(total) == pytest.approx(0.0, abs=1e-15)


def test_step_schedule_drops_tenfold_at_half_and_three_quarters():
    s = sched(schedule="step", scale_lr=False, steps_per_epoch=10)  # 100 steps, no warm-up
    values = [s(i) for i in range(100)]
    assert values[:50] == [1.0] * 50
    assert values[50:75] == pytest.approx([0.1] * 25, rel=1e-12)
    assert values[75:] == pytest.approx([0.01] * 25, rel=1e-12)


def test_constant_schedule_stays_one_after_warmup():
    s = sched(schedule="constant", warmup_epochs=1.0)
    assert s(0) == pytest.approx(0.5)
    assert [s(i) for i in range(10, 100)] == [1.0] * 90


# ------------------------------------------------------------------ build_optimizer

@pytest.mark.parametrize("name, cls, nesterov", [
    ("sgd", torch.optim.SGD, False),
    ("nesterov", torch.optim.SGD, True),
    ("adagrad", torch.optim.Adagrad, None),
    ("adamw", torch.optim.AdamW, None),
])
def test_optimizer_types(name, cls, nesterov):
    cfg = OptimConfig(optimizer=name, lr=0.1, momentum=0.8, scale_lr=True, batch_size=64, ref_batch=256)
    opt = build_optimizer(cfg, small_model(), world_size=8)
    assert type(opt) is cls
    for g in opt.param_groups:
        assert g["lr"] == pytest.approx(0.2)
        if cls is torch.optim.SGD:
            assert g["nesterov"] is nesterov and g["momentum"] == 0.8
        if cls is torch.optim.AdamW:
            assert g["betas"] == (0.8, 0.999)


def test_weight_decay_only_on_multidimensional_parameters():
    model = small_model()
    model[0].bias.requires_grad_(False)  # frozen parameters are left out entirely
    cfg = OptimConfig(weight_decay=1e-3)
    opt = build_optimizer(cfg, model, 1)
    decay, no_decay = opt.param_groups
    ids = lambda ps: {id(p) for p in ps}  # noqa: E731
    assert ids(decay["params"]) == {id(model[0].weight), id(model[3].weight)}
    assert decay["weight_decay"] == 1e-3
    assert ids(no_decay["params"]) == {id(model[1].weight), id(model[1].bias), id(model[3].bias)}
    assert no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim <= 1 for p in no_decay["params"])


def test_weight_decay_really_leaves_biases_alone():
    """One SGD step with zero gradients: only the weights shrink by lr x wd."""
    model = small_model()
    cfg = OptimConfig(optimizer="sgd", lr=0.5, momentum=0.0, weight_decay=0.1)
    opt = build_optimizer(cfg, model, 1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        if p.ndim > 1:
            torch.testing.assert_close(p.detach(), before[n] * (1 - 0.5 * 0.1))
        else:
            torch.testing.assert_close(p.detach(), before[n], rtol=0, atol=0)


# ------------------------------------------------------------------ scheduler state round trip

def test_scheduler_applies_the_schedule_to_the_peak_lr():
    cfg = OptimConfig(lr=0.1, batch_size=64, ref_batch=256, scale_lr=True, warmup_epochs=1.0, epochs=3)
    opt = build_optimizer(cfg, small_model(), 8)
    sch = build_scheduler(cfg, opt, steps_per_epoch=4, world_size=8)
    s = LRSchedule(cfg, 4, 8)
    for step in range(12):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * s(step), rel=1e-12)
        opt.step()
        sch.step()


def test_scheduler_state_round_trips_through_weights_only_load():
    cfg = OptimConfig(lr=0.1, batch_size=64, ref_batch=256, scale_lr=True, warmup_epochs=1.0, epochs=4,
                      schedule="cosine")
    opt = build_optimizer(cfg, small_model(), 4)
    sch = build_scheduler(cfg, opt, steps_per_epoch=5, world_size=4)
    for _ in range(7):
        opt.step()
        sch.step()
    buf = io.BytesIO()
    torch.save({"optimizer": opt.state_dict(), "scheduler": sch.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    # rebuilt from a different config: everything the schedule needs must come from the state
    other = OptimConfig(lr=0.7, schedule="constant", epochs=1)
    opt2 = build_optimizer(other, small_model(), 1)
    sch2 = build_scheduler(other, opt2, steps_per_epoch=1, world_size=1)
    opt2.load_state_dict(state["optimizer"])
    sch2.load_state_dict(state["scheduler"])
    assert sch2.lr_lambdas[0].kind == "cosine"
    assert sch2.last_epoch == sch.last_epoch == 7
    for _ in range(13):
        assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
        opt.step(), opt2.step()
        sch.step(), sch2.step()
    assert math.isclose(opt.param_groups[0]["lr"], 0.0, abs_tol=1e-15)
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
