"""commbench rendering: the measurement table next to the alpha-beta prediction."""

from __future__ import annotations

from typing import Any

from scaletrain import fmt
from scaletrain.grid import Grid


def table(rows: list[dict[str, Any]]) -> Grid:
    g = Grid("all-reduce: measured (slowest rank) and the alpha-beta model",
             ["strategy", "P", "size", "time us", "algbw GB/s", "busbw GB/s", "sent/rank", "model us", "error"])
    for r in sorted(rows, key=lambda r: (r["strategy"], r["world"], r["size"])):
        g.rows.append([r["strategy"], str(r["world"]), fmt.message_size(r["size"]), f"{r['time_s'] * 1e6:,.0f}",
                       f"{r['algbw'] / 1e9:.3f}", f"{r['busbw'] / 1e9:.3f}",
                       fmt.message_size(int(r["bytes_per_rank"])), f"{r['predicted_s'] * 1e6:,.0f}",
                       f"{r['error']:+.0%}"])
    return g


def fits_line(strategy: str, fit: dict[str, Any]) -> str:
    bw = fit["link_bytes_per_s"]
    return (f"{strategy}: alpha = {fit['alpha_s'] * 1e6:.1f} us per step, 1/beta = "
            f"{bw / 1e9:.3f} GB/s ({bw * 8 / 1e9:.2f} Gbit/s)" if bw else f"{strategy}: alpha only")
