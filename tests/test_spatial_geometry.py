"""comm/spatial/geometry.py: the halo a tile needs, against a brute force over the rows each output reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scaletrain.comm.spatial.geometry import TileGrid, Window, check_layer, halo, square_grid, why_not_tiled
from scaletrain.errors import UserError


def _read_by_own_outputs(window: Window, length: int, tiles: int, t: int) -> tuple[int, int]:
    """Brute force: of the rows the outputs tile t owns read, how many lie before and after its own rows."""
    k, s, p = window.kernel, window.stride, window.padding
    h = length // tiles
    outputs = range(t * h // s, (t + 1) * h // s)
    rows = [o * s - p + i for o in outputs for i in range(k)]
    return max(0, t * h - min(rows)), max(0, max(rows) - ((t + 1) * h - 1))


@given(k=st.integers(1, 7), s=st.integers(1, 2), p=st.integers(0, 4), tiles=st.integers(2, 4),
       per_tile=st.integers(2, 6))
def test_halo_is_what_the_owned_outputs_read(k, s, p, tiles, per_tile):
    window = Window(k, s, p)
    length = tiles * per_tile * s
    if why_not_tiled(window) is not None:
        assert not k - s <= 2 * p < k  # refused exactly when the output is not length / stride long
        return
    assert (length + 2 * p - k) // s + 1 == length // s  # the whole output splits into the tiles' parts
    before, after = halo(window)
    for t in range(tiles):
        need_before, need_after = _read_by_own_outputs(window, length, tiles, t)
        # an inner tile needs exactly the halo; an edge tile's extra rows are the padding's (the fill)
        assert need_before == (before if t > 0 else need_before) and need_before <= before
        assert need_after == (after if t < tiles - 1 else need_after) and need_after <= after


@pytest.mark.parametrize("window, widths", [
    (Window(3, 1, 1), (1, 1)), (Window(3, 2, 1), (1, 0)), (Window(7, 2, 3), (3, 2)), (Window(1, 2, 0), (0, 0)),
    (Window(2, 2, 0), (0, 0)), (Window(5, 1, 2), (2, 2)), (Window(1, 1, 0), (0, 0))])
def test_the_resnet_front_halos(window, widths):
    assert halo(window) == widths  # docs/design/spatial.md's table


@pytest.mark.parametrize("window, words", [
    (Window(3, 1, 0), "padding 0"), (Window(4, 1, 2), "padding 2"), (Window(3, 1, 1, dilation=2), "dilation 2")])
def test_windows_that_cannot_be_tiled_say_why(window, words):
    assert words in why_not_tiled(window)


def test_grids_are_as_square_as_the_tiles_allow():
    assert [square_grid(s) for s in (1, 2, 3, 4, 6, 8, 9)] == [(1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (2, 4),
                                                                (3, 3)]
    with pytest.raises(UserError, match="at least 1"):
        square_grid(0)


def test_neighbours_do_not_wrap_around():
    grid = TileGrid(2, 2)  # 0 1 / 2 3
    assert [grid.neighbours(i, 0) for i in range(4)] == [(None, 2), (None, 3), (0, None), (1, None)]
    assert [grid.neighbours(i, 1) for i in range(4)] == [(None, 1), (0, None), (None, 3), (2, None)]
    assert grid.split(8, 6, 3) == (slice(4, 8), slice(3, 6))


def test_layers_that_do_not_fit_a_tile_are_named():
    assert check_layer("stem", (Window(7, 2, 3), Window(7, 2, 3)), (16, 16)) == (8, 8)
    with pytest.raises(UserError, match="layer pool cannot run on tiles: a tile's width there is 3"):
        check_layer("pool", (Window(3, 2, 1), Window(3, 2, 1)), (4, 3))
    with pytest.raises(UserError, match="needs 3 rows of the neighbouring tile, which holds only 2"):
        check_layer("stem", (Window(7, 1, 3), Window(1, 1, 0)), (2, 8))
    with pytest.raises(UserError, match="height 7 does not divide into 2 tiles"):
        TileGrid(2, 2).check_sides(7, 8)
