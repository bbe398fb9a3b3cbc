"""The report's deterministic values, and the comparison of two runs' reports.

    python -m steps.report.values RESULTS_A RESULTS_B     # e.g. before/results after/results

Every value of every table in `<results>/reports/*.csv` except the columns that time, rate or
measure the process (they differ run to run: TIMED below, and each stage presentation's
`measured` columns), and the measured ratios a text column quotes with
their interval ("jit 193× [180, 201] eager's speed" in jax_lessons' notes): what must stay
identical across a refactor, a cluster run or a second run of the same config."""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

# report columns that time, rate or measure the process (RSS peaks): every other value must match
TIMED = re.compile(
    r"/s|peak mem|GEMM peak|MFU|×|ours/|% peak|pairs|interval|low|high|p10|p90|vs baseline|wall|time|compile s"
    r"|run_id|_id$"
)
# a measured ratio written into text with its interval, "193× [180, 201]": masked, the words around it kept
TIMED_IN_TEXT = re.compile(r"\d[\d.,e+-]*× \[[^\]]*\]")


def measured_columns(stage: str) -> frozenset[str]:
    """The columns `stage`'s presentation declares measured (none for a table of no stage)."""
    from steps.compare.table import presentation_of

    shown = presentation_of(stage)
    return frozenset(shown.measured) if shown else frozenset()


def report_values(results: Path) -> dict[tuple[str, str, str], str]:
    """{(table, cell, column): value} of every report table under `results/reports`, timings left out."""
    values = {}
    for table in sorted((Path(results) / "reports").glob("*.csv")):
        measured = measured_columns(table.stem)
        with table.open() as f:
            for row in csv.DictReader(f):
                for col, value in row.items():
                    if col not in ("cell", "reason", *measured) and not TIMED.search(col):
                        values[table.stem, row["cell"], col] = TIMED_IN_TEXT.sub("(timed)", value)
    return values


def differences(a: dict, b: dict) -> dict:
    """{key: (a's, b's)} wherever the two differ, a key missing on one side shown as None."""
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    a, b = (report_values(Path(p)) for p in argv)
    for path, values in zip(argv, (a, b)):
        if not values:
            print(
                f"{path}: no report tables under {Path(path) / 'reports'} (run the DAG's report first)", file=sys.stderr
            )
            return 2
    diff = differences(a, b)
    for key, (x, y) in diff.items():
        print(f"{'/'.join(key)}: {x!r} != {y!r}")
    print(f"{len(set(a) | set(b))} deterministic report values compared; {len(diff)} differ")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
