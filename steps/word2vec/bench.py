"""The per-pair step's benchmark setup, shared by scripts/w2v-step-ab and scripts/w2v-perpair-passes:
the default config's `sgd_perpair` cell (word2vec.c's sampling) on the first words of a real corpus,
planned once (subsampling, windows, negatives drawn once), so every timed call repeats the same work."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from steps.config import CONFIG_DIR, cell_config, load_config
from steps.word2vec.config import Word2VecConfig
from steps.word2vec.corpus import load_sentences
from steps.word2vec.train import TrainConfig, Trainer
from steps.word2vec.vocab import Vocab
from steps.word2vec.windows import plan_epoch


@dataclass
class PerPairBatches:
    cfg: TrainConfig
    inp: torch.Tensor  # (V, d) the trainer's input table
    out: torch.Tensor  # (V, d) its output table
    batches: list  # (ctx, mask, center, negatives) per step, text order
    words: int


def perpair_batches(corpus: str, words: int = 200_000) -> PerPairBatches:
    """The cell's batches over the corpus's first `words` words (1 thread, CPU)."""
    torch.set_num_threads(1)
    config = load_config(CONFIG_DIR / "default.yaml")
    p = Word2VecConfig.of(cell_config(config, "word2vec", "sgd_perpair")["params"])
    sents, _ = load_sentences(p, corpus)
    vocab = Vocab.build(sents, p.min_count)
    ids, sid = vocab.encode(sents)
    cfg = TrainConfig.from_params(p, seed=config["seed"])
    trainer = Trainer(vocab, TrainConfig.from_params(p, seed=config["seed"], compile=False), "cpu")
    plan = plan_epoch(ids[:words], sid[:words], trainer.keep, cfg.window, cfg.batch_size, trainer.rng, "cpu")
    draw = trainer.negatives.take
    batches = [(x, m, c, draw((len(c), trainer.rows(x.shape[1]), cfg.negative))) for x, m, c in plan.batches]
    return PerPairBatches(cfg, trainer.model.inp.data, trainer.model.out.data, batches, words)
