"""prepare_corpus's streaming path (`streaming: true`: a datasets.IterableDataset consumed with
iter/next) against its map-style path: the same documents, so the same split and the same tokens;
and the stream is lazy (cut by max_documents, it reads no further)."""

from __future__ import annotations

import gzip

import datasets
import numpy as np
import pytest

from steps.data import text
from steps.data.config import PrepareCorpusConfig
from steps.prepare_corpus import map_style_documents, split_documents, streamed_documents
from tests.conftest import stage_params, tiny_texts


def _config(**over) -> PrepareCorpusConfig:
    return PrepareCorpusConfig.of(stage_params("prepare_corpus", **over))


def _tokens(docs: list[dict]) -> dict[str, np.ndarray]:
    """Both splits as gpt_train tokenizes them, with a BPE trained on this corpus's train split."""
    from steps.gpt_train import tokenize_split
    from steps.train_tokenizer import train_bpe

    splits = split_documents(docs, 0.2, seed=7)
    tok = train_bpe([d["text"] for d in splits["train"]], 300, 2)
    return {k: tokenize_split(tok, [d["text"] for d in v], None) for k, v in splits.items()}


def _same_tokens(p: PrepareCorpusConfig) -> list[dict]:
    mapped, streamed = map_style_documents(p), streamed_documents(p)
    assert streamed == mapped and len(mapped) > 2
    a, b = _tokens(mapped), _tokens(streamed)
    assert all(np.array_equal(a[k], b[k]) for k in ("train", "validation"))
    return streamed


def test_streaming_yields_the_map_style_tokens_builtin():
    docs = _same_tokens(_config(max_documents=12, min_chars=400))
    assert all(len(d["text"]) >= 400 for d in docs) and len(docs) == 12


def test_streaming_yields_the_map_style_tokens_local_files(tmp_path):
    texts = tiny_texts(6, 3)
    for i, t in enumerate(texts[:3]):
        (tmp_path / f"doc{i}.txt").write_text(t)
    (tmp_path / "doc3.txt.gz").write_bytes(gzip.compress(texts[3].encode()))
    (tmp_path / "doc4.md").write_text(f"# Title\n\n**HAMLET**\n{texts[4]}\n")
    (tmp_path / "short.txt").write_text("too short")
    docs = _same_tokens(_config(source=str(tmp_path / "*"), min_chars=20))
    assert len(docs) == 5 and "HAMLET:" in next(d["text"] for d in docs if d["title"] == "doc4")


def test_the_stream_is_an_iterable_dataset_and_lazy(monkeypatch):
    """Cut at 3 documents, the stream asks the source for no more than it keeps (+ the one the
    iterator may hold ready); the map-style path's islice is lazy too, so both read a handful."""
    pulled = []
    original = text.load_documents

    def counting(*a, **k):
        for d in original(*a, **k):
            pulled.append(d["title"])
            yield d

    monkeypatch.setattr(text, "load_documents", counting)
    p = _config(max_documents=3)
    assert isinstance(text.document_stream(p.source), datasets.IterableDataset)
    assert len(streamed_documents(p)) == 3 and len(pulled) <= 4


def test_streaming_bad_builtin_is_one_line():
    from steps.core import InputError

    with pytest.raises(InputError, match="unknown builtin corpus 'builtin:nope'"):
        text.document_stream("builtin:nope")


def test_the_stage_writes_the_same_splits_either_way(tmp_path):
    """`python -m steps.prepare_corpus` as its rule runs it, map-style and streaming: equal files."""
    from tests.test_faults_input import job

    got = {}
    for streaming in (False, True):
        params = stage_params("prepare_corpus", max_documents=20, streaming=streaming)
        work = tmp_path / ("streaming" if streaming else "map_style")
        work.mkdir()
        proc = job(work, "prepare_corpus", params)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        got[streaming] = datasets.load_from_disk(str(work / "out" / "data"))
    for split in ("train", "validation"):
        assert got[True][split].to_list() == got[False][split].to_list() and len(got[True][split]) > 0
