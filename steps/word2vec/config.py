"""The word2vec section as a dataclass: the trainer's knobs are TrainOptions' fields (declared
there, once); here only what the stage adds. Defaults: the schema
(workflow/schemas/word2vec.schema.yaml), filled in before the dataclass is built; the dict stays
what the job logs and hashes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from steps.config.typed import Section
from steps.word2vec.train import TrainOptions


@dataclass(frozen=True, kw_only=True)
class Word2VecConfig(TrainOptions, Section):
    """One word2vec cell's resolved section (TrainOptions' fields: the trainer's knobs)."""

    threads: int  # torch threads = gensim workers (0 = the global threads)
    corpus: str | None  # a saved DatasetDict (None = the prepare_corpus rule's corpus)
    split: str
    max_words: int  # cut the corpus to this many tokens (0 = all)
    backend: Literal["torch", "gensim", "pretrained"]
    pretrained: str  # the pretrained backend's model: installed package, hub name or path
    min_count: int
    seeds: int  # seeds seed..seed+seeds-1; the first seed's vectors are exported
    vs_gensim_pairs: int  # interleaved pairs of the side-by-side timing (0 = off)
    vs_gensim_words: int  # raw words per slice of that timing
    common_questions: list[str]  # vocabularies whose shared analogy questions every cell is scored on
    restrict_vocab: int  # analogy/similarity use the first N words
    export: bool  # write vectors.txt
    probes: list[str]
    groups: dict[str, list[str]]
