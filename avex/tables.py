"""One Markdown table writer for every report the toolkit prints or writes."""
from __future__ import annotations

from typing import Iterable, Sequence

__all__ = ["markdown_table"]


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A GitHub-flavoured Markdown table: ``header`` cells, then one line per row.

    Cells are written with ``str()``; a row shorter than the header is padded with empty
    cells, a longer one is an error (it would shift every column after it)."""
    header = [str(h) for h in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        cells = [str(c) for c in row]
        if len(cells) > len(header):
            raise ValueError(f"row {i} has {len(cells)} cells but the header has {len(header)}: "
                             f"{cells}")
        cells += [""] * (len(header) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
