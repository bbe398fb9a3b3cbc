"""What the scale stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.core.stage import Presentation


def report_figures(table, out_dir, folders):
    from steps.scale.figures import world_curves  # report-side only (matplotlib)

    return world_curves(table, out_dir)


SHOWN = Presentation(
    columns={
        "model": "info.model",
        "cluster": "info.cluster",
        "plan": "info.plan",
        "mesh": "info.mesh",
        "world": "metrics.world",
        "batch/rank (seqs × seq)": "info.batch",
        "memory/GPU simulated vs analytic": "info.memory",
        "state sim÷Playbook": "metrics.state_ratio",
        "state sim÷predicted": "metrics.state_ratio_held",
        "saved sim÷op count (AC as simulated)": "metrics.saved_ratio",
        "saved/layer sim÷Playbook (AC as simulated)": "metrics.saved_layer_ratio_playbook",
        "comm/step simulated vs analytic (GiB)": "info.comm",
        "comm sim÷analytic": "metrics.comm_ratio",
        "EP all-to-all/step (s, exposed)": "metrics.all_to_all_s",
        "comm/step, the plan with its AC (GiB, analytic)": "metrics.comm_gib_analytic",
        "state sim÷gloo": "metrics.state_ratio_gloo",
        "comm sim÷gloo": "metrics.comm_ratio_gloo",
        "tokens/s/GPU predicted": "metrics.tokens_per_s_gpu",
        "MFU": "metrics.mfu",
        "published tokens/s/GPU": "metrics.published_tokens_per_s_gpu",
        "tokens/s predicted÷published": "metrics.published_ratio",
        "memory/GPU (GiB)": "metrics.mem_gib",
        "published memory/GPU (GiB)": "metrics.published_memory_gib",
        "memory predicted÷published": "metrics.published_mem_ratio",
        "fits": "info.fits",
        "source": "info.source",
    },
    headline=("worst predicted ÷ published tokens/s per GPU", "tokens/s predicted÷published", "min"),
    figures=report_figures,
)
