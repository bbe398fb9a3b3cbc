"""`python -m steps.minitorch`: the minitorch stage's job (steps/minitorch/stage.py)."""

from steps.minitorch.stage import STAGE

STAGE.main()
