"""The terminal's frame as a self-refreshing HTML page: rich records it and exports it, we add the refresh."""

from __future__ import annotations

import io
from html import escape
from pathlib import Path

from rich.console import Console, RenderableType
from rich.terminal_theme import DEFAULT_TERMINAL_THEME

from scaletrain.rundir import replace_atomic

WIDTH = 140  # columns the frame is laid out in

# rich's own page (rich._export_format), with a title and the browser's reload every `refresh` seconds
PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="UTF-8">
<meta http-equiv="refresh" content="{refresh}">
<title>{title}</title>
<style>
{{stylesheet}}
body {{{{
    color: {{foreground}};
    background-color: {{background}};
}}}}
</style>
</head>
<body>
    <pre style="font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace"><code style="font-family:inherit">{{code}}</code></pre>
</body>
</html>
"""


def page(renderable: RenderableType, refresh_s: float, title: str) -> str:
    """The HTML of `renderable` laid out as on a WIDTH-column terminal, reloading every `refresh_s` seconds."""
    console = Console(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(renderable)
    template = PAGE.format(refresh=max(1, round(refresh_s)), title=escape(title))
    return console.export_html(theme=DEFAULT_TERMINAL_THEME, code_format=template, inline_styles=True)


def write_page(path: Path, renderable: RenderableType, refresh_s: float, title: str) -> None:
    """Rewrite `path` atomically: a browser reloading it never reads half a page."""
    text = page(renderable, refresh_s, title)
    replace_atomic(Path(path), lambda f: f.write(text), mode="w")
