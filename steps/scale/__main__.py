"""`python -m steps.scale`: the scale stage's job (steps/scale/stage.py)."""

from steps.scale.stage import STAGE

STAGE.main()
