"""`python -m steps.word2vec`: the word2vec stage's job (steps/word2vec/stage.py)."""

from steps.word2vec.stage import STAGE

STAGE.main()
