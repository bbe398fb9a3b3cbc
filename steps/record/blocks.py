"""The blocks `python -m steps.record --publish` writes into README.md and the write-ups: each one a
function of the dated records (steps/record/read.py) and of how the page links to a record.

Every block shows the latest record per host kind (one column each, naming its record by file name) or,
for the list of runs, every record. Values are the records' own text, copied, never reformatted, so a
reader finds each number in the record it cites. To add a block: write `def name(records, link) -> str`
and list it in BLOCKS; a column a later stage version renames (scale's `predicted_*`) is read by
listing both names in the row's column tuple, the new name first.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from functools import partial

from steps.record.read import Record, latest_per_host_kind

Link = Callable[[Record], str]  # a record -> a Markdown link to it from the page being written
Row = tuple[str, Callable[[Record], str]]  # (row label, the record's value for it)

MISSING = "n/a"
NO_PAIRS = "pair count not recorded"
# miniTorch's fast backend target (docs/minitorch.md): within 4x of torch eager on the GPT step
TORCH_TARGET = 0.25
REFERENCE_TARGET = 20.0  # and at least 20x its own reference backend (the definition in NumPy)
FLOOR = 20  # steps.paired.MIN_PAIRS, the lab's floor for a published ratio (not imported: it loads SciPy)


def md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(md_cell(c) or MISSING for c in row) + " |" for row in rows])


def grid(records: list[Record], link: Link, rows: list[Row], section: str) -> str:
    """One column per host kind (its latest record that has `section`), one line per row."""
    shown = latest_per_host_kind(records, lambda r: section in r.tables)
    header = ["", *(r.host_kind for r in shown)]
    body = [["record", *(link(r) for r in shown)]]
    body += [[label, *(get(r) for r in shown)] for label, get in rows]
    return md_table(header, body)


def joined(section: str, first: str, *columns: str | tuple[str, ...]) -> Callable[[Record], str]:
    """A row getter: `section`'s row `first`, each of `columns` (a tuple: the names one column has had,
    the newest first) joined by " / "; "" when the row has none of them."""

    def get(r: Record) -> str:
        values = [r.value(section, first, c if isinstance(c, tuple) else (c,)) for c in columns]
        return " / ".join(values) if any(values) else ""

    return get


def key_number(stage: str) -> Callable[[Record], str]:
    """The record's headline key number of `stage`, without the label the row already says."""

    def get(r: Record) -> str:
        text = r.value("Headline", stage, ("key number",))
        return text.split(": ", 1)[1] if ": " in text else text

    return get


def pairs_text(pairs: str) -> str:
    """A ratio's pair count as its record gives it ("20 pairs"; under the lab's floor "10 pairs, below
    the floor of 20"), or that the record has none (written before the count was kept)."""
    count = re.match(r"\d+(?:\.0*)?$", pairs.strip())
    if not count:
        return f"{pairs} pairs" if pairs else NO_PAIRS
    n = int(float(count.group(0)))
    return f"{pairs} pairs" + (f", below the floor of {FLOOR}" if n < FLOOR else "")


def floor_said(text: str) -> str:
    """A recorded ratio text that states its pairs ("... (12 pairs, faster)") with "below the floor"
    after each count under FLOOR; one that states none gets "(pair count not recorded)"."""
    if not text:
        return text
    if not re.search(r"\b\d+ pairs\b", text):
        return f"{text} ({NO_PAIRS})"
    return re.sub(r"\b(\d+) pairs\b", lambda m: pairs_text(m.group(1)), text)


def vs_gensim(cell: str) -> Callable[[Record], str]:
    """`cell`'s words/s ratio to gensim with its interval and pairs, without the long how-it-was-timed
    tail."""
    return lambda r: floor_said(r.value("word2vec", cell, ("× gensim 95 % interval",)).split(":", 1)[0])


def key_ratio(stage: str, pairs_column: str) -> Callable[[Record], str]:
    """The record's headline key number of `stage`, a ratio "1.9 [1.8, 2.0] (cell)", with the pair
    count of that cell's row in `stage`'s table: "1.9 [1.8, 2.0] (cell, 20 pairs)". A key number
    naming no cell ("none: no cell beat the baseline ...") gets the fewest pairs of any cell."""
    number = key_number(stage)

    def get(r: Record) -> str:
        text = number(r)
        named = re.match(r"(.*) \(([^()]*)\)$", text)
        if not text or not named:
            counts = {row.get(pairs_column, "") for row in r.tables.get(stage, [])} - {""}
            fewest = min(counts, key=lambda c: (float(c) if re.match(r"[\d.]+$", c) else 0.0, c), default="")
            each = "each" if len(counts) == 1 else "at the fewest"
            return text and f"{text} ({pairs_text(fewest) + (' ' + each if fewest else '')})"
        value, cell = named.groups()
        return f"{value} ({cell}, {pairs_text(r.value(stage, cell, (pairs_column,)))})"

    return get


SAME_BATCH = ("batch_size", "grad_accum")  # a change of these is not one change at the same batch


def perf_fair(r: Record) -> str:
    """The fair perf comparison: the best cell that makes one change from the baseline at the same
    batch, "1.57 [1.45, 1.70] (amp_bf16, 20 pairs)", or that none of them beat it beyond noise."""
    rows = []
    for row in r.tables.get("perf", []):
        change = [c.strip() for c in row.get("Change", "").split(",") if c.strip()]
        ok = row.get("status") == "ok" and len(change) == 1 and not change[0].startswith(SAME_BATCH)
        try:
            ratio, low, high = (float(row[c]) for c in ("× baseline", "low", "high"))
        except (KeyError, ValueError):
            continue
        if ok:
            rows.append((low, ratio, high, row))
    if not rows:
        return ""
    low, ratio, high, row = max(rows, key=lambda t: (t[0] > 1, t[1]))
    if low <= 1:
        counts = sorted({x[3].get("pairs", "") for x in rows} - {""})
        return (
            f"none: no single change beat the baseline beyond noise ({pairs_text(counts[0]) if counts else NO_PAIRS})"
        )
    interval = f"{fmt_number(ratio)} [{fmt_number(low)}, {fmt_number(high)}]"
    return f"{interval} ({row['cell']}, {pairs_text(row.get('pairs', ''))})"


def fmt_number(x: float) -> str:
    return f"{x:.4g}"


KV_CACHE = key_ratio("inference", "speed-up pairs")  # the headline's KV-cache speed-up with its pairs


def wall(r: Record) -> str:
    return f"{r.wall} ({r.jobs})" if r.wall else ""


def interval_verdict(low: float, high: float, target: float = TORCH_TARGET) -> str:
    """Met only when the whole 95 % interval reaches the target, missed when it all falls short."""
    if high < target:
        return "missed"
    return "met" if low >= target else "not decided"


def target_verdict(low: float, high: float, target: float = TORCH_TARGET) -> str:
    """interval_verdict, saying why where it is undecided."""
    verdict = interval_verdict(low, high, target)
    return f"{verdict} (the interval spans the target)" if verdict == "not decided" else verdict


def judged(mid: str, low: str, high: str, pairs: str, target: float) -> str:
    """A recorded ratio with its interval and pairs, and the target's verdict by that interval; a
    ratio recorded without its interval is not judged, and says why ("" where there is no ratio)."""
    text = ratio_text(mid, low, high, pairs)
    if not text:
        return ""
    if low and high:
        return f"{text}: target {target_verdict(float(low), float(high), target)}"
    return f"{text}: target not judged (the record keeps no interval)"


def torch_columns(r: Record, cell: str) -> tuple[str, str, str]:
    """`cell`'s × torch eager ratio and its 95 % interval, as recorded ("" where a column is absent)."""
    mid, low, high = (r.value("minitorch", cell, (c,)) for c in ("× torch eager", "× torch low", "× torch high"))
    return mid, low, high


def interval_text(mid: str, low: str, high: str) -> str:
    """A recorded ratio with its interval, "1.29× [1.2, 1.4]" (no interval: "1.29×"; none: "")."""
    return f"{mid}× [{low}, {high}]" if mid and low and high else (f"{mid}×" if mid else "")


def ratio_text(mid: str, low: str, high: str, pairs: str) -> str:
    """interval_text with the ratio's pair count (pairs_text): "1.29× [1.2, 1.4] (20 pairs)"."""
    text = interval_text(mid, low, high)
    return f"{text} ({pairs_text(pairs)})" if text else ""


def with_interval(section: str, cell: str, mid: str, low: str, high: str, pairs: str) -> Callable[[Record], str]:
    """A row getter: `cell`'s `mid` column with its recorded interval and pair count (ratio_text)."""
    return lambda r: ratio_text(*(r.value(section, cell, (c,)) for c in (mid, low, high, pairs)))


def torch_ratio(cell: str, with_target: bool = False) -> Callable[[Record], str]:
    """`cell`'s tokens/s ÷ torch eager's with its interval and pairs (and the target's verdict by the
    interval), as recorded."""

    def get(r: Record) -> str:
        mid, low, high = torch_columns(r, cell)
        pairs = r.value("minitorch", cell, ("× torch pairs",))
        return judged(mid, low, high, pairs, TORCH_TARGET) if with_target else ratio_text(mid, low, high, pairs)

    return get


def vs_reference(r: Record) -> str:
    """gpt_fast's speed over the reference backend, with its interval and pairs, against the ≥ 20×
    target: judged by the interval, as the torch target is; a record that keeps no interval for it
    (those written before its columns) is not judged."""
    columns = ("× reference", "× reference low", "× reference high", "× reference pairs")
    return judged(*(r.value("minitorch", "gpt_fast", (c,)) for c in columns), REFERENCE_TARGET)


def headline(records: list[Record], link: Link) -> str:
    """README's headline: the fair comparison of each stage, the latest record per host kind."""
    interval = "words/s, 1 thread each, interleaved, 95 % interval"
    rows: list[Row] = [
        ("the default DAG, `snakemake --cores 2`: wall time (jobs)", wall),
        (f"word2vec per pair (word2vec.c's sampling, as gensim) vs gensim, {interval}", vs_gensim("sgd_perpair")),
        ("word2vec shared negatives (one draw per window: fewer samples than gensim)", vs_gensim("sgd")),
        ("perf, fair: best single change at the baseline's batch vs the fp32 eager baseline, 95 % interval", perf_fair),
        (
            "perf, favourable: best cell of any (stacked changes, other batch sizes) vs the baseline, interval above 1",
            key_ratio("perf", "pairs"),
        ),
        ("miniTorch fast backend vs torch eager, GPT step (target within 4×: ≥ 0.25×)", torch_ratio("gpt_fast", True)),
        ("MCQ fine-tuned, best test MAP@3 (chance 0.367)", key_number("mcq_finetune")),
        ("our GPT vs HF (the models the record ran): worst fp64 gradient error", key_number("gpt_parity")),
        ("sharding: worst parity error ÷ tolerance", key_number("sharding")),
        (
            "scale (simulated H100s): worst predicted ÷ published tokens/s per GPU (Mixtral's 'published': "
            "derived from Megatron's 468 TFLOPS on another plan)",
            key_number("scale"),
        ),
        ("inference: KV-cache decode × uncached at the longest context, interleaved", KV_CACHE),
    ]
    note = (
        f"\n\n{MISSING}: not in the record (a hand-written record keeps only its headline table). Each "
        f"timed ratio names the interleaved pairs it rests on (the lab's floor: {FLOOR}); records written "
        f'before the counts were kept say "{NO_PAIRS}". '
        "Host kinds are told apart by the CPU flags a record states; records older than the flags capture say "
        '"CPU flags not recorded", so hosts with the same model string may share a column.'
    )
    return grid(records, link, rows, "Headline") + note


def runs(records: list[Record], link: Link) -> str:
    """Every record, newest first: its host kind, wall time and jobs."""
    body = [
        [
            link(r),
            r.host_kind + (f" ({r.other_config}: cited, never published)" if r.other_config else ""),
            r.wall,
            r.jobs,
        ]
        for r in sorted(records, key=Record.sort_key, reverse=True)
    ]
    return md_table(["record", "host kind", "wall", "jobs"], body)


def word2vec(records: list[Record], link: Link) -> str:
    """docs/word2vec.md: each torch cell's words/s vs gensim, side by side, and analogy accuracy."""
    cells, w2v = ("sgd_perpair", "sgd", "sparseadam", "adagrad"), partial(joined, "word2vec")
    rows: list[Row] = [(f"{c}: × gensim words/s, 95 % interval", vs_gensim(c)) for c in cells]
    rows.append(("sgd: Inductor compile s (not in its words/s)", w2v("sgd", "compile s (not in words/s)")))
    acc = "analogy acc, common questions"
    rows += [(f"{c}: analogy accuracy, common questions", w2v(c, acc)) for c in ("gensim", *cells[:2])]
    return grid(records, link, rows, "word2vec")


def minitorch(records: list[Record], link: Link) -> str:
    """docs/minitorch.md: parity, the fast backend vs torch eager and the reference, per host kind."""
    errors, mt = ("GPT logits err", "GPT grad err", "loss trajectory err"), partial(joined, "minitorch")
    rows: list[Row] = [
        ("ops_fast: worst op error vs torch (fp64)", mt("ops_fast", "op parity (max err)")),
        ("gpt_fast: logits / gradient / loss-trajectory error vs torch (fp64)", mt("gpt_fast", *errors)),
        ("gpt_fast tokens/s / torch eager tokens/s", mt("gpt_fast", "tokens/s", "torch eager tokens/s")),
        ("gpt_fast × torch eager, 95 % interval (target within 4×: ≥ 0.25×)", torch_ratio("gpt_fast", True)),
        ("gpt_fast × the reference backend, 95 % interval (target ≥ 20×)", vs_reference),
        ("gpt_reference × torch eager (the definition, not a speed)", torch_ratio("gpt_reference")),
        ("ops_fast matmul GFLOP/s / torch's", mt("ops_fast", "matmul GFLOP/s", "torch matmul GFLOP/s")),
        ("ops_fast matmul × torch, 95 % interval", with_interval("minitorch", "ops_fast", *MATMUL)),
        ("classifier_fast accuracy / majority class", mt("classifier_fast", "accuracy", "majority")),
    ]
    return grid(records, link, rows, "minitorch") + gpt_fast_span(records)


def gpt_fast_span(records: list[Record]) -> str:
    """gpt_fast × torch eager over every record with the cell: the lowest and highest, how many
    records met, missed or left undecided the target by their 95 % interval (target_verdict; a record
    without an interval is not judged, and says so), and the pairs each rests on."""
    every = []
    for r in records:
        mid, low, high = torch_columns(r, "gpt_fast")
        if mid:
            verdict = interval_verdict(float(low), float(high)) if low and high else "not judged (no interval)"
            pairs = pairs_text(r.value("minitorch", "gpt_fast", ("× torch pairs",)))
            every.append((r, float(mid), verdict, pairs))
    if not every:
        return ""
    lo, hi = min(e[1] for e in every), max(e[1] for e in every)
    verdicts = ", ".join(f"{v} in {n}" for v, n in sorted(Counter(e[2] for e in every).items()))
    pairs = ", ".join(f"{p} ({n})" for p, n in sorted(Counter(e[3] for e in every).items()))
    commits = ", ".join(e[0].short for e in every)
    return (
        f"\n\ngpt_fast × torch eager over all {len(every)} records with the cell: {lo:g}–{hi:g}× "
        f"(target ≥ {TORCH_TARGET:g}×, judged by each record's 95 % interval: {verdicts}; "
        f"pairs per record: {pairs}; {commits})."
    )


def inference(records: list[Record], link: Link) -> str:
    """docs/inference.md: parity, what the cache and multi-query buy (measured), the partitioning
    model against the paper's two points (predicted)."""
    inf = partial(joined, "inference")
    rows: list[Row] = [
        ("parity: greedy = HF / sampled = HF / cached = uncached (1 = equal)", inf("parity", *PARITY)),
        ("parity: last step's logits, worst error vs HF (fp64)", inf("parity", "logits err vs HF")),
        ("kv_cache: longest context (tokens)", inf("kv_cache", "context")),
        (
            "kv_cache: cached × uncached decode tokens/s there, interleaved, 95 % interval",
            with_interval("inference", "kv_cache", *KV_SPEEDUP),
        ),
        ("kv_cache: cache bytes = formula (1 = exactly)", inf("kv_cache", "cache bytes = formula")),
        (
            "attention: MQA cache bytes ÷ MHA's (measured) / max batch × MHA's (computed from them)",
            inf("attention", *MQA_MEMORY),
        ),
        (
            "attention: MQA decode tokens/s × MHA's at the longest context, 95 % interval",
            with_interval("inference", "attention", *MQA_DECODE),
        ),
        (
            "batching (medians of separate timings, no pairs): decode tokens/s at batch 1 / best; throughput gain",
            inf("batching", *BATCHING),
        ),
        (
            "vs_hf: ours × HF decode tokens/s (each library's generate), 95 % interval",
            with_interval("inference", "vs_hf", *VS_HF),
        ),
        ("partition (predicted): PaLM 540B decode ms/token ÷ the paper's 29 ms", inf("partition", PALM[0])),
        ("partition (predicted): prefill MFU ÷ the paper's 76 %", inf("partition", PALM[1])),
    ]
    return grid(records, link, rows, "inference")


def pope(records: list[Record], link: Link) -> str:
    """docs/inference.md: Pope et al.'s relative results, computed by the partitioning model (no record
    holds them: the model is deterministic, so the block is generated from it and checked like the rest)."""
    from steps.inference.pope import markdown

    return markdown()


PARITY = ("greedy = HF", "sampled = HF", "cached = uncached")
KV_SPEEDUP = ("cache speed-up", "speed-up low", "speed-up high", "speed-up pairs")
MQA_DECODE = ("MQA decode × MHA", "× MHA low", "× MHA high", "× MHA pairs")
VS_HF = ("ours × HF", "× HF low", "× HF high", "× HF pairs")
MATMUL = ("matmul × torch", "matmul × torch low", "matmul × torch high", "matmul × torch pairs")
MQA_MEMORY = ("MQA cache ÷ MHA", "MQA max batch × MHA")
BATCHING = ("tokens/s B1", "tokens/s best", "throughput gain")
PALM = ("predicted ÷ published decode", "predicted ÷ published MFU")

BLOCKS: dict[str, Callable[[list[Record], Link], str]] = {
    "headline": headline,
    "runs": runs,
    "word2vec": word2vec,
    "minitorch": minitorch,
    "inference": inference,
    "pope": pope,
}
