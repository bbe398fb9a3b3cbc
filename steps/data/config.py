"""The data stages' sections as dataclasses: prepare_corpus's and train_tokenizer's knobs.
Defaults: the schemas (workflow/schemas/<stage>.schema.yaml), filled in before the dataclass is
built; the dict stays what the job logs and hashes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from steps.config.typed import Section


@dataclass(frozen=True, kw_only=True)
class PrepareCorpusConfig(Section):
    """prepare_corpus's resolved section."""

    source: str  # builtin:shakespeare | hf:<path>[:<name>] | a glob of local text/markdown files
    unit: Literal["scene", "play"]  # builtin:shakespeare document granularity
    text_column: str  # column holding text in hf: sources
    encoding: str  # how local files (and .gz files, gunzipped) are decoded; a wrong one stops the job
    val_fraction: float
    max_documents: int  # 0 = all documents
    min_chars: int  # drop shorter documents
    streaming: bool  # read through a datasets.IterableDataset (hub: streaming=True); same documents


@dataclass(frozen=True, kw_only=True)
class TrainTokenizerConfig(Section):
    """train_tokenizer's resolved section."""

    vocab_size: int
    min_frequency: int
    pretrained: str | None  # a hub/local tokenizer to use instead of training one
