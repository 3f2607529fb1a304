"""Tests for steady-state throughput, the validation ShardSampler and single-process evaluate()."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from scaletrain.train.evaluate import EvalResult, ShardSampler, evaluate
from scaletrain.profiler.steplog import StepLog
from scaletrain.analysis.throughput import steady_samples_per_s, warmup_steps


# ------------------------------------------------------------------ throughput

def records(epochs: int, steps: int, warm_time: float = 10.0, time: float = 0.25, samples: int = 8,
            last_samples: int | None = None) -> list[dict]:
    """Per-step records whose warm-up steps are slow, so including any of them changes the answer."""
    skip = warmup_steps(steps)
    out = []
    for e in range(epochs):
        for i in range(steps):
            n = last_samples if (last_samples is not None and i == steps - 1) else samples
            out.append({"epoch": e, "step_in_epoch": i, "samples": n,
                        "step_time_s": warm_time if i < skip else time})
    return out


@pytest.mark.parametrize("steps, skip", [(1, 0), (3, 0), (4, 1), (8, 2), (19, 4), (20, 5), (100, 5)])
def test_warmup_steps(steps, skip):
    assert warmup_steps(steps) == skip


def test_steady_throughput_skips_warmup_steps_of_every_epoch():
    recs = records(epochs=3, steps=20)  # 5 warm-up steps per epoch
    steady = 3 * 15
    expected = steady * 8 * 1 / (steady * 0.25)
    assert steady_samples_per_s(recs, world_size=1, steps_per_epoch=20) == pytest.approx(expected)
    assert expected == pytest.approx(32.0)


def test_steady_throughput_multiplies_by_world_size():
    recs = records(epochs=2, steps=8, time=0.5, samples=16)
    one = steady_samples_per_s(recs, world_size=1, steps_per_epoch=8)
    assert one == pytest.approx(32.0)
    assert steady_samples_per_s(recs, world_size=4, steps_per_epoch=8) == pytest.approx(128.0)


def test_steady_throughput_counts_actual_samples_of_short_batches():
    recs = records(epochs=1, steps=8, samples=10, last_samples=4, time=1.0)  # steps 2..7 steady
    assert steady_samples_per_s(recs, world_size=2, steps_per_epoch=8) == pytest.approx((5 * 10 + 4) * 2 / 6)


def test_short_epochs_have_no_warmup_steps_to_skip():
    recs = records(epochs=2, steps=3, warm_time=99.0, time=0.5)
    assert steady_samples_per_s(recs, 1, 3) == pytest.approx(16.0)


@pytest.mark.parametrize("recs", [[], records(epochs=2, steps=20)[:5]])
def test_no_steady_steps_gives_none_not_zero(recs):
    assert steady_samples_per_s(recs, world_size=8, steps_per_epoch=20) is None


def test_zero_measured_time_gives_none():
    recs = records(epochs=1, steps=4, time=0.0)
    assert steady_samples_per_s(recs[1:], 1, 4) is None


def test_accepts_a_generator():
    recs = records(epochs=1, steps=8)
    assert steady_samples_per_s(iter(recs), 1, 8) == steady_samples_per_s(recs, 1, 8)


def test_step_log_appends_json_lines(tmp_path):
    path = tmp_path / "metrics-rank0.jsonl"
    log = StepLog(path)
    log.write({"step": 0, "loss": 1.5})
    log.write({"step": 1, "loss": 1.25})
    log.flush()
    assert path.read_text() == '{"step": 0, "loss": 1.5}\n{"step": 1, "loss": 1.25}\n'
    log.close()
    log = StepLog(path)
    log.write({"step": 2})
    log.close()
    assert path.read_text().splitlines()[-1] == '{"step": 2}'


# ------------------------------------------------------------------ ShardSampler

@settings(max_examples=200, deadline=None)
@given(length=st.integers(0, 300), world=st.integers(1, 17))
def test_shards_cover_every_index_exactly_once(length, world):
    shards = [list(ShardSampler(length, r, world)) for r in range(world)]
    flat = [i for shard in shards for i in shard]
    assert sorted(flat) == list(range(length))
    assert len(flat) == length
    for r, shard in enumerate(shards):
        assert len(ShardSampler(length, r, world)) == len(shard)
        assert all(i % world == r for i in shard)
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_shard_sampler_can_be_iterated_twice():
    s = ShardSampler(10, 1, 3)
    assert list(s) == [1, 4, 7] and list(s) == [1, 4, 7]


# ------------------------------------------------------------------ evaluate

# logits[i] for sample i; the true class sits at a chosen rank of each row
LOGITS = torch.tensor([
    [9.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0],  # label 0: rank 0 -> top1 and top5
    [1.0, 9.0, 8.0, 2.0, 3.0, 4.0, 5.0],  # label 2: rank 1 -> top5 only
    [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0],  # label 4: rank 4 -> top5 only (the 5th largest)
    [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0],  # label 5: rank 5 -> neither
    [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0],  # label 6: rank 0 -> both
    [3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0],  # label 6: rank 6 (last) -> neither
])
LABELS = torch.tensor([0, 2, 4, 5, 6, 6])
N, C = LOGITS.shape


class Lookup(nn.Module):
    """A Linear on one-hot inputs: sample i's logits are exactly LOGITS[i]; records the mode it ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(N, C, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(LOGITS.T)
        self.modes: list[bool] = []

    def forward(self, x):
        self.modes.append(self.training)
        return self.fc(x)


def loader(batches: list[list[int]]):
    eye = torch.eye(N)
    out = []
    for idx in batches:
        out.append((eye[idx].reshape(len(idx), N), LABELS[idx].reshape(len(idx)), []))
    return out


def expected_loss() -> float:
    total = 0.0
    for row, y in zip(LOGITS.tolist(), LABELS.tolist()):
        m = max(row)
        total += m + math.log(sum(math.exp(v - m) for v in row)) - row[y]
    return total / N


def test_evaluate_counts_top1_top5_and_loss_exactly():
    model = Lookup()
    model.train()
    result = evaluate(model, loader([[0, 1, 2], [], [3, 4], [5]]), torch.device("cpu"), None, num_classes=C)
    assert isinstance(result, EvalResult)
    assert result.samples == 6
    assert result.top1 == 2 / 6
    assert result.top5 == 4 / 6
    assert result.loss == pytest.approx(expected_loss(), rel=1e-6)
    assert model.modes == [False, False, False]  # empty batch skipped; ran in eval mode
    assert model.training is True  # mode restored


def test_evaluate_restores_eval_mode_too():
    model = Lookup().eval()
    evaluate(model, loader([[0, 1]]), torch.device("cpu"), None, num_classes=C)
    assert model.training is False


def test_evaluate_is_independent_of_batching():
    a = evaluate(Lookup(), loader([[0, 1, 2, 3, 4, 5]]), torch.device("cpu"), None, C)
    b = evaluate(Lookup(), loader([[5], [4], [3], [2], [1], [0]]), torch.device("cpu"), None, C)
    assert (a.top1, a.top5, a.samples) == (b.top1, b.top5, b.samples)
    assert a.loss == pytest.approx(b.loss, rel=1e-6)  # float32 per-batch sums


def test_evaluate_with_fewer_than_five_classes_uses_top_k_of_all():
    model = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]]))
    x = torch.eye(2)
    y = torch.tensor([2, 1])  # sample 0 ranks class 2 second; sample 1 ranks class 1 first
    result = evaluate(model, [(x, y, [])], torch.device("cpu"), None, num_classes=3)
    assert result.top1 == 0.5 and result.top5 == 1.0


def test_evaluate_with_autocast_bf16_on_cpu():
    result = evaluate(Lookup(), loader([[0, 1, 2, 3, 4, 5]]), torch.device("cpu"), torch.bfloat16, C)
    assert (result.top1, result.top5) == (2 / 6, 4 / 6)  # the logits are exact in bf16


def test_evaluate_on_an_empty_split_raises():
    with pytest.raises(RuntimeError, match="empty"):
        evaluate(Lookup(), loader([[]]), torch.device("cpu"), None, C)
