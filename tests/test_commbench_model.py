"""commbench's --sizes parsing (its bandwidths and alpha-beta fit are tested in test_perf_alphabeta.py)."""

import pytest

from scaletrain.commbench.model import parse_size


def test_sizes_parse_to_float32_multiples():
    assert [parse_size(s) for s in ("1K", "64M", "4096", "1kb", "6")] == [1024, 64 << 20, 4096, 1024, 4]


def test_sizes_under_one_element_are_not_rounded_up():
    # the CLI refuses them; measuring 4 bytes for `--sizes 0` would answer another question
    assert [parse_size(s) for s in ("0", "3", "-1K")] == [0, 0, -1024]
    for bad in ("nan", "K", "big"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(OverflowError):
        parse_size("inf")
