"""`python -m steps.record --publish`: README.md and the write-ups take their numbers from the dated
records. A page marks a block

    <!-- record:NAME -->
    ...generated: do not edit...
    <!-- /record:NAME -->

and publishing rewrites what lies between from `docs/results/` (steps/record/blocks.py: BLOCKS[NAME]),
each block naming its records by file name. `--check` writes nothing and lists the blocks that differ.

A page's results sections are its `## ` sections whose title starts with "Measured", "Results" or
"Headline results" (RESULTS). Outside its blocks, every number in such a section must occur, as written
(thousands commas aside), in a record that section cites by file name: `unbacked` lists those that do
not (tests/test_published.py fails on them).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from steps.record.blocks import BLOCKS
from steps.record.read import Record, RecordFormatError, read_records

PAGES = ("README.md", "docs/*.md", "docs/results/README.md")
RECORDS = Path("docs/results")
# a marker is a line of its own (a marker quoted in prose or code is not one)
BLOCK = re.compile(r"^(<!-- record:([\w-]+) -->\n)(.*?)^(<!-- /record:\2 -->)$", re.S | re.M)
OPEN = re.compile(r"^<!-- record:([\w-]+) -->$", re.M)
RESULTS = re.compile(r"^## (Measured|Results|Headline results)\b.*$", re.M | re.I)
RECORD_NAME = re.compile(r"\d{4}-\d{2}-\d{2}-[\w.-]+?\.md")
NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?!\w|\.\d)", re.I)


class PublishError(Exception):
    """A page or record that cannot be published: the message names the file, the problem and the fix."""


def pages(root: Path) -> list[Path]:
    """The pages that may hold blocks: README.md, docs/*.md, docs/results/README.md."""
    return sorted({p for pattern in PAGES for p in Path(root).glob(pattern)})


def linker(page: Path):
    """A record -> a Markdown link to it, relative to `page`'s folder."""

    def link(r: Record) -> str:
        return f"[{r.name}]({os.path.relpath(r.path, page.parent)})"

    return link


def render_page(page: Path, records: list[Record]) -> str:
    """`page`'s text with every block regenerated from `records`."""
    text = page.read_text()
    opened, closed = OPEN.findall(text), [m.group(2) for m in BLOCK.finditer(text)]
    unknown = sorted(set(opened) - set(BLOCKS))
    if unknown:
        raise PublishError(f"{page}: unknown block(s) {', '.join(unknown)}; known: {', '.join(BLOCKS)}")
    if sorted(opened) != sorted(closed):
        unclosed = sorted(set(opened) - set(closed)) or opened
        raise PublishError(f"{page}: block {unclosed[0]} has no `<!-- /record:{unclosed[0]} -->` line: add it")
    link = linker(page)
    return BLOCK.sub(lambda m: f"{m.group(1)}\n{BLOCKS[m.group(2)](records, link)}\n\n{m.group(4)}", text)


def publish(root: Path, check: bool = False) -> list[Path]:
    """Regenerate every block of every page under `root`; the pages that changed (with `check`, that
    would change: nothing is written)."""
    try:
        records = read_records(Path(root) / RECORDS)
    except RecordFormatError as exc:
        raise PublishError(str(exc)) from None
    changed = []
    for page in pages(root):
        new = render_page(page, records)
        if new != page.read_text():
            changed.append(page)
            if not check:
                page.write_text(new)
    return changed


def results_sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each results section: from its `## ` heading to the next `#`/`##` heading."""
    out = []
    for m in RESULTS.finditer(text):
        rest = text[m.end() :]
        end = re.search(r"^#{1,2} ", rest, re.M)
        out.append((m.group(0), rest[: end.start()] if end else rest))
    return out


def numbers(text: str) -> set[str]:
    """The numbers in Markdown text, thousands commas dropped; link targets, link definitions, code
    spans and record file names are not prose and are skipped."""
    text = re.sub(r"^\[[^\]]+\]: .*$", "", text, flags=re.M)
    text = re.sub(r"\]\([^)]*\)|`[^`]*`", "", text)
    text = re.sub(r"(\d)x\b", r"\1×", RECORD_NAME.sub("", text))  # 2.30x: a ratio, as 2.30×
    return {n.replace(",", "").rstrip(",") for n in NUMBER.findall(text)}


def unbacked(page: Path, root: Path) -> list[str]:
    """Numbers outside blocks in `page`'s results sections that no record the section cites holds:
    each as 'page: section: number' (and a line for a section that cites no record at all)."""
    found = []
    folder = Path(root) / RECORDS
    for heading, body in results_sections(page.read_text()):
        cited = sorted(set(RECORD_NAME.findall(body)))
        backing = set().union(*(numbers((folder / c).read_text()) for c in cited if (folder / c).exists()))
        loose = numbers(heading + "\n" + BLOCK.sub("", body)) - backing
        found += [
            f"{page}: {heading}: {n} is in no record the section cites ({', '.join(cited) or 'none'})"
            for n in sorted(loose)
        ]
    return found
