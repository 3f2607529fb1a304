"""predict/node_times.py: predicted seconds per node add up to the forward and backward phases the performance
model predicts for one process (less the loss), per block to the sum of its nodes'; a Sequential fx cannot
trace gets its children's times from their leaf modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scaletrain.graph.build import trace
from scaletrain.predict.node_times import block_times, layer_times, node_times
from scaletrain.perf.blocks import group
from scaletrain.predict import model as M
from scaletrain.predict.points import Predictor

from predict_fixtures import NETWORK, fake_calibration


def small_calibration():
    """The fake calibration at one thread with eight shapes per op kind: its laws fit in about a second."""
    cal = fake_calibration(threads=(1,))
    kept: dict[str, list] = {}
    for row in cal["layers"]:
        kept.setdefault(row["kind"], []).append(row)
    cal["layers"] = [row for rows in kept.values() for row in rows[:8]]
    return cal


CAL = small_calibration()


def net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(8 * 8 * 8, 10))


def test_node_times_add_up_to_the_predicted_forward_and_backward_phases():
    model, batch = net(), 4
    times = node_times(model, (3, 16, 16), batch, CAL)
    traced = trace(model, (3, 16, 16), batch)
    assert set(times) == {n.name for n in traced.graph.nodes if n.op == "call_module"}
    assert all(f > 0 and b > 0 for name, (f, b) in times.items() if name != "_4")  # Flatten: a view, no time
    assert times["_4"] == (0.0, 0.0)

    from scaletrain.predict.ops import trace_ops

    p = Predictor(CAL, NETWORK)
    ops = p.op_costs(trace_ops(model, (3, 16, 16), batch), "fp32", 1)
    loss = p.loss_s(batch, 10, "fp32", 1)
    step = M.predict_step(ops, M.Setting(batch_size=batch, cores=1), p.loop(1), NETWORK, lambda t, n: 0.0, loss)
    memory = p.loop(1).factor("memory", "forward"), p.loop(1).factor("memory", "backward")
    assert sum(f for f, _ in times.values()) + loss[0] * memory[0] == pytest.approx(step["phases_s"]["forward"])
    assert sum(b for _, b in times.values()) + loss[1] * memory[1] == pytest.approx(step["phases_s"]["backward"])

    blocks = group(traced.graph, "block")
    per_block = block_times(blocks, traced.graph, times)
    per_node = layer_times(traced.graph, times)
    assert len(per_block) == len(blocks) == 2  # conv, BN, ReLU, pool, flatten | linear
    for b, (f, bw) in zip(blocks, per_block):
        assert f == pytest.approx(sum(per_node[i][0] for i in b.nodes))
        assert bw == pytest.approx(sum(per_node[i][1] for i in b.nodes))


class Gate(nn.Module):
    """Data-dependent control flow: fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x)) if x.numel() > 0 else x  # a tensor-valued condition


def test_a_sequential_fx_cannot_trace_gets_its_childrens_times_from_their_leaf_modules():
    model = nn.Sequential(nn.Linear(8, 16), Gate(), nn.Linear(16, 4))
    times = node_times(model, (8,), 4, CAL)
    assert set(times) == {"0", "1.fc", "1.act", "2"}  # walked by hooks: leaf modules' names
    traced = trace(model, (8,), 4)
    assert traced.traced_by == "module order"
    per_node = layer_times(traced.graph, times)
    gate = next(n.id for n in traced.graph.nodes if n.name == "1")
    assert per_node[gate] == pytest.approx((times["1.fc"][0] + times["1.act"][0], times["1.fc"][1] + times["1.act"][1]))
    assert per_node[gate][0] > times["1.fc"][0] > 0


def test_a_calibration_without_the_precision_says_so():
    from scaletrain.errors import UserError

    with pytest.raises(UserError, match="no bf16"):
        node_times(net(), (3, 16, 16), 2, CAL, precision="bf16")


def test_threads_default_to_the_calibrated_machines_cores():
    cal = fake_calibration(threads=(1, 2))
    kept: dict[tuple, list] = {}
    for row in cal["layers"]:
        if row["kind"] in ("linear", "eltwise"):
            kept.setdefault((row["kind"], row["threads"]), []).append(row)
    cal["layers"] = [row for rows in kept.values() for row in rows[:8]]
    cal["device"]["cores"] = 2
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    with torch.no_grad():
        both = node_times(model, (8,), 4, cal)
        one = node_times(model, (8,), 4, cal, threads=1)
    assert both != one
