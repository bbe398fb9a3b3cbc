"""The tables in four formats: `table` (plain text that fits the terminal: columns that do not fit are
named under it, never wrapped into further blocks), `markdown`, `csv` (one table, a `stage` column
first) and `json` ({stage: [row, ...]}, numbers as numbers, missing as null)."""

from __future__ import annotations

import io
import json
import math
import re

import pandas as pd

MAX_CELL = 28  # characters of a value in the text table (a ratio with its interval and verdict fits)
WIDER = {"params changed": 56}  # a column that says why, cut later (`--vs`: why a cell reran)


def fmt(v) -> str:
    """A value for the text and markdown tables: '-' when missing, numbers to 4 significant digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if (v.is_integer() or abs(v) >= 1e4) and abs(v) < 1e12 else f"{v:.4g}"
    return str(v)


def clip(s: str, width: int = MAX_CELL) -> str:
    return s if len(s) <= width else s[: width - 1] + "…"


LEADING_NUMBER = re.compile(r"^[-+]?(\d[\d,]*\.?\d*(e[-+]?\d+)?|\.\d+|inf|nan)(\s|$)")  # not '6f4f9c7e', '2026-11-26'


def numeric(col: pd.Series) -> bool:
    """Numbers, or text that leads with one ('2.1 [1.9, 2.3] faster', '330 (+50.0%)'): right-aligned."""
    if pd.api.types.is_numeric_dtype(col):
        return True
    values = col.dropna()
    return len(values) > 0 and all(LEADING_NUMBER.match(str(v)) for v in values)


def text_table(table: pd.DataFrame, width: int) -> tuple[str, list[str]]:
    """(plain text, numbers right-aligned, text left-aligned, within `width` characters; the titles of
    the columns that did not fit)."""
    out, used, left = [], 0, []
    for name in table.columns:
        just = str.rjust if numeric(table[name]) else str.ljust
        most = WIDER.get(str(name), MAX_CELL)
        cells = [clip(str(name)), *(clip(fmt(v), most) for v in table[name])]
        w = max(map(len, cells))
        if left or (out and used + 2 + w > width):  # in order: the first that does not fit ends the table
            left.append(str(name))
            continue
        out.append([just(c, w) for c in cells])
        used += w + (2 if len(out) > 1 else 0)
    lines = ["  ".join(col[i] for col in out).rstrip() for i in range(len(table) + 1)]
    return "\n".join(lines), left


def text_block(title: str, table: pd.DataFrame, notes: list[str], width: int) -> str:
    """One stage's screen: its title line, the table, then the notes (one line each)."""
    if table.empty:
        return "\n".join([f"== {title} ==", "(no runs)"])
    body, left = text_table(table, width)
    if left:
        more = f"{len(left)} more column(s) (wider terminal, or --format csv|json): {', '.join(left)}"
        notes = [clip(more, width), *notes]
    return "\n".join([f"== {title} ==", body, *notes])


def markdown_block(title: str, table: pd.DataFrame, notes: list[str]) -> str:
    """`## title`, a pipe table (every column), the notes as a paragraph."""
    if table.empty:
        return f"## {title}\n\n(no runs)\n"
    right = [numeric(table[c]) for c in table.columns]
    lines = ["| " + " | ".join(_md(c) for c in table.columns) + " |"]
    lines.append("|" + "|".join("---:" if n else "---" for n in right) + "|")
    lines += ["| " + " | ".join(_md(fmt(v)) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join([f"## {title}", "", *lines, "", *([" ".join(notes), ""] if notes else [])])


def _md(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def plain(v):
    """A cell for csv/json: numbers as numbers, missing as None."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
        return None if isinstance(v, float) and math.isnan(v) else v
    return v


def records(table: pd.DataFrame) -> list[dict]:
    return [{c: plain(v) for c, v in zip(table.columns, row)} for row in table.itertuples(index=False)]


def as_json(tables: dict[str, pd.DataFrame], extra: dict | None = None) -> str:
    out = {**(extra or {}), "stages": {s: records(t) for s, t in tables.items()}}
    return json.dumps(out, indent=1, ensure_ascii=False)


def as_csv(tables: dict[str, pd.DataFrame]) -> str:
    """Every stage's rows in one CSV, `stage` first; a column a stage lacks is empty in its rows."""
    frames = [t.assign(stage=s)[["stage", *t.columns]] for s, t in tables.items() if not t.empty]
    buf = io.StringIO()
    if frames:
        pd.concat(frames, ignore_index=True, sort=False).to_csv(buf, index=False)
    return buf.getvalue().rstrip("\n")
