"""`scaletrain graph` end to end (in-process): graph.json, DOT, PNG and SVG for resnet20 and Sequential
models, with and without a calibration; a Sequential fx cannot trace in module order; bad input as one
line and exit 2."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from torch import nn

from scaletrain.cli import main
from scaletrain.predict import calibration

from predict_fixtures import fake_calibration


@pytest.fixture(autouse=True)
def no_machine_calibration(tmp_path, monkeypatch):
    """This session's calibration cache empty, whatever other tests made: no times unless given one."""
    monkeypatch.setenv("SCALETRAIN_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def cal_file(tmp_path_factory):
    cal = fake_calibration(threads=(1,))
    kept: dict[str, list] = {}
    for row in cal["layers"]:  # eight shapes per op kind: its laws fit in about a second
        kept.setdefault(row["kind"], []).append(row)
    cal["layers"] = [row for rows in kept.values() for row in rows[:8]]
    return calibration.save(cal, tmp_path_factory.mktemp("cal") / "cal.json")


def graph(out, *flags) -> dict:
    assert main(["graph", "--out", str(out), *flags]) == 0
    return json.loads((out / "graph.json").read_text())


def check_files(out, doc) -> None:
    """The four files, consistent with each other and with graph.json's own counts."""
    ids = [n["id"] for n in doc["nodes"]]
    assert ids == list(range(len(ids)))
    assert all(s in ids and t in ids and s < t for s, t in doc["edges"])
    assert sorted([s, n["id"]] for n in doc["nodes"] for s in n["inputs"]) == sorted(doc["edges"])
    assert doc["cut_points"] == [n["id"] for n in doc["nodes"] if n["cut_after"]]
    t = doc["totals"]
    assert (t["nodes"], t["edges"], t["cut_points"]) == (len(ids), len(doc["edges"]), len(doc["cut_points"]))
    assert t["params"] == sum(n["params"] for n in doc["nodes"]) and t["flops"] == sum(n["flops"] for n in doc["nodes"])
    dot = (out / "graph.dot").read_text()
    assert dot.count(" -> ") == len(doc["edges"]) and dot.count("peripheries=2") == len(doc["cut_points"])
    assert (out / "graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ET.parse(out / "graph.svg").getroot().tag.endswith("svg")


def test_resnet20_at_the_block_level_without_a_calibration(tmp_path, capsys):
    out = tmp_path / "g"
    doc = graph(out, "--model", "resnet20", "--batch-size", "4")
    check_files(out, doc)
    assert doc["model"] == "resnet20" and doc["level"] == "block" and doc["batch_size"] == 4
    assert doc["input_shape"] == [3, 32, 32] and doc["traced_by"] == "fx"
    assert [n["name"] for n in doc["nodes"]][:2] == ["stem", "layer1.0"] and len(doc["nodes"]) == 11
    assert doc["edges"] == [[i, i + 1] for i in range(10)] and doc["cut_points"] == list(range(10))
    assert doc["nodes"][1]["out_shape"] == [4, 16, 32, 32] and doc["nodes"][-1]["out_shape"] == [4, 10]
    assert doc["totals"]["params"] == 269_722  # ResNet-20: 0.27M (He et al.)
    assert all(n["forward_s"] is None and n["backward_s"] is None for n in doc["nodes"])
    assert doc["totals"]["forward_s"] is None and doc["times_from"] is None
    text = capsys.readouterr().out
    assert any("no predicted times" in line and "scaletrain calibrate" in line for line in text.splitlines())
    assert f"wrote {out / 'graph.svg'}" in text and "layer3.2+pool" in text
    # a log (captured output) is told what the forward pass is, minutes for large images, as it starts and ends
    assert "tracing resnet20 on a batch of 4x3x32x32 ..." in text.splitlines()
    assert any(line.startswith("tracing resnet20 on a batch of 4x3x32x32: done in ") for line in text.splitlines())


def test_times_come_with_a_calibration(tmp_path, cal_file, capsys):
    out = tmp_path / "g"
    doc = graph(out, "--model", "resnet20", "--level", "module", "--batch-size", "2", "--calibration", str(cal_file))
    check_files(out, doc)
    assert [n["name"] for n in doc["nodes"]] == ["stem", "layer1", "layer2", "layer3", "pool", "fc"]
    assert all(n["forward_s"] > 0 and n["backward_s"] > 0 for n in doc["nodes"] if n["flops"])
    assert doc["totals"]["forward_s"] == pytest.approx(sum(n["forward_s"] for n in doc["nodes"]))
    assert doc["times_from"].startswith(f"calibration {cal_file}")
    assert "fwd " in (out / "graph.dot").read_text()
    assert f"times: calibration {cal_file}" in capsys.readouterr().out


def small_seq(num_classes=10, in_channels=3):
    return nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 16 * 16, num_classes))


def test_a_sequential_at_every_level(tmp_path):
    every = ["0", "1", "2", "3", "4"]
    for level, names in (("layer", every), ("block", ["0-3", "4"]), ("module", every)):
        out = tmp_path / level
        doc = graph(out, "--model", "test_graph_cli:small_seq", "--level", level, "--batch-size", "2")
        check_files(out, doc)
        assert [n["name"] for n in doc["nodes"]] == names, level
        assert doc["edges"] == [[i, i + 1] for i in range(len(names) - 1)]
        assert doc["cut_points"] == list(range(len(names) - 1))


class Gate(nn.Module):
    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(x) if x.numel() > 0 else x  # a tensor-valued condition: fx cannot trace it


def gated_seq(num_classes=10):
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), Gate(), nn.Flatten(), nn.Linear(4 * 32 * 32, num_classes))


def nothing():
    return nn.Sequential()


def gated_net():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.gate = nn.Conv2d(3, 4, 3), Gate()

        def forward(self, x):
            return self.gate(self.stem(x))

    return Net()


def test_a_sequential_fx_cannot_trace_is_taken_in_module_order(tmp_path, cal_file, capsys):
    out = tmp_path / "g"
    doc = graph(out, "--model", "test_graph_cli:gated_seq", "--level", "layer", "--batch-size", "2",
                "--calibration", str(cal_file))
    check_files(out, doc)
    assert doc["traced_by"] == "module order" and [n["kinds"] for n in doc["nodes"]][1] == ["Gate"]
    assert doc["nodes"][1]["forward_s"] > 0  # its conv, timed through a hook
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: torch.fx cannot trace")]
    assert len(notes) == 1 and "order" in notes[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, cal_file, capsys):
    (tmp_path / "file").write_text("")
    cases = [(["--model", "resnet21"], "unknown model 'resnet21'"),
             (["--model", "resnet20", "--level", "stage"], "--level 'stage'"),
             (["--model", "resnet20", "--batch-size", "0"], "--batch-size"),
             (["--model", "resnet20", "--image-size", "0"], "--image-size"),
             (["--model", "resnet20", "--out", str(tmp_path / "file" / "g")], "cannot write to --out"),
             (["--model", "resnet20", "--calibration", str(tmp_path / "none.json")], "does not exist"),
             (["--model", "test_graph_cli:gated_net"], "torch.fx cannot trace test_graph_cli:gated_net"),
             (["--model", "lenet5", "--image-size", "8"], "lenet5"),
             (["--model", "test_graph_cli:nothing"], "no layer that computes"),
             (["--model", "resnet20", "--precision", "fp8"], "--precision 'fp8'"),
             (["--model", "resnet20", "--precision", "bf16", "--calibration", str(cal_file)], "no bf16")]
    for flags, words in cases:
        argv = ["graph", "--batch-size", "2", *flags] + ([] if "--out" in flags else ["--out", str(tmp_path / "g")])
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.count("\n") == 0 and words in err, (flags, err)
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())  # nothing written
