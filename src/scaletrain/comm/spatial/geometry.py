"""Where the tiles of an image are and what each layer needs of its neighbours (pure: no torch).

An image of H x W is cut into a grid of R x C tiles (S = R x C ranks); tile (r, c) holds rows
[r h, (r + 1) h) and columns [c w, (c + 1) w) with h = H / R, w = W / C. A window layer (convolution,
pooling) of kernel k, stride s and padding p runs on a tile exactly when

    k - s <= 2p < k          (its output is H / s long: "same" padding, odd k)
    h % s == 0               (every tile starts on the stride's phase)

and then needs `before = p` rows from the tile above and `after = k - s - p` rows from the tile below (0 when
negative): padded with those halos (or the fill at the image's true edge), the layer run without padding gives
exactly the tile's own output rows. The same holds for columns. docs/design/spatial.md derives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaletrain.errors import UserError


@dataclass(frozen=True)
class Window:
    """A layer's window along one dimension."""

    kernel: int
    stride: int = 1
    padding: int = 0
    dilation: int = 1


def halo(window: Window) -> tuple[int, int]:
    """(before, after): the rows a tile needs from the tile before it and the tile after it."""
    k, s, p = window.kernel, window.stride, window.padding
    return p, max(0, k - s - p)


def why_not_tiled(window: Window) -> str | None:
    """Why a tile cannot compute its own part of this window's output exactly (None: it can)."""
    k, s, p = window.kernel, window.stride, window.padding
    if window.dilation != 1:
        return f"dilation {window.dilation} (only 1 is tiled)"
    if not k - s <= 2 * p < k:
        return (f"kernel {k}, stride {s}, padding {p}: its output is not the input's length / stride (tiles need "
                f"{k - s} <= 2 x padding < {k}, e.g. \"same\" padding {k // 2} with an odd kernel)")
    return None


def square_grid(tiles: int) -> tuple[int, int]:
    """`--spatial S` as a grid R x C with R <= C, as square as S allows: 2 -> 1x2, 4 -> 2x2, 6 -> 2x3."""
    if tiles < 1:
        raise UserError(f"--spatial {tiles}: give the number of tiles per image, at least 1")
    rows = max(r for r in range(1, math.isqrt(tiles) + 1) if tiles % r == 0)
    return rows, tiles // rows


@dataclass(frozen=True)
class TileGrid:
    """R x C tiles, numbered row by row: tile i is at (i // C, i % C)."""

    rows: int
    cols: int

    @property
    def tiles(self) -> int:
        return self.rows * self.cols

    def at(self, index: int) -> tuple[int, int]:
        return divmod(index, self.cols)

    def index(self, row: int, col: int) -> int:
        return row * self.cols + col

    def neighbours(self, index: int, dim: int) -> tuple[int | None, int | None]:
        """The tiles before and after `index` along dim 0 (rows: above, below) or 1 (columns: left, right);
        None at the image's edge (the grid does not wrap around)."""
        r, c = self.at(index)
        extent, pos = (self.rows, r) if dim == 0 else (self.cols, c)
        step = (lambda d: self.index(r + d, c)) if dim == 0 else (lambda d: self.index(r, c + d))
        return (step(-1) if pos > 0 else None), (step(1) if pos < extent - 1 else None)

    def split(self, height: int, width: int, index: int) -> tuple[slice, slice]:
        """The rows and columns of the whole image that tile `index` holds."""
        r, c = self.at(index)
        h, w = height // self.rows, width // self.cols
        return slice(r * h, (r + 1) * h), slice(c * w, (c + 1) * w)

    def check_sides(self, height: int, width: int, what: str = "the image") -> None:
        """Every tile the same size: the sides divide by the grid."""
        for side, extent, name in ((height, self.rows, "height"), (width, self.cols, "width")):
            if side % extent:
                raise UserError(f"{what}'s {name} {side} does not divide into {extent} tiles of a {self.rows}x"
                                f"{self.cols} grid: give an image side that is a multiple of {extent}")


def check_side(name: str, window: Window, side: int, what: str) -> None:
    """Refuse (one line naming the layer) a window a tile's `side` along a tiled dimension cannot run exactly."""
    why = why_not_tiled(window)
    if why is None and side % window.stride:
        why = (f"a tile's {what} there is {side}, not a multiple of its stride {window.stride} (give an image "
               "side that divides by the tiles times the strides before it)")
    before, after = halo(window)
    if why is None and max(before, after) > side:
        why = (f"it needs {max(before, after)} rows of the neighbouring tile, which holds only {side} there "
               "(fewer tiles, or a larger image)")
    if why is not None:
        raise UserError(f"layer {name} cannot run on tiles: {why}; or end the tiled front before it "
                        "(--spatial-until)")


def check_layer(name: str, windows: tuple[Window, Window], tile: tuple[int, int]) -> tuple[int, int]:
    """check_side along both dimensions of a tile of `tile` = (h, w), both tiled; the tile's size after it."""
    for window, side, what in zip(windows, tile, ("height", "width")):
        check_side(name, window, side, what)
    return tile[0] // windows[0].stride, tile[1] // windows[1].stride
