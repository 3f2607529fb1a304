"""predict/l2.py: the cores' L2, read from sysfs, and the bytes a step brings an op cold."""

from __future__ import annotations

from scaletrain.predict import l2


def test_sysfs_sizes_parse():
    assert l2.parse_size("1024K\n") == 2 ** 20 and l2.parse_size("2M") == 2 * 2 ** 20 and l2.parse_size("512") == 512


def test_this_machine_has_an_l2_of_a_plausible_size():
    assert 64 * 2 ** 10 <= l2.l2_bytes() <= 64 * 2 ** 20


def test_the_cold_bytes_stop_at_the_l2_of_the_cores_the_op_runs_on():
    assert l2.cold_bytes(100, 1, 2 ** 20) == 100
    assert l2.cold_bytes(3 * 2 ** 20, 1, 2 ** 20) == 2 ** 20
    assert l2.cold_bytes(3 * 2 ** 20, 2, 2 ** 20) == 2 * 2 ** 20
