"""Every published number comes from a dated record: README.md's and the write-ups' record blocks are
what `python -m steps.record --publish` makes of docs/results/ (steps/record/publish.py), and every
number in a results section outside a block occurs in a record that section cites."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from steps.paired import MIN_PAIRS
from steps.record.blocks import BLOCKS, FLOOR, gpt_fast_span, target_verdict, torch_columns, vs_reference
from steps.record.publish import (
    QUOTED,
    PublishError,
    pages,
    prose_pages,
    publish,
    render_page,
    results_sections,
    unbacked,
    unbacked_prose,
)
from steps.record.read import NOT_RECORDED, Record, host_kind, latest_per_host_kind, read_record, read_records
from steps.record.write import main
from steps.tracking.provenance import cpu_flags

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results"
XEON = "2026-11-26-intel-xeon-processor-2c-3d657a3.md"  # wall 23.0 min in its run line
# the blocks the lab publishes: a page that loses one would pass the equality test vacuously
EXPECTED_BLOCKS = {
    "README.md": ["headline", "runs"],
    "docs/minitorch.md": ["minitorch"],
    "docs/inference.md": ["inference"],
    "docs/word2vec.md": ["word2vec"],
    "docs/results/README.md": ["runs"],
}


def test_every_block_is_what_the_records_give():
    records = read_records(RECORDS)
    stale = [str(p.relative_to(ROOT)) for p in pages(ROOT) if render_page(p, records) != p.read_text()]
    assert stale == [], f"{stale}: blocks differ from docs/results; run `python -m steps.record --publish`"
    for page, names in EXPECTED_BLOCKS.items():
        text = (ROOT / page).read_text()
        assert all(f"<!-- record:{n} -->" in text for n in names), (page, names)


def test_results_sections_hold_only_numbers_a_cited_record_holds():
    found = [line for p in pages(ROOT) for line in unbacked(p, ROOT)]
    assert found == []
    sections = {p.name: results_sections(p.read_text()) for p in (ROOT / "README.md", ROOT / "docs" / "minitorch.md")}
    assert all(sections.values()), "the results sections this test guards are gone: update RESULTS"


# Measurement-shaped prose numbers outside results sections that no cited record holds yet, as
# "page: number": the open list the prose guard starts from (issue 48, item 6). It only shrinks: a
# number backed or removed must leave it (the test fails on a stale entry), a new one fails the test.
UNBACKED_PROSE = ROOT / "tests" / "unbacked_prose.txt"


def prose_findings(root: Path) -> set[str]:
    return {
        f"{p.relative_to(root)}: {f.rsplit(': ', 1)[1].split(' ')[0]}"
        for p in prose_pages(root)
        for f in unbacked_prose(p, root)
    }


def test_prose_numbers_outside_results_sections_are_backed_or_listed_open():
    found, listed = prose_findings(ROOT), set(UNBACKED_PROSE.read_text().splitlines()) - {""}
    assert found - listed == set(), "new unbacked numbers: cite the record that holds each, or mark a quote"
    assert listed - found == set(), f"backed or gone now: remove them from {UNBACKED_PROSE.name}"
    # the numbers the issue named are backed now
    assert not {"docs/sharding.md: 1.2e-7", "docs/gpt.md: 2.4e-7", "docs/gpt.md: 9.5e-7"} & found


def test_a_measured_prose_number_anywhere_needs_a_record(repo):
    page = repo / "docs" / "page.md"
    page.write_text(
        "# p\n\n## Design\n\nA 15 s timeout, a 4× target, tol 1e-7, 24 GiB hosts, 16 bytes/param, 6·N + 12·L·d·T.\n"
        "The job took 17.9 s and its error was 3.5e-9; 0.37× eager; 5,123 tokens/s; 2.4 % faster.\n"
        f"BERT-large: 0.93 F1 in its paper {QUOTED}\n"
    )
    found = {f.rsplit(": ", 1)[1].split(" ")[0] for f in unbacked_prose(page, repo)}
    assert found == {"17.9", "3.5e-9", "0.37", "5,123", "2.4"}, found
    page.write_text(
        f"# p\n\n## Speed\n\n[{XEON}](results/{XEON}) ran 23.0 min; 24.5 min elsewhere.\n\n## Other\n\n16.6 min.\n"
    )
    assert [f.split(": ", 2)[1:] for f in unbacked_prose(page, repo)] == [
        ["## Speed", "24.5 is in no record the section or page cites"],
        ["## Other", "16.6 is in no record the section or page cites"],
    ]


def test_configs_readme_names_the_slowest_host_kind_the_records_show():
    timed = [(r.value("perf", "baseline", ("tokens/s",)), r) for r in read_records(RECORDS) if not r.other_config]
    slowest = min(((float(t), r) for t, r in timed if t), key=lambda t: t[0])
    assert slowest[1].host_kind.endswith("CPU flags avx2")  # the AVX2-only EPYC
    text = " ".join((ROOT / "configs" / "README.md").read_text().split())
    claim = text[text.index("the slowest host type seen") :][:200]
    assert "AVX2-only" in claim and "is slower" in claim and f"{slowest[0]:,.0f}" in claim, claim


def test_docs_say_what_sharding_does_with_swiglus_gate():
    from steps.sharding.native import parallelize

    assert 'plan["mlp.c_fc2"] = ColwiseParallel()' in Path(parallelize.__file__).read_text()
    gpt = " ".join((ROOT / "docs" / "gpt.md").read_text().split())
    assert "does not yet do that" not in gpt and "`mlp.c_fc2` is sharded like `mlp.c_fc`" in gpt


def test_tracking_md_states_the_lost_server_bound_the_fault_test_allows():
    from tests.test_faults_tracking import LOST_SERVER_S

    tracking = " ".join((ROOT / "docs" / "tracking.md").read_text().split())
    assert "within a minute" not in tracking and f"allows {LOST_SERVER_S} s" in tracking and "hangs" in tracking


def test_the_seed_corrections_hold_on_our_model():
    """docs/scale.md corrects seed 001: a GPT-2 layer holds 12·d² weights, not 9·d² (checked on our
    model: its 2-D weights per block); BERT-large has 24 layers, not 12."""
    from steps.models.gpt import GPTConfig, GPTLMHeadModel

    d = 32
    block = GPTLMHeadModel(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=4, n_embd=d)).transformer.h[0]
    assert sum(p.numel() for p in block.parameters() if p.dim() == 2) == 12 * d * d
    note = " ".join((ROOT / "docs" / "scale.md").read_text().split())
    note = note[note.index("**Seed corrections**") :][:500]
    assert "12·d² weights" in note and "not the seed's 9·d²" in note and "BERT-large has 24 layers" in note


def test_headlines_lead_with_the_fair_comparison_and_name_their_record():
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- record:headline -->", 1)[1].split("<!-- /record:headline -->", 1)[0]
    # every stage with a favourable row shows its fair one first (one change, same sampling or batch)
    assert block.index("word2vec per pair") < block.index("word2vec shared negatives")
    assert block.index("perf, fair: best single change") < block.index("perf, favourable")
    fair = next(line for line in block.splitlines() if line.startswith("| perf, fair"))
    assert "stacked" not in fair and "batch16" not in fair and "(amp_bf16, 20 pairs)" in fair
    shown = latest_per_host_kind(read_records(RECORDS), lambda r: "Headline" in r.tables)
    assert shown and all(f"]({Path('docs/results') / r.name})" in block for r in shown)
    # each record's gpt_fast target verdict is its own 95 % interval's, whichever way it went
    intervals = [torch_columns(r, "gpt_fast") for r in shown]
    expected = {target_verdict(float(lo), float(hi)) for _, lo, hi in intervals if lo and hi}
    assert expected, "no shown record has gpt_fast's interval: the verdict row is untested"
    for verdict in ("met", "missed", "not decided (the interval spans the target)"):
        assert (f"target {verdict}" in block) == (verdict in expected), verdict


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository root holding a copy of the records, for pages the tests write."""
    shutil.copytree(RECORDS, tmp_path / "docs" / "results")
    return tmp_path


def test_a_drifted_block_is_found_and_regenerated(repo):
    page = repo / "docs" / "page.md"
    page.write_text(f"# p\n\n<!-- record:runs -->\n| [{XEON}](results/{XEON}) | 23.1 min |\n<!-- /record:runs -->\n")
    assert publish(repo, check=True) == [page] and "23.1 min" in page.read_text()  # --check writes nothing
    with pytest.raises(SystemExit, match="blocks differ from the records"):
        main(["--publish", "--check", "--root", str(repo)])
    assert publish(repo) == [page]
    row = next(ln for ln in page.read_text().splitlines() if XEON in ln)
    assert "23.0 min" in row and "23.1" not in page.read_text()
    assert publish(repo, check=True) == []


def test_an_unbacked_number_in_a_results_section_is_found(repo):
    page = repo / "docs" / "page.md"
    page.write_text(
        f"# p\n\n## Measured\n\nFrom [{XEON}](results/{XEON}): 23.0 min and 0.37× torch eager.\n\n"
        "## Notes\n\n0.37 outside a results section is not checked.\n"
    )
    found = unbacked(page, repo)
    assert len(found) == 1 and ": 0.37 is in no record" in found[0] and XEON in found[0]
    page.write_text("## Results\n\n16.6 min on a quiet host.\n")  # no record cited: nothing backs it
    assert [f.split(": ")[-1] for f in unbacked(page, repo)] == ["16.6 is in no record the section cites (none)"]


def test_a_page_with_an_unknown_or_unclosed_block_stops_with_its_name(repo):
    page = repo / "README.md"
    page.write_text("<!-- record:nonesuch -->\n<!-- /record:nonesuch -->\n")
    with pytest.raises(PublishError, match=r"README\.md: unknown block\(s\) nonesuch; known: headline"):
        publish(repo)
    page.write_text("<!-- record:runs -->\nno end\n")
    with pytest.raises(PublishError, match=r"block runs has no `<!-- /record:runs -->` line"):
        publish(repo)


def test_host_kind_is_what_the_record_itself_says(repo):
    flags = "amx_bf16 amx_tile avx512_bf16 avx2 (those of ... in /proc/cpuinfo: they tell host kinds apart)"
    xeon = "Intel(R) Xeon(R) Processor, 2 cores, 23.5 GiB"
    assert host_kind(xeon, flags) == "Intel(R) Xeon(R) Processor, 2 cores; CPU flags amx_bf16 amx_tile avx512_bf16 avx2"
    assert host_kind(xeon, "") == f"Intel(R) Xeon(R) Processor, 2 cores; {NOT_RECORDED}"
    assert host_kind(xeon, "not recorded by the run (those of ...)").endswith(NOT_RECORDED)
    stated = host_kind("AMD EPYC (AVX512-BF16), 2 cores, 24 GiB", "")
    assert stated == "AMD EPYC, 2 cores; CPU flags avx512_bf16 (as the record states)"
    assert read_record(RECORDS / "2026-11-23-amd-epyc-2c-89fc4db.md").host_kind == stated
    # two records of one model string with different flags are two host kinds, each with its latest
    before = len(latest_per_host_kind(read_records(repo / "docs" / "results")))
    text = (RECORDS / XEON).read_text().replace("2026-11-26", "2027-11-27")  # a newer run, with flags
    text = text.replace("- **commit**:", f"- **CPU flags**: {flags}\n- **commit**:", 1)
    (repo / "docs" / "results" / "2027-11-27-intel-xeon-processor-2c-aaaaaaa.md").write_text(text)
    kinds = [r.host_kind for r in latest_per_host_kind(read_records(repo / "docs" / "results"))]
    assert len(kinds) == len(set(kinds)) == before + 1 and kinds[0].endswith("amx_bf16 amx_tile avx512_bf16 avx2")


def test_a_renamed_column_is_read_under_either_name():
    record = read_record(RECORDS / XEON)
    assert record.value("scale", "titan_8b_fsdp8", ("predicted MFU", "MFU")) == "0.3387"
    assert record.value("scale", "titan_8b_fsdp8", ("no such column",)) == ""


def test_target_verdict_needs_the_whole_interval():
    assert target_verdict(0.13, 0.16) == "missed"
    assert target_verdict(0.26, 0.40) == "met"
    assert target_verdict(0.20, 0.30).startswith("not decided")


def test_cpu_flags_come_from_cpuinfo():
    info = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
    assert cpu_flags(info) == "amx_bf16 amx_tile avx512_bf16 avx512f avx2"
    assert cpu_flags("flags\t: fpu sse\n").startswith("none of amx_bf16")
    assert cpu_flags("processor\t: 0\n").startswith("unknown")


def test_a_gpu_campaign_record_is_its_own_host_kind(repo):
    text = (
        "# Results record: 2026-11-28, NVIDIA H100 80GB HBM3, commit abcdef1234\n\n"
        "- **device**: NVIDIA H100 80GB HBM3 (79.2 GiB, compute capability 9.0)\n"
        "- **started**: 2026-11-28T10:00:00Z; wall 500 s of a 540 s budget\n"
    )
    (repo / "docs" / "results" / "2026-11-28-h100-80gb-hbm3-abcdef1234.md").write_text(text)
    record = next(r for r in read_records(repo / "docs" / "results") if "h100-80gb" in str(r.path))
    assert record.host_kind == "NVIDIA H100 80GB HBM3 (GPU campaign)"
    assert record.started == "2026-11-28T10:00:00Z"
    index = repo / "docs" / "results" / "README.md"  # the copy's index lists every record
    assert publish(repo) == [index]
    assert "| [2026-11-28-h100-80gb-hbm3-abcdef1234.md](2026-11-28-h100-80gb-hbm3-abcdef1234.md) | NVIDIA H100" in (
        index.read_text()
    )


def test_the_span_over_records_judges_each_by_its_interval(repo):
    """A record whose point estimate passes the target but whose interval spans it is "not decided",
    never "reached"; one whose whole interval passes it is "met"."""
    records = repo / "docs" / "results"
    spans = next(records.glob("*-582c0ad.md"))  # gpt_fast 0.2611x [0.2187, 0.3116]: spans 0.25
    missed = next(records.glob("*-7a016ad.md"))  # gpt_fast 0.1498x [0.138, 0.1626]: all below 0.25
    for other in set(records.glob("*.md")) - {spans, missed, records / "README.md"}:
        other.unlink()  # later records may meet the target: judge these two alone
    before = gpt_fast_span(read_records(records))
    assert "missed in 1, not decided in 1" in before and "met in" not in before and "reached" not in before
    text = spans.read_text().replace("| 0.2611 | 0.2187 | 0.3116 |", "| 0.3 | 0.27 | 0.33 |")
    text = text.replace("2026-11-27", "2027-11-28").replace("582c0ad", "bbbbbbb")
    (records / "2027-11-28-amd-epyc-2c-bbbbbbb.md").write_text(text)
    after = gpt_fast_span(read_records(records))
    assert "met in 1" in after and "0.3×" in after and after.count("bbbbbbb") == 1


def a_record(**tables: list[dict[str, str]]) -> Record:
    """A record of one host kind holding `tables` (section -> rows of {column: text}), as read back."""
    name = "2027-01-01-test-host-2c-ccccccc.md"
    return Record(
        Path(name), "2027-01-01", "ccccccc", "Test host, 2 cores", "Test host, 2 cores; CPU flags avx2", tables=tables
    )


def row_of(block: str, label: str) -> list[str]:
    """The value cells of the block's table row labelled `label` (one per host kind)."""
    line = next(ln for ln in block.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split(" | ")][1:]


def test_the_reference_target_is_judged_by_its_interval():
    """gpt_fast × the reference backend against its ≥ 20× target: met only when the whole 95 %
    interval reaches it, missed when it all falls short; a record that keeps no interval says so and
    claims nothing (a point estimate of a few pairs is no verdict)."""

    def judged(**columns: str) -> str:
        gpt_fast = {"cell": "gpt_fast", "× reference": "33.79", **columns}
        return vs_reference(a_record(minitorch=[gpt_fast]))

    interval = {"× reference low": "25.1", "× reference high": "45.2", "× reference pairs": "20"}
    assert judged(**interval) == "33.79× [25.1, 45.2] (20 pairs): target met"
    spans = judged(**{**interval, "× reference low": "15", "× reference pairs": "2"})
    assert (
        spans
        == "33.79× [15, 45.2] (2 pairs, below the floor of 20): target not decided (the interval spans the target)"
    )
    assert judged(**{**interval, "× reference low": "12", "× reference high": "19.5"}).endswith(": target missed")
    alone = judged()
    assert alone == "33.79× (pair count not recorded): target not judged (the record keeps no interval)"
    # the published block says the same of each record it shows
    block = BLOCKS["minitorch"](read_records(RECORDS), lambda r: r.name)
    shown = latest_per_host_kind(read_records(RECORDS), lambda r: "minitorch" in r.tables)
    cells = row_of(block, "gpt_fast × the reference backend, 95 % interval (target ≥ 20×)")
    for r, cell in zip(shown, cells, strict=True):
        kept = r.value("minitorch", "gpt_fast", ("× reference low",))
        assert ("target met" in cell) <= bool(kept) and ("not judged" in cell) == (not kept and cell != "n/a"), cell


# the published rows that are timed ratios (interleaved pairs): each must say its pair count
RATIO_ROWS = {
    "headline": [
        "word2vec per pair (word2vec.c's sampling, as gensim) vs gensim, "
        "words/s, 1 thread each, interleaved, 95 % interval",
        "word2vec shared negatives (one draw per window: fewer samples than gensim)",
        "perf, favourable: best cell of any (stacked changes, other batch sizes) vs the baseline, interval above 1",
        "miniTorch fast backend vs torch eager, GPT step (target within 4×: ≥ 0.25×)",
        "inference: KV-cache decode × uncached at the longest context, interleaved",
        "perf, fair: best single change at the baseline's batch vs the fp32 eager baseline, 95 % interval",
    ],
    "minitorch": [
        "gpt_fast × torch eager, 95 % interval (target within 4×: ≥ 0.25×)",
        "gpt_fast × the reference backend, 95 % interval (target ≥ 20×)",
        "gpt_reference × torch eager (the definition, not a speed)",
        "ops_fast matmul × torch, 95 % interval",
    ],
    "inference": [
        "kv_cache: cached × uncached decode tokens/s there, interleaved, 95 % interval",
        "attention: MQA decode tokens/s × MHA's at the longest context, 95 % interval",
        "vs_hf: ours × HF decode tokens/s (each library's generate), 95 % interval",
    ],
    "word2vec": [f"{c}: × gensim words/s, 95 % interval" for c in ("sgd_perpair", "sgd", "sparseadam", "adagrad")],
}
PAIRS = re.compile(r"\b(\d+) pairs\b")


def pair_count_stated(cell: str) -> bool:
    """A ratio's cell names its pairs ("20 pairs", "10 pairs, below the floor of 20") or says the
    record has no count; n/a where the record has no such ratio."""
    if cell == "n/a":
        return True
    counts = [int(n) for n in PAIRS.findall(cell)]
    if not counts:
        return "pair count not recorded" in cell
    return all(n >= FLOOR or f"{n} pairs, below the floor of {FLOOR}" in cell for n in counts)


def test_every_published_ratio_states_its_pair_count():
    """Every published timed ratio meets the lab's floor of 20 pairs (steps/paired.py MIN_PAIRS) or
    says its count and "below the floor"; a record without the count says so."""
    assert FLOOR == MIN_PAIRS
    kv = {"cell": "kv_cache", "cache speed-up": "10.68", "speed-up low": "8.726", "speed-up high": "13.07"}
    gpt = {"cell": "gpt_fast", "× torch eager": "0.282", "× torch low": "0.2576", "× torch high": "0.3087"}
    best = "best speedup over the fp32 eager baseline (interleaved, 95 % interval): 1.907 [1.825, 1.992] (stacked_bf16)"
    head = [
        {"stage": "perf", "key number": best},
        {"stage": "inference", "key number": "KV-cache decode speed-up: 10.68 [8.726, 13.07] (kv_cache)"},
    ]
    w2v = {"cell": "sgd", "× gensim 95 % interval": "1.86x [1.75, 1.97] (12 pairs, faster): ours vs gensim"}
    record = a_record(
        Headline=head,
        inference=[{**kv, "speed-up pairs": "10"}],
        minitorch=[{**gpt, "× torch pairs": "20"}],
        perf=[
            {"cell": "stacked_bf16", "status": "ok", "Change": "amp=bf16, compile=True, batch_size=16", "pairs": "20"},
            {"cell": "batch16", "status": "ok", "Change": "batch_size=16", "pairs": "20"},
            {"cell": "tf32", "status": "ok", "Change": "tf32=True", "pairs": "20"},
            {"cell": "amp_bf16", "status": "ok", "Change": "amp=bf16", "pairs": "12"},
        ],
        word2vec=[w2v],
    )
    for row, (ratio, low, high) in zip(
        record.tables["perf"], [(1.9, 1.8, 2.0), (1.7, 1.6, 1.8), (1.0, 0.9, 1.1), (1.2, 1.1, 1.3)]
    ):
        row.update({"× baseline": str(ratio), "low": str(low), "high": str(high)})
    block = BLOCKS["headline"]([record], lambda r: r.name)
    assert row_of(block, RATIO_ROWS["headline"][4]) == [
        "10.68 [8.726, 13.07] (kv_cache, 10 pairs, below the floor of 20)"
    ]
    assert row_of(block, RATIO_ROWS["headline"][3]) == ["0.282× [0.2576, 0.3087] (20 pairs): target met"]
    assert row_of(block, RATIO_ROWS["headline"][2]) == ["1.907 [1.825, 1.992] (stacked_bf16, 20 pairs)"]
    assert row_of(block, RATIO_ROWS["headline"][1]) == ["1.86x [1.75, 1.97] (12 pairs, below the floor of 20, faster)"]
    # the fair row: one change at the baseline's batch (not stacked_bf16, not batch16), with its pairs
    assert row_of(block, RATIO_ROWS["headline"][5]) == ["1.2 [1.1, 1.3] (amp_bf16, 12 pairs, below the floor of 20)"]
    older = a_record(Headline=head, inference=[kv], minitorch=[gpt])  # written before the counts were kept
    block = BLOCKS["headline"]([older], lambda r: r.name)
    assert row_of(block, RATIO_ROWS["headline"][4]) == ["10.68 [8.726, 13.07] (kv_cache, pair count not recorded)"]
    assert row_of(block, RATIO_ROWS["headline"][3]) == ["0.282× [0.2576, 0.3087] (pair count not recorded): target met"]
    # and every block as published from the records
    records = read_records(RECORDS)
    for name, labels in RATIO_ROWS.items():
        block = BLOCKS[name](records, lambda r: r.name)
        for label in labels:
            cells = row_of(block, label)
            assert all(pair_count_stated(c) for c in cells), (name, label, cells)
    span = gpt_fast_span(records).split("pairs per record: ", 1)[1]
    assert pair_count_stated(span.split(";")[0])
    tens = gpt_fast_span([a_record(minitorch=[{**gpt, "× torch pairs": "10"}])])
    assert "pairs per record: 10 pairs, below the floor of 20 (1);" in tens


def test_a_smoke_record_is_cited_but_never_stands_for_its_host_kind(tmp_path):
    """A record of the smoke config (toy sizes: the record of cells kept in configs/full.yaml) is newer
    than the default DAG's record of the same host kind: the published blocks keep the default's."""
    records = read_records(RECORDS)
    smoke = [r for r in records if "configs/smoke.yaml" in r.other_config]
    assert smoke, "docs/results/ holds a smoke record (the MoE x dp_fsdp_tp and ZeRO cells)"
    shown = latest_per_host_kind(records)
    assert not any(r.other_config for r in shown)
    same_kind = [r for r in records if r.host_kind == smoke[-1].host_kind and not r.other_config]
    assert same_kind and same_kind[-1] in shown


@pytest.mark.parametrize(
    "command, other",
    [
        ("snakemake --cores 2", ""),
        ("snakemake --cores 2 --configfile configs/full.yaml", "configs/full.yaml"),
        ("snakemake --cores 2 --configfile=configs/smoke.yaml --config seed=7", "configs/smoke.yaml"),
        (
            "snakemake -s /w/workflow/Snakefile --configfile /w/configs/smoke.yaml /tmp/x.yaml",
            "configs/smoke.yaml + x.yaml",
        ),
    ],
)
def test_a_record_of_another_config_is_never_its_host_kind_s_default(command, other):
    """configs/full.yaml's record (its wall is another DAG's) is cited, like the smoke config's, never
    shown as the host kind's default DAG."""
    from steps.record.read import Record

    rec = Record(path=Path("r.md"), date="2026-12-07", commit="abc", machine="m", host_kind="k", command=command)
    assert rec.other_config == other
    assert (latest_per_host_kind([rec]) == []) == bool(other)
