"""The analogy questions every compared cell can answer: like with like.

A cell answers the Google analogy questions whose four words are among the first
`restrict_vocab` words of its vocabulary (gensim's rule). Corpus-trained cells share one
vocabulary (~2,300 questions on the plays); a pretrained LM's single-token words answer ~12,000.
Accuracies over different question sets are no comparison, so every cell is also scored on the
questions that all the listed vocabularies answer (`word2vec.common_questions`): "corpus" (the
vocabulary the trained cells build from the corpus) and each pretrained cell's model. Each job
computes the same set from the same list, and checks that its own vocabulary is on it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from steps.config import ConfigError

if TYPE_CHECKING:  # annotations only: the questions need no torch
    from steps.word2vec.config import Word2VecConfig

CORPUS = "corpus"  # the trained cells' vocabulary, built from the corpus with min_count
Question = tuple[str, str, str, str, str]  # (section, a, b, c, d), lowercased: a:b :: c:d


def read_questions(path: str) -> list[Question]:
    """Every well-formed question of a questions-words file, lowercased, with its section."""
    section, out = "", []
    for line in open(path):
        if line.startswith(":"):
            section = line[1:].strip()
            continue
        q = line.lower().split()
        if len(q) == 4:
            out.append((section, *q))
    return out


def answerable(questions: list[Question], words: Iterable[str]) -> list[Question]:
    """The questions whose four words are all in `words` (compared lowercased)."""
    known = {w.lower() for w in words}
    return [q for q in questions if all(w in known for w in q[1:])]


@dataclass(frozen=True)
class QuestionSet:
    """The questions that every vocabulary in `sources` answers, out of `total` in the file."""

    questions: tuple[Question, ...]
    sources: tuple[str, ...]
    total: int

    @property
    def digest(self) -> str:
        """Short hash of the questions: equal in every cell that was scored on the same set."""
        return hashlib.sha256(repr(self.questions).encode()).hexdigest()[:12]

    @property
    def label(self) -> str:
        return f"{len(self.questions):,} questions answerable by every vocabulary of {' & '.join(self.sources)}"


def common_questions(questions: list[Question], vocabularies: dict[str, list[str]], restrict_vocab: int) -> QuestionSet:
    """The questions answerable within the first `restrict_vocab` words of every vocabulary."""
    common = questions
    for words in vocabularies.values():
        common = answerable(common, words[:restrict_vocab])
    return QuestionSet(tuple(common), tuple(vocabularies), len(questions))


def own_source(p: Word2VecConfig) -> str:
    """The name a cell's vocabulary has in `common_questions`."""
    return p.pretrained if p.backend == "pretrained" else CORPUS


def check_sources(p: Word2VecConfig) -> list[str]:
    """`common_questions` must list this cell's own vocabulary: only then do all cells intersect
    the same vocabularies, so that every cell's common set is the same one."""
    sources = list(p.common_questions)
    if own_source(p) not in sources:
        raise ConfigError(
            f"word2vec.common_questions {sources} does not list this cell's vocabulary {own_source(p)!r}; "
            f"fix: add it, so every cell is scored on the questions all of them can answer"
        )
    return sources


def source_words(source: str, corpus_words: list[str] | None) -> list[str]:
    """A listed vocabulary's words in the order its cell keeps them: the corpus vocabulary (most
    frequent first) or a pretrained model's single-token words (token-id order)."""
    if source == CORPUS:
        if corpus_words is None:
            raise ConfigError("word2vec.common_questions lists 'corpus' but this job read no corpus")
        return corpus_words
    from transformers import AutoTokenizer  # only here: trained cells need no transformers otherwise

    from steps.word2vec.pretrained import resolve_model_dir, single_token_words

    return list(single_token_words(AutoTokenizer.from_pretrained(resolve_model_dir(source))))


def question_set(
    p: Word2VecConfig, questions: list[Question], corpus_words: list[str] | None, known: dict
) -> QuestionSet:
    """The common set of a cell's config: every listed vocabulary (`known` maps a source to words
    the job already has) intersected, within the first restrict_vocab words of each."""
    sources = check_sources(p)
    vocabularies = {s: known[s] if s in known else source_words(s, corpus_words) for s in sources}
    return common_questions(questions, vocabularies, p.restrict_vocab)
