"""The ring all-reduce's byte count (the trajectories are checked end to end in test_strategies.py)."""

import pytest

from scaletrain.comm.ring import ring_wire_bytes


@pytest.mark.parametrize("world", [2, 3, 4, 7])
@pytest.mark.parametrize("numel", [12, 1000, 1001])
def test_ring_sends_2_p_minus_1_over_p_per_rank(world, numel):
    per_rank = [ring_wire_bytes(numel, 4, world, r) for r in range(world)]
    assert sum(per_rank) == 2 * (world - 1) * numel * 4  # every chunk travels P-1 hops, twice
    assert max(per_rank) - min(per_rank) <= 2 * 4  # uneven chunks differ by one element each


def test_one_rank_sends_nothing():
    assert ring_wire_bytes(100, 4, 1, 0) == 0
