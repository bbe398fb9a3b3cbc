"""The blocks `python -m steps.record --publish` writes into README.md and the write-ups: each one a
function of the dated records (steps/record_read.py) and of how the page links to a record.

Every block shows the latest record per host kind (one column each, naming its record by file name) or,
for the list of runs, every record. Values are the records' own text, copied, never reformatted, so a
reader finds each number in the record it cites. To add a block: write `def name(records, link) -> str`
and list it in BLOCKS; a column a later stage version renames (scale's `predicted_*`) is read by
listing both names in the row's column tuple, the new name first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

from steps.record_read import Record, latest_per_host_kind

Link = Callable[[Record], str]  # a record -> a Markdown link to it from the page being written
Row = tuple[str, Callable[[Record], str]]  # (row label, the record's value for it)

MISSING = "n/a"
# miniTorch's fast backend target (docs/minitorch.md): within 4x of torch eager on the GPT step
TORCH_TARGET = 0.25
REFERENCE_TARGET = 20.0  # and at least 20x its own reference backend (the definition in NumPy)


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


def vs_gensim(cell: str) -> Callable[[Record], str]:
    """`cell`'s words/s ratio to gensim with its interval, without the long how-it-was-timed tail."""
    return lambda r: r.value("word2vec", cell, ("× gensim 95 % interval",)).split(":", 1)[0]


def wall(r: Record) -> str:
    return f"{r.wall} ({r.jobs})" if r.wall else ""


def interval_verdict(low: float, high: float) -> str:
    """Met only when the whole 95 % interval reaches the target, missed when it all falls short."""
    if high < TORCH_TARGET:
        return "missed"
    return "met" if low >= TORCH_TARGET else "not decided"


def target_verdict(low: float, high: float) -> str:
    """interval_verdict, saying why where it is undecided."""
    verdict = interval_verdict(low, high)
    return f"{verdict} (the interval spans the target)" if verdict == "not decided" else verdict


def torch_columns(r: Record, cell: str) -> tuple[str, str, str]:
    """`cell`'s × torch eager ratio and its 95 % interval, as recorded ("" where a column is absent)."""
    mid, low, high = (r.value("minitorch", cell, (c,)) for c in ("× torch eager", "× torch low", "× torch high"))
    return mid, low, high


def interval_text(mid: str, low: str, high: str) -> str:
    """A recorded ratio with its interval, "1.29× [1.2, 1.4]" (no interval: "1.29×"; none: "")."""
    return f"{mid}× [{low}, {high}]" if mid and low and high else (f"{mid}×" if mid else "")


def with_interval(section: str, cell: str, mid: str, low: str, high: str) -> Callable[[Record], str]:
    """A row getter: `cell`'s `mid` column with its recorded interval (interval_text)."""
    return lambda r: interval_text(*(r.value(section, cell, (c,)) for c in (mid, low, high)))


def torch_ratio(cell: str, with_target: bool = False) -> Callable[[Record], str]:
    """`cell`'s tokens/s ÷ torch eager's with its interval (and the target's verdict), as recorded."""

    def get(r: Record) -> str:
        mid, low, high = torch_columns(r, cell)
        text = interval_text(mid, low, high)
        if with_target and text and low and high:
            text += f": target {target_verdict(float(low), float(high))}"
        return text

    return get


def vs_reference(r: Record) -> str:
    """gpt_fast's speed over the reference backend against the ≥ 20× target, on the point estimate
    (the record's table keeps no interval for it)."""
    mid = r.value("minitorch", "gpt_fast", ("× reference",))
    if not mid:
        return ""
    return f"{mid}×: target {'met' if float(mid) >= REFERENCE_TARGET else 'missed'}"


def headline(records: list[Record], link: Link) -> str:
    """README's headline: the fair comparison of each stage, the latest record per host kind."""
    interval = "words/s, 1 thread each, interleaved, 95 % interval"
    rows: list[Row] = [
        ("the default DAG, `snakemake --cores 2`: wall time (jobs)", wall),
        (f"word2vec per pair (word2vec.c's sampling, as gensim) vs gensim, {interval}", vs_gensim("sgd_perpair")),
        ("word2vec shared negatives (one draw per window: fewer samples than gensim)", vs_gensim("sgd")),
        ("perf: best cell vs the fp32 eager baseline, 95 % interval above 1", key_number("perf")),
        ("miniTorch fast backend vs torch eager, GPT step (target within 4×: ≥ 0.25×)", torch_ratio("gpt_fast", True)),
        ("MCQ fine-tuned, best test MAP@3 (chance 0.367)", key_number("mcq_finetune")),
        ("our GPT vs HF (the models the record ran): worst fp64 gradient error", key_number("gpt_parity")),
        ("sharding: worst parity error ÷ tolerance", key_number("sharding")),
        ("scale (simulated H100s): worst predicted ÷ published tokens/s per GPU", key_number("scale")),
        ("inference: KV-cache decode × uncached at the longest context, interleaved", key_number("inference")),
    ]
    note = (
        f"\n\n{MISSING}: not in the record (a hand-written record keeps only its headline table). "
        "Host kinds are told apart by the CPU flags a record states; records older than the flags capture say "
        '"CPU flags not recorded", so hosts with the same model string may share a column.'
    )
    return grid(records, link, rows, "Headline") + note


def runs(records: list[Record], link: Link) -> str:
    """Every record, newest first: its host kind, wall time and jobs."""
    body = [[link(r), r.host_kind, r.wall, r.jobs] for r in sorted(records, key=Record.sort_key, reverse=True)]
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
        ("gpt_fast × the reference backend (target ≥ 20×; the record keeps no interval)", vs_reference),
        ("gpt_reference × torch eager (the definition, not a speed)", torch_ratio("gpt_reference")),
        ("ops_fast matmul GFLOP/s / torch's", mt("ops_fast", "matmul GFLOP/s", "torch matmul GFLOP/s")),
        ("ops_fast matmul × torch", mt("ops_fast", "matmul × torch")),
        ("classifier_fast accuracy / majority class", mt("classifier_fast", "accuracy", "majority")),
    ]
    return grid(records, link, rows, "minitorch") + gpt_fast_span(records)


def gpt_fast_span(records: list[Record]) -> str:
    """gpt_fast × torch eager over every record with the cell: the lowest and highest, and how many
    records met, missed or left undecided the target by their 95 % interval (target_verdict; a record
    without an interval is judged on its point estimate, and says so)."""
    every = []
    for r in records:
        mid, low, high = torch_columns(r, "gpt_fast")
        if mid:
            point = float(mid)
            if low and high:
                verdict = interval_verdict(float(low), float(high))
            else:
                verdict = ("missed" if point < TORCH_TARGET else "met") + " (point estimate)"
            every.append((r, point, verdict))
    if not every:
        return ""
    lo, hi = min(v for _, v, _ in every), max(v for _, v, _ in every)
    counts = Counter(verdict for _, _, verdict in every)
    verdicts = ", ".join(f"{verdict} in {n}" for verdict, n in sorted(counts.items()))
    commits = ", ".join(r.short for r, _, _ in every)
    return (
        f"\n\ngpt_fast × torch eager over all {len(every)} records with the cell: {lo:g}–{hi:g}× "
        f"(target ≥ {TORCH_TARGET:g}×, judged by each record's 95 % interval: {verdicts}; {commits})."
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
            with_interval("inference", "kv_cache", "cache speed-up", "speed-up low", "speed-up high"),
        ),
        ("kv_cache: cache bytes = formula (1 = exactly)", inf("kv_cache", "cache bytes = formula")),
        ("attention: MQA cache bytes ÷ MHA's / max batch × MHA's (measured)", inf("attention", *MQA_MEMORY)),
        ("attention: MQA decode tokens/s × MHA's at the longest context", inf("attention", "MQA decode × MHA")),
        ("batching: decode tokens/s at batch 1 / best; throughput gain", inf("batching", *BATCHING)),
        ("vs_hf: ours × HF decode tokens/s (each library's generate)", inf("vs_hf", "ours × HF")),
        ("partition (predicted): PaLM 540B decode ms/token ÷ the paper's 29 ms", inf("partition", PALM[0])),
        ("partition (predicted): prefill MFU ÷ the paper's 76 %", inf("partition", PALM[1])),
    ]
    return grid(records, link, rows, "inference")


PARITY = ("greedy = HF", "sampled = HF", "cached = uncached")
MQA_MEMORY = ("MQA cache ÷ MHA", "MQA max batch × MHA")
BATCHING = ("tokens/s B1", "tokens/s best", "throughput gain")
PALM = ("predicted ÷ published decode", "predicted ÷ published MFU")

BLOCKS: dict[str, Callable[[list[Record], Link], str]] = {
    "headline": headline,
    "runs": runs,
    "word2vec": word2vec,
    "minitorch": minitorch,
    "inference": inference,
}
