"""What the scale stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation


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
        "predicted EP all-to-all/step (s, exposed)": "metrics.predicted_all_to_all_s",
        "comm/step, the plan with its AC (GiB, analytic)": "metrics.comm_gib_analytic",
        "state sim÷gloo": "metrics.state_ratio_gloo",
        "comm sim÷gloo (both dispatch-counted)": "metrics.comm_ratio_gloo",
        "predicted tokens/s/GPU": "metrics.predicted_tokens_per_s_gpu",
        "predicted MFU": "metrics.predicted_mfu",
        # torchtitan's are measured on the cell's plan; Mixtral's is derived (its cell's source says how)
        "published tokens/s/GPU (Mixtral: derived from Megatron's 468 TFLOPS, different plan)": (
            "metrics.published_tokens_per_s_gpu"
        ),
        "tokens/s predicted÷published": "metrics.predicted_published_ratio",
        "predicted memory/GPU (GiB)": "metrics.predicted_mem_gib",
        "published memory/GPU (GiB)": "metrics.published_memory_gib",
        "memory predicted÷published": "metrics.predicted_published_mem_ratio",
        "predicted fits": "info.fits",
        "source": "info.source",
    },
    headline=(
        "worst predicted ÷ published tokens/s per GPU (torchtitan's measured on the same plan; Mixtral's derived "
        "from Megatron's 468 TFLOPS, different plan)",
        "tokens/s predicted÷published",
        "min",
    ),
    figures=report_figures,
)
