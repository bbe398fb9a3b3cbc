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

Every other section states numbers too. There `unbacked_prose` checks the numbers shaped like a
measurement (MEASURED): an error in scientific notation with a decimal mantissa (2.4e-7; a tolerance
written 1e-7 is a setting), or a number with a decimal part or thousands commas followed by a ratio
sign or unit (0.37×, 17.9 s, 2.4 %, 5,123 tokens/s). Integers with a unit (a 15 s timeout, 24 GiB, a
4× target), formulas and config values are not measurement-shaped and are not checked. Each such
number must occur in a record cited by its section or, failing that, anywhere on its page; a value
quoted from the literature or a seed document carries `<!-- quoted -->` on its line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from steps.record.blocks import BLOCKS
from steps.record.read import Record, RecordFormatError, read_records

PAGES = ("README.md", "docs/*.md", "docs/results/README.md")
PROSE_PAGES = (*PAGES, "configs/README.md")  # the pages whose prose numbers unbacked_prose checks
RECORDS = Path("docs/results")
# a marker is a line of its own (a marker quoted in prose or code is not one)
BLOCK = re.compile(r"^(<!-- record:([\w-]+) -->\n)(.*?)^(<!-- /record:\2 -->)$", re.S | re.M)
OPEN = re.compile(r"^<!-- record:([\w-]+) -->$", re.M)
RESULTS = re.compile(r"^## (Measured|Results|Headline results)\b.*$", re.M | re.I)
RECORD_NAME = re.compile(r"\d{4}-\d{2}-\d{2}-[\w.-]+?\.md")
_UNIT = (
    r"(?:×|x\b|\s?%|\s?(?:ms|µs|s|min|h|GiB|MiB|KiB|GB|MB|TB|TFLOPS|[GT]FLOP/s|tokens/s|tok/s|words/s|steps/s)(?!\w))"
)
_DECIMAL, _COMMAS = r"(?<![\w.,/-])\d[\d,]*\.\d+", r"(?<![\w.,/-])\d{1,3}(?:,\d{3})+(?![\d.])"
MEASURED = re.compile(rf"{_DECIMAL}e[-+]?\d+|(?:{_DECIMAL}|{_COMMAS})(?={_UNIT})", re.I)
QUOTED = "<!-- quoted -->"  # on a line: its numbers are quoted from the literature or a seed, not measured
NUMBER = re.compile(r"(?<![\w.,])\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?!\w|\.\d)", re.I)


class PublishError(Exception):
    """A page or record that cannot be published: the message names the file, the problem and the fix."""


def pages(root: Path) -> list[Path]:
    """The pages that may hold blocks: README.md, docs/*.md, docs/results/README.md."""
    return sorted({p for pattern in PAGES for p in Path(root).glob(pattern)})


def prose_pages(root: Path) -> list[Path]:
    """The pages whose measurement-shaped prose numbers need a record: PAGES and configs/README.md."""
    return sorted({p for pattern in PROSE_PAGES for p in Path(root).glob(pattern)})


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


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every `#`/`##` section (the text before the first heading under "")."""
    parts = re.split(r"^(#{1,2} .*)$", text, flags=re.M)
    return [("", parts[0]), *zip(parts[1::2], parts[2::2], strict=True)]


def prose(text: str) -> str:
    """Markdown text without its blocks, fenced code, code spans, link targets, link definitions,
    record file names and the lines marked QUOTED."""
    text = BLOCK.sub("", text)
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"^\[[^\]]+\]: .*$|^.*" + re.escape(QUOTED) + ".*$", "", text, flags=re.M)
    return RECORD_NAME.sub("", re.sub(r"\]\([^)]*\)|`[^`]*`", "", text))


def backing(names, folder: Path) -> set[str]:
    """The numbers the named records hold (numbers()' spelling)."""
    return set().union(*(numbers((folder / n).read_text()) for n in set(names) if (folder / n).exists()))


def unbacked_prose(page: Path, root: Path) -> list[str]:
    """Measurement-shaped numbers (MEASURED) outside blocks in any section of `page` that no record
    cited by the section, or by the page, holds: each as 'page: section: number'."""
    folder, text = Path(root) / RECORDS, page.read_text()
    on_page = backing(RECORD_NAME.findall(text), folder)
    found = []
    for heading, body in sections(text):
        held = on_page | backing(RECORD_NAME.findall(body), folder)
        loose = sorted({n for n in MEASURED.findall(prose(heading + "\n" + body)) if n.replace(",", "") not in held})
        found += [f"{page}: {heading or '(top)'}: {n} is in no record the section or page cites" for n in loose]
    return found
