"""What the minitorch stage shows: its report section and its runs' params (steps/core/stage.py)."""

from __future__ import annotations

from steps.presentation import Presentation

# the columns each kind of cell fills (the rest stay empty in its row)
KIND_COLUMNS = {
    "ops": [
        "op parity (max err)",
        "matmul GFLOP/s",
        "torch matmul GFLOP/s",
        "of fp64 GEMM peak",
        "matmul × torch",
        "matmul × torch low",
        "matmul × torch high",
        "matmul × torch pairs",
    ],
    "gpt": [
        "GPT logits err",
        "GPT grad err",
        "loss trajectory err",
        "tokens/s",
        "torch eager tokens/s",
        "× torch eager",
        "× torch low",
        "× torch high",
        "× torch pairs",
    ],
    "classifier": ["accuracy", "majority"],
    "translate": ["BLEU"],
}


def columns_for(params: dict) -> list[str]:
    timed_vs_reference = (
        params["kind"] == "gpt" and params["backend"] != "reference" and params["gpt"]["vs_reference_pairs"]
    )
    gpt_vs_reference = ["× reference", "× reference low", "× reference high", "× reference pairs"]
    gpt_vs_reference = gpt_vs_reference if timed_vs_reference else []
    return ["kind", "backend", *KIND_COLUMNS[params["kind"]], *gpt_vs_reference]


SHOWN = Presentation(
    columns={
        "kind": "params.kind",
        "backend": "params.backend",
        "op parity (max err)": "metrics.op_parity_err_max",
        "matmul GFLOP/s": "metrics.matmul_gflops",
        "torch matmul GFLOP/s": "metrics.torch_matmul_gflops",
        "of fp64 GEMM peak": "metrics.matmul_of_peak",
        "matmul × torch": "metrics.matmul_vs_torch",
        "matmul × torch low": "metrics.matmul_vs_torch_low",
        "matmul × torch high": "metrics.matmul_vs_torch_high",
        "matmul × torch pairs": "metrics.matmul_vs_torch_pairs",
        "GPT logits err": "metrics.gpt_logits_err",
        "GPT grad err": "metrics.gpt_grad_err",
        "loss trajectory err": "metrics.loss_trajectory_err",
        "tokens/s": "metrics.tokens_per_s",
        "torch eager tokens/s": "metrics.torch_tokens_per_s",
        "× torch eager": "metrics.vs_torch_eager",
        "× torch low": "metrics.vs_torch_eager_low",
        "× torch high": "metrics.vs_torch_eager_high",
        "× torch pairs": "metrics.vs_torch_eager_pairs",  # interleaved pairs: a ratio's count is published with it
        "× reference": "metrics.vs_reference",
        "× reference low": "metrics.vs_reference_low",
        "× reference high": "metrics.vs_reference_high",
        "× reference pairs": "metrics.vs_reference_pairs",
        "accuracy": "metrics.accuracy",
        "majority": "metrics.majority_accuracy",
        "BLEU": "metrics.bleu",
    },
    headline=("worst op parity error vs torch (fp64)", "op parity (max err)", "max"),
    curves=["train_loss"],
    tables=["op_parity", "loss_trajectory", "seeds"],  # seeds: the classifier's per-seed accuracy
    columns_for=columns_for,
)
