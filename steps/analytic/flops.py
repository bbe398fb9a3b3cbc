"""Model FLOPs of one token's training step (forward + backward), the one formula every MFU uses."""

from __future__ import annotations


def flops_per_token(n_params_non_embedding: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """6N + 12·L·d·T (PaLM appendix B; nanoGPT's estimate_mfu; torchtitan's MFU): 6 FLOPs per
    parameter a token meets (N without the embedding table, a lookup), and QKᵀ and AV forward and
    backward for attention (causal masking not discounted)."""
    return 6 * n_params_non_embedding + 12 * n_layer * d_model * seq_len
