"""Dated records of finished runs, and the pages that quote them (the modded-nanogpt `records/` habit):

    python -m steps.record RESULTS_DIR [--out docs/results]   # write.py: a finished DAG's record
    python -m steps.record --publish [--check]                # publish.py: README and write-ups from them

- write.py    a record from what a run left (its report tables and MLflow store)
- read.py     records read back as data (facts, tables, host kinds)
- blocks.py   the generated blocks of README and the write-ups, each a function of the records
- publish.py  rewrites (or checks) those blocks in the pages, and finds numbers no record backs

Light on purpose: importing the package loads none of them (publishing needs no MLflow).
"""
