"""Plain-text tables for the CLI."""

from __future__ import annotations

from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None) -> str:
    """Render rows as an aligned table; numbers right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


def _is_number(text: str) -> bool:
    text = text.replace("$", "").replace(",", "").replace("%", "").replace("x", "")
    if not text or text == "-":
        return True
    try:
        float(text)
        return True
    except ValueError:
        return False
