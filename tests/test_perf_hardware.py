"""perf/hardware.py: the shipped profiles load, the roofline picks its bound on hand numbers, the links'
alpha and beta, and every kind of bad profile is one line naming the field."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from scaletrain.errors import UserError
from scaletrain.perf.hardware import (LAUNCH_OVERHEAD_S, Efficiency, describe, link, load_hardware,
                                      parse_hardware, roofline_time, shipped_profiles)

GOOD = """\
format = 1
name = "Toy node"
source = "made up for the tests"
[device]
kind = "cuda"
count = 4
memory_bytes = 16e9
memory_bandwidth_bytes_per_s = 1e12
[device.peak_flops]
fp32 = 10e12
bf16 = 100e12
[efficiency]
compute = 0.5
memory = 0.5
network = 0.5
[links]
intra_node_bytes_per_s = 100e9
intra_node_latency_s = 2e-6
inter_node_bytes_per_s = 10e9
inter_node_latency_s = 20e-6
[host]
cpu_cores = 32
"""


def toy(**changes):
    return dataclasses.replace(parse_hardware(tomllib.loads(GOOD), "toy.toml"), **changes)


def test_every_shipped_profile_loads():
    names = shipped_profiles()
    assert {"dgx-a100-80gb", "dgx-h100", "v100-sxm2-node", "l4-node"} <= set(names)
    for name in names:
        hw = load_hardware(name)
        assert hw.kind == "cuda" and hw.count == 8 and hw.supports("fp32") and hw.source
        assert hw.efficiency == Efficiency()  # none overrides the documented defaults
        assert hw.intra_node_bytes_per_s > hw.inter_node_bytes_per_s / hw.count  # inside a node is faster
        assert load_hardware(f"{name}.toml") == hw


def test_the_shipped_numbers_are_the_data_sheets():
    a100, h100, v100 = load_hardware("dgx-a100-80gb"), load_hardware("dgx-h100"), load_hardware("v100-sxm2-node")
    assert a100.peak_flops == {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}
    assert a100.memory_bandwidth_bytes_per_s == 2.039e12 and a100.inter_node_bytes_per_s == 8 * 200e9 / 8
    assert h100.peak_flops["bf16"] == 989.5e12 and h100.memory_bandwidth_bytes_per_s == 3.35e12
    assert not v100.supports("bf16") and v100.peak_flops["fp16"] == 125e12


def test_a_file_path_loads(tmp_path):
    (tmp_path / "toy.toml").write_text(GOOD)
    hw = load_hardware(str(tmp_path / "toy.toml"))
    assert hw.name == "Toy node" and hw.peak_flops == {"fp32": 10e12, "bf16": 100e12} and hw.cpu_cores == 32
    assert hw.memory_bytes == 16_000_000_000 and isinstance(hw.memory_bytes, int)
    assert hw.supports("bf16") and not hw.supports("fp16")


def test_optional_tables_take_their_defaults(tmp_path):
    text = GOOD.replace("[efficiency]\ncompute = 0.5\nmemory = 0.5\nnetwork = 0.5\n", "[efficiency]\nmemory = 0.9\n")
    (tmp_path / "toy.toml").write_text(text.replace("[host]\ncpu_cores = 32\n", ""))
    hw = load_hardware(str(tmp_path / "toy.toml"))
    assert hw.efficiency == Efficiency(memory=0.9) and hw.cpu_cores is None
    assert hw.efficiency.compute == Efficiency().compute and hw.loader_samples_per_s_per_core is None


def test_roofline_compute_bound():
    hw = toy()  # fp32: 10 TFLOP/s x 0.5 = 5e12 FLOP/s; memory 1 TB/s x 0.5 = 5e11 B/s
    # 1e12 FLOPs take 0.2 s; 1e9 bytes take 2 ms: compute bound
    assert roofline_time(1e12, 1e9, hw, "fp32") == pytest.approx(0.2 + LAUNCH_OVERHEAD_S["cuda"])
    # the same FLOPs in bf16 (100 TFLOP/s) on the tensor cores at their own efficiency: still above the 2 ms of memory
    assert roofline_time(1e12, 1e9, hw, "bf16", kernels=0) == pytest.approx(1e12 / (100e12 * hw.efficiency.tensor))
    half = toy(efficiency=Efficiency(compute=0.5, tensor=0.25, memory=0.5, network=0.5))
    assert roofline_time(1e12, 1e9, half, "bf16", kernels=0) == pytest.approx(0.04)
    # on a CPU profile every precision runs at the fp32 units' efficiency
    assert roofline_time(1e12, 1e9, toy(kind="cpu", efficiency=half.efficiency), "bf16", kernels=0) == \
        pytest.approx(0.02)


def test_roofline_memory_bound():
    hw = toy()
    # 1e9 FLOPs take 0.2 ms; 1e10 bytes take 20 ms: memory bound, whatever the precision
    assert roofline_time(1e9, 1e10, hw, "fp32", kernels=0) == pytest.approx(0.02)
    assert roofline_time(1e9, 1e10, hw, "bf16", kernels=0) == pytest.approx(0.02)
    # the ridge: 10 FLOPs per byte in fp32 (5e12 / 5e11), where the two bounds meet
    assert roofline_time(1e10, 1e9, hw, "fp32", kernels=0) == pytest.approx(2e-3)


def test_launch_overhead_counts_once_per_kernel():
    hw = toy()
    assert roofline_time(0, 0, hw, "fp32") == LAUNCH_OVERHEAD_S["cuda"] == 5e-6
    assert roofline_time(0, 0, hw, "fp32", kernels=10) == pytest.approx(50e-6)
    assert roofline_time(0, 0, toy(kind="cpu"), "fp32") == LAUNCH_OVERHEAD_S["cpu"]


def test_a_precision_the_device_lacks_names_what_it_has():
    with pytest.raises(UserError, match="Toy node has no fp16 .* fp32, bf16") as e:
        roofline_time(1e9, 1e9, toy(), "fp16")
    assert "\n" not in str(e.value)


def test_link_alpha_beta():
    hw = toy()
    assert link(hw, inter_node=False) == (2e-6, pytest.approx(1 / 50e9))  # 100 GB/s x 0.5
    assert link(hw, inter_node=True) == (20e-6, pytest.approx(1 / 5e9))  # 10 GB/s x 0.5
    alpha, beta = link(load_hardware("dgx-a100-80gb"), inter_node=False)
    assert 1 / beta == pytest.approx(300e9 * 0.8)


def test_describe_says_it_is_a_data_sheet_not_a_measurement():
    line = describe(toy())
    assert line == ("data sheet: Toy node (made up for the tests), roofline at 50% of the fp32 peak, 29% of "
                    "TF32's, 100% of fp16/bf16's, 50% of memory bandwidth, links at 50%, the host link at 75%: not a "
                    "measurement of this machine")
    assert "(fitted to published ResNet-50 throughputs)" in describe(load_hardware("dgx-a100-80gb"))


def error(tmp_path, text: str) -> str:
    (tmp_path / "dgx.toml").write_text(text)
    with pytest.raises(UserError) as e:
        load_hardware(str(tmp_path / "dgx.toml"))
    message = str(e.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "dgx.toml")), message
    return message


def test_a_missing_file_lists_the_shipped_profiles():
    with pytest.raises(UserError) as e:
        load_hardware("dgx-a200")
    message = str(e.value)
    assert "\n" not in message and "dgx-a200" in message and "dgx-a100-80gb, dgx-h100" in message


def test_a_toml_syntax_error_names_file_and_line(tmp_path):
    message = error(tmp_path, GOOD.replace("count = 4", "count 4"))
    assert "not valid TOML" in message and "line 6" in message


@pytest.mark.parametrize("key, message", [
    ("memory_bandwidth_bytes_per_s", "[device] memory_bandwidth_bytes_per_s is missing: add it (bytes per second)"),
    ("inter_node_latency_s", "[links] inter_node_latency_s is missing: add it (seconds)"),
    ("name", ": name is missing"),
])
def test_a_missing_field_is_named(tmp_path, key, message):
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith(f"{key} ="))
    assert message in error(tmp_path, text)


def test_a_missing_table_is_named(tmp_path):
    assert "the [links] table is missing" in error(tmp_path, GOOD.split("[links]")[0])
    no_peaks = GOOD.replace("fp32 = 10e12\nbf16 = 100e12\n", "")
    assert "[device.peak_flops] lists no precision" in error(tmp_path, no_peaks)


@pytest.mark.parametrize("old, new, message", [
    ("count = 4", 'count = "4"', '[device] count = "4" must be an integer'),
    ("count = 4", "count = 4.0", "[device] count = 4.0 must be an integer"),
    ("cpu_cores = 32", "cpu_cores = true", "[host] cpu_cores = true must be an integer"),
    ("memory_bytes = 16e9", "memory_bytes = 0", "[device] memory_bytes = 0 must be > 0"),
    ("fp32 = 10e12", "fp32 = -1e12", "[device.peak_flops] fp32 = -1e+12 must be > 0"),
    ("inter_node_bytes_per_s = 10e9", "inter_node_bytes_per_s = nan", "inter_node_bytes_per_s = nan must be a number"),
    ("intra_node_latency_s = 2e-6", "intra_node_latency_s = -1e-6",
     "[links] intra_node_latency_s = -1e-06 must be >= 0"),
    ('kind = "cuda"', 'kind = "rocm"', '[device] kind = "rocm" is not one of cuda, cpu'),
    ('name = "Toy node"', "name = 3", "name = 3 must be a non-empty string"),
])
def test_a_wrong_type_or_value_is_named(tmp_path, old, new, message):
    assert message in error(tmp_path, GOOD.replace(old, new))


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2"])
def test_an_efficiency_outside_0_1_is_named(tmp_path, value):
    message = error(tmp_path, GOOD.replace("compute = 0.5", f"compute = {value}"))
    assert f"[efficiency] compute = {value} must be in (0, 1]" in message


def test_an_efficiency_of_one_is_allowed(tmp_path):
    (tmp_path / "toy.toml").write_text(GOOD.replace("network = 0.5", "network = 1"))
    assert load_hardware(str(tmp_path / "toy.toml")).efficiency.network == 1.0


def test_another_format_is_refused_before_its_keys_are_read(tmp_path):
    assert "format = 2 is not one this scaletrain reads: write format = 1" in error(
        tmp_path, GOOD.replace("format = 1", "format = 2").replace("[device]", "[accelerator]"))
    assert "format is missing" in error(tmp_path, GOOD.replace("format = 1\n", ""))


def test_an_unknown_key_or_precision_is_named(tmp_path):
    assert "[device] has an unknown key 'memory_bandwith_bytes_per_s': the keys are kind, count," in error(
        tmp_path, GOOD.replace("memory_bandwidth_bytes_per_s", "memory_bandwith_bytes_per_s"))
    message = error(tmp_path, GOOD.replace("bf16 =", "int8 ="))
    assert "[device.peak_flops] has an unknown key 'int8': the keys are fp32, tf32, bf16, fp16" in message
    assert "[efficiency] has an unknown key 'compte'" in error(tmp_path, GOOD.replace("compute = 0.5", "compte = 0.5"))
    assert ("has an unknown key 'gpu': the keys are format, name, source, [device], [efficiency], [links], [host]"
            in error(tmp_path, GOOD.replace("[host]", "[gpu]")))
    assert "device must be a [device] table" in error(tmp_path, GOOD.split("[device]")[0] + "device = 3\n")
