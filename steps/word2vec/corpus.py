"""The corpus a word2vec cell trains on: the split's documents through the shared tokenizer
(cut to max_words if set), and its vocabulary and ids, read and encoded once per job."""

from __future__ import annotations

import time
from dataclasses import dataclass

from datasets import load_from_disk

from steps.core import InputError, StageRun
from steps.word2vec.config import Word2VecConfig
from steps.word2vec.text import sentences
from steps.word2vec.train import TrainConfig
from steps.word2vec.vocab import Vocab


def load_sentences(p: Word2VecConfig, path: str) -> tuple[list[list[str]], int]:
    """Tokenised documents of the corpus split at `path` (the rule's corpus input; shared
    tokenizer), cut to max_words if set."""
    try:
        ds = load_from_disk(path)
    except FileNotFoundError as exc:
        raise InputError(
            f"{path}: no dataset saved there ({exc}); fix: run the prepare_corpus rule first or set word2vec.corpus"
        ) from None
    if p.split not in ds or "text" not in ds[p.split].column_names:
        raise InputError(
            f"{path}: needs split {p.split!r} with a 'text' column; "
            f"found {dict(ds.column_names)}; fix: set word2vec.split"
        )
    sents = sentences(ds[p.split]["text"])
    if p.max_words:
        kept, n = [], 0
        for s in sents:
            if n >= p.max_words:
                break
            kept.append(s[: p.max_words - n])
            n += len(kept[-1])
        sents = kept
    words = sum(map(len, sents))
    if not words:
        raise InputError(f"{path}[{p.split}]: no words after tokenising; fix: check the corpus")
    return sents, words


@dataclass
class Corpus:
    """The tokens every seed of a cell trains on, read and encoded once per job."""

    sentences: list[list[str]]
    vocab: "object"
    ids: "object"
    sid: "object"
    metrics: dict


def vocabulary(sents: list[list[str]], min_count: int, path: str) -> Vocab:
    """Vocab.build, whose "corpus too small" (no word min_count times) stops the job in one line
    naming the corpus, the numbers and the knobs to change, not as a bare ValueError."""
    words = sum(len(s) for s in sents)
    try:
        return Vocab.build(sents, min_count)
    except ValueError as exc:
        raise InputError(
            f"{path}: {words} words, {exc}; lower word2vec.min_count, raise word2vec.max_words if it cuts the "
            "corpus, or give prepare_corpus more text (prepare_corpus.source, max_documents)"
        ) from None


def encode_corpus(ctx: StageRun, p: Word2VecConfig) -> Corpus:
    """A bad config, or a CUDA cell without CUDA (SkipCell), stops before the corpus is read."""
    TrainConfig.from_params(p)
    if p.backend == "torch":
        ctx.device  # noqa: B018 - the property raises SkipCell
    sents, raw = load_sentences(p, ctx.inputs["corpus"])
    t0 = time.perf_counter()
    vocab = vocabulary(sents, p.min_count, ctx.inputs["corpus"])
    ids, sid = vocab.encode(sents)
    return Corpus(sents, vocab, ids, sid, {"corpus_words": raw, "vocab_build_s": time.perf_counter() - t0})
