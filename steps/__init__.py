"""The lab's stages and everything they share (docs/pipeline.md: the module map).

A process that imports this under `snakemake` (a job: `python -m steps.<stage>`) starts watching that
snakemake here, before its stage's heavy imports: it never outlives it (steps/lifeline.py).
"""

from steps import lifeline as _lifeline

_lifeline.die_with_snakemake()
