"""The report's section as a dataclass. Defaults: the schema (workflow/schemas/report.schema.yaml),
filled in before the dataclass is built; the dict stays what the job logs and hashes."""

from __future__ import annotations

from dataclasses import dataclass

from steps.config.typed import Section


@dataclass(frozen=True, kw_only=True)
class ReportConfig(Section):
    """The report's resolved section, and the stages the rule adds to it."""

    title: str
    html: bool  # also write a self-contained index.html
    mlflow_ui_url: str  # where `python -m steps.ui` serves MLflow; run links point here
    # not a knob: ([stage, [cell, ...]], ...), every other stage rule's selected cells in DAG order
    # (workflow/rules/report.smk adds it to the section)
    stages: tuple[list, ...] = ()
    # not a knob: the config's sweeps (steps/config/sweep.py: Sweep.as_dict), where it has any
    sweeps: tuple[dict, ...] = ()
