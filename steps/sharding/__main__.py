"""`python -m steps.sharding`: the sharding stage's job (steps/sharding/stage.py)."""

from steps.sharding.stage import STAGE

STAGE.main()
