"""units.py: the one parser of each unit users write (sizes here; rates and latencies in the commands' tests)."""

import pytest

from scaletrain.errors import UserError
from scaletrain.units import parse_size, size_flag


def test_sizes_binary_alone_and_with_i_decimal_with_b():
    assert [parse_size(s) for s in ("4096", "1K", "64M", "1KiB", "1kb", "2GB", "1.5G", "6", "1T")] == \
        [4096, 1024, 64 << 20, 1024, 1000, 2 * 10**9, 3 << 29, 6, 1 << 40]


def test_the_caller_says_which_sizes_it_takes():
    # commbench refuses what rounds under one float32 element, split anything not positive: parse_size keeps the sign
    assert [parse_size(s) for s in ("0", "3", "-1K")] == [0, 3, -1024]
    for bad in ("nan", "K", "big", "1.2.3M", ""):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(OverflowError):
        parse_size("inf")
    with pytest.raises(UserError, match="^--flag '0': give a positive size"):
        size_flag("0", "--flag")
