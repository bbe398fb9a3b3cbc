"""The per-pair cell's benchmark setup, shared by scripts/w2v-perpair-batch, scripts/w2v-step-ab and
scripts/w2v-perpair-passes: the default config's `sgd_perpair` cell (word2vec.c's sampling) on a real
corpus; for the step's own timings, its first words planned once (subsampling, windows, negatives
drawn once), so every timed call repeats the same work."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from steps.config import CONFIG_DIR, cell_config, load_config
from steps.word2vec.config import Word2VecConfig
from steps.word2vec.corpus import Corpus, load_sentences, vocabulary
from steps.word2vec.train import TrainConfig, Trainer
from steps.word2vec.windows import plan_epoch


@dataclass
class PerPairBatches:
    cfg: TrainConfig
    inp: torch.Tensor  # (V, d) the trainer's input table
    out: torch.Tensor  # (V, d) its output table
    batches: list  # (ctx, mask, center, negatives) per step, text order
    words: int


def perpair_cell(corpus: str) -> tuple[Word2VecConfig, int, Corpus]:
    """The cell's settings, the config's seed and the corpus read and encoded as the stage reads it
    (steps/word2vec/corpus.py); torch on 1 thread, as the cell's timings run."""
    torch.set_num_threads(1)
    config = load_config(CONFIG_DIR / "default.yaml")
    p = Word2VecConfig.of(cell_config(config, "word2vec", "sgd_perpair")["params"])
    sents, raw = load_sentences(p, corpus)
    vocab = vocabulary(sents, p.min_count, corpus)
    ids, sid = vocab.encode(sents)
    return p, config["seed"], Corpus(sents, vocab, ids, sid, {"corpus_words": raw})


def perpair_batches(corpus: str, words: int = 200_000) -> PerPairBatches:
    """The cell's batches over the corpus's first `words` words (1 thread, CPU)."""
    p, seed, enc = perpair_cell(corpus)
    cfg = TrainConfig.from_params(p, seed=seed)
    trainer = Trainer(enc.vocab, replace(cfg, compile=False), "cpu")  # its tables and draws; the steps compile apart
    ids, sid = enc.ids[:words], enc.sid[:words]
    plan = plan_epoch(ids, sid, trainer.keep, cfg.window, cfg.batch_size, trainer.rng, "cpu")
    draw = trainer.negatives.take
    batches = [(x, m, c, draw((len(c), trainer.rows(x.shape[1]), cfg.negative))) for x, m, c in plan.batches]
    return PerPairBatches(cfg, trainer.model.inp.data, trainer.model.out.data, batches, words)
