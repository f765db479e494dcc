"""Plain-text tables for the command line (no dependency, stable column widths)."""

from __future__ import annotations

from typing import Iterable, Sequence


def render_table(headers: Sequence[str], rows: Iterable[Sequence[object]], *,
                 align: str | None = None, title: str | None = None) -> str:
    """Render rows under headers; ``align`` is one char per column, ``l`` or ``r``."""
    body = [[_cell(c) for c in row] for row in rows]
    cols = len(headers)
    align = align or "l" + "r" * (cols - 1)
    widths = [max([len(headers[i])] + [len(r[i]) for r in body]) for i in range(cols)]

    def line(cells: Sequence[str]) -> str:
        out = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)]
        return "  ".join(out).rstrip()

    parts = [title] if title else []
    parts += [line(headers), "  ".join("-" * w for w in widths)]
    parts += [line(r) for r in body]
    return "\n".join(parts)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if value != int(value) else f"{int(value):,}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
