"""`python -m steps.report --cfg JSON --input <stage>/<cell>=<metrics.json> ... --output ...`."""

from steps.report import STAGE

STAGE.main()
