"""Dated records (`docs/results/*.md`, written by `python -m steps.record`) read back as data, for
`python -m steps.record --publish` (steps/record/publish.py): the record's facts (date, commit, wall
time, jobs), its host kind, its headline and every stage's table as rows of text cells.

A host kind is what the record itself says about the machine: CPU model, cores, GPUs and the CPU flags
that decide bf16/fp16 speed (the `- **CPU flags**:` line of records written since the flags were
captured; for an older record, the flags its own title names, e.g. "AMD EPYC (AVX512-BF16)", else
"CPU flags not recorded"). Two hosts with the same model string are one kind only when the records say
the same flags: nothing is inferred from the numbers or from prose elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Labels an older record's title uses for a CPU feature -> the /proc/cpuinfo flag
# (steps.tracking.provenance.CPU_FLAGS)
FLAG_LABELS = {
    "AMX-BF16": "amx_bf16",
    "AMX": "amx_bf16",
    "AVX512-BF16": "avx512_bf16",
    "AVX512-FP16": "avx512fp16",
    "AVX2": "avx2",
}
NOT_RECORDED = "CPU flags not recorded"
TITLE = re.compile(r"# (?:Results record: )?(\d{4}-\d{2}-\d{2})[:,] (.*), commit (\S+)\s*$")
CELL_SPLIT = re.compile(r"(?<!\\)\|")


class RecordFormatError(Exception):
    """A record that cannot be read: the message names the file, what is wrong and the fix."""


@dataclass
class Record:
    """One dated record: its facts, its host kind and its tables (section -> rows, cell text)."""

    path: Path
    date: str
    commit: str
    machine: str
    host_kind: str
    started: str = ""
    wall: str = ""
    jobs: str = ""
    command: str = ""
    tables: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    @property
    def other_config(self) -> str:
        """The config file the record's run named on top of the default (`configs/smoke.yaml`: a few cells
        on toy sizes; `configs/full.yaml`: the cells the default leaves out), '' for the default DAG. Such
        a record's numbers can be cited, but it never stands for its host kind in the published blocks,
        which compare the default DAG's (its wall time is another DAG's)."""
        found = re.search(r"--configfile[= ]+((?:[^-\s]\S*\s*)+)", self.command)  # one or more files
        files = found[1].strip("`").split() if found else []
        return " + ".join(f[f.index("configs/") :] if "configs/" in f else Path(f).name for f in files)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def short(self) -> str:
        return self.commit[:7]

    def sort_key(self) -> tuple[str, str, str]:
        return (self.date, self.started, self.name)

    def row(self, section: str, first: str) -> dict[str, str] | None:
        """The row of `section`'s table whose first column is `first` (a cell or a stage), or None."""
        return next((r for r in self.tables.get(section, []) if next(iter(r.values()), None) == first), None)

    def value(self, section: str, first: str, columns: tuple[str, ...]) -> str:
        """The text of the first of `columns` the row has, non-empty ("" when none): a column that a
        later version of the stage renames is read under either name (list the new name first)."""
        row = self.row(section, first) or {}
        return next((row[c] for c in columns if row.get(c, "") != ""), "")


def parse_tables(lines: list[str]) -> dict[str, list[dict[str, str]]]:
    """Each `## section`'s first Markdown table as rows of {column: cell text} (`\\|` unescaped)."""
    tables: dict[str, list[dict[str, str]]] = {}
    section, header = None, None
    for line in lines:
        if line.startswith("## "):
            section, header = line[3:].strip(), None
        elif section and section not in tables and line.startswith("|") and header is None:
            header = cells(line)
        elif section and header and line.startswith("|"):
            if not set(line.replace("|", "").strip()) <= {"-", ":", " "}:
                tables.setdefault(section, []).append(dict(zip(header, cells(line))))
        elif header:
            section, header = None, None  # the table ended: later tables of the section are not read
    return tables


def cells(line: str) -> list[str]:
    """The cells of one Markdown table row, `\\|` kept as `|`."""
    return [c.strip().replace("\\|", "|") for c in CELL_SPLIT.split(line.strip().strip("|"))]


def field_of(lines: list[str], name: str) -> str:
    """The text after `- **name**: ` in the record's facts list ("" when absent)."""
    prefix = f"- **{name}**: "
    return next((ln[len(prefix) :].strip() for ln in lines if ln.startswith(prefix)), "")


def stated_flags(machine: str) -> tuple[str, list[str]]:
    """(CPU model without the feature labels, flags those labels name) from a machine text such as
    "AMD EPYC (AVX512-BF16)"; "(R)" and other parentheses stay part of the model."""
    flags = []

    def take(match: re.Match) -> str:
        labels = [x.strip() for x in match.group(1).split(",")]
        if all(x in FLAG_LABELS for x in labels):
            flags.extend(FLAG_LABELS[x] for x in labels)
            return ""
        return match.group(0)

    return re.sub(r"\s*\(([^()]*)\)", take, machine).strip(), flags


def host_kind(machine: str, flags_line: str) -> str:
    """The host kind: "<CPU model>, <N> cores[; GPUs: ...]; <flags>" from the record's own words."""
    parts = [p.strip() for p in machine.split(";")]
    cpu_parts = [p.strip() for p in parts[0].split(",")]
    model, stated = stated_flags(cpu_parts[0])
    cores = next((p for p in cpu_parts[1:] if p.endswith("cores")), "? cores")
    gpus = [p for p in parts[1:] if p.startswith("GPUs")]
    flags = flags_line.split(" (", 1)[0].strip()
    if not flags or flags.startswith("not recorded"):
        flags = f"CPU flags {' '.join(stated)} (as the record states)" if stated else NOT_RECORDED
    else:
        flags = f"CPU flags {flags}"
    return "; ".join([f"{model}, {cores}", *gpus, flags])


def read_record(path: Path) -> Record:
    """The record at `path`, read from its title, facts list and tables."""
    lines = Path(path).read_text().splitlines()
    # steps.record: "# <date>: <machine>, commit <sha>"; the GPU campaign: "# Results record: <date>, <device>, ..."
    title = TITLE.match(lines[0] if lines else "")
    if not title:
        raise RecordFormatError(
            f"{path}: the first line is not '# <date>: <machine>, commit <sha>'; records are written by "
            "`python -m steps.record` and never edited: restore it from git"
        )
    date, title_machine, commit = title.groups()
    machine = field_of(lines, "machine").split(" (probed", 1)[0].split(" (not recorded", 1)[0] or title_machine
    device = field_of(lines, "device").split(" (", 1)[0]  # a GPU campaign record's device
    kind = f"{device} (GPU campaign)" if device else host_kind(machine, field_of(lines, "CPU flags"))
    run = field_of(lines, "run")
    wall = re.search(r"wall ([\d.]+ min)", run)
    jobs = re.search(r"\(jobs: ([^)]*)\)", run)
    started = re.search(r"started (\S+ \S+)", run) or re.search(r"([^\s;]+)", field_of(lines, "started"))
    return Record(
        path=Path(path),
        date=date,
        commit=field_of(lines, "commit") or commit,
        machine=machine,
        host_kind=kind,
        started=started.group(1) if started else "",
        wall=wall.group(1) if wall else "",
        jobs=jobs.group(1) if jobs else "",
        command=field_of(lines, "command"),
        tables=parse_tables(lines),
    )


def read_records(folder: Path) -> list[Record]:
    """Every dated record in `folder` (`<date>-<machine>-<commit>.md`), oldest first."""
    paths = sorted(p for p in Path(folder).glob("*.md") if re.match(r"\d{4}-\d{2}-\d{2}-", p.name))
    if not paths:
        raise RecordFormatError(
            f"{folder}: no dated record (<date>-<machine>-<commit>.md); write one with `python -m steps.record results`"
        )
    return sorted((read_record(p) for p in paths), key=Record.sort_key)


def latest_per_host_kind(records: list[Record], has=lambda r: True) -> list[Record]:
    """The newest record of each host kind among those `has` admits (smoke records never), newest first."""
    latest: dict[str, Record] = {}
    for r in sorted(records, key=Record.sort_key):
        if has(r) and not r.other_config:
            latest[r.host_kind] = r
    return sorted(latest.values(), key=Record.sort_key, reverse=True)
