"""The scale section as a dataclass (defaults: workflow/schemas/scale.schema.yaml, filled in before it
is built). Its plan is a ScalePlan (scale_plan.py, checked on construction); the clusters stay the
config's table, read by name into a Cluster (cluster.py: Cluster.from_config)."""

from __future__ import annotations

from dataclasses import dataclass

from steps.config.typed import Section
from steps.scale.scale_plan import ScalePlan


@dataclass(frozen=True, kw_only=True)
class Published:
    """A published run of the same setup (scale.published; absent keys: none published)."""

    tokens_per_s_gpu: float | None = None
    memory_gib: float | None = None
    source: str = ""
    note: str = ""  # what the prediction leaves out for this run


@dataclass(frozen=True, kw_only=True)
class SearchFor:
    """What a `search` cell ranks plans for (scale.search_for; a search cell sets every key)."""

    world: int | None = None
    global_batch: int | None = None  # sequences per step
    seq: int | None = None


@dataclass(frozen=True, kw_only=True)
class ScaleConfig(Section):
    """One scale cell's resolved section."""

    clusters: dict[str, dict]  # name -> the cluster's entry (Cluster.from_config)
    model: str  # a shape of steps/models/shapes.py, by name
    model_overrides: dict  # GPTConfig fields replacing the shape's
    cluster: str  # a key of clusters
    plan: ScalePlan
    published: Published
    measured: tuple[str, ...]  # sharding cells to replay on the fake group
    search: bool
    search_for: SearchFor
    # the measured cells' resolved sharding sections, added by workflow/rules/scale.smk (not a config key)
    sharding_plans: dict[str, dict] | None = None
