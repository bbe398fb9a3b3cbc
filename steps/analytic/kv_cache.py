"""The KV cache of decoding, from the model's shape alone (no torch): what each generated token
keeps, and how many sequences fit a memory budget (Pope et al. 2022, "Efficient Scaling Transformer
Inference", §3: at long context and large batch the cache, not the weights, fills the memory;
multi-query attention divides it by the number of heads, Shazeer 2019).

Per layer, every position keeps one key and one value vector per key/value head:

    cache bytes = 2 (k and v) · n_layer · batch · positions · n_kv_head · head_dim · bytes per element

MHA has n_kv_head = n_head, GQA fewer, MQA one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CacheShape:
    """What the KV cache's size depends on."""

    n_layer: int
    n_kv_head: int
    head_dim: int
    bytes_per_element: int  # 8 fp64, 4 fp32, 2 bf16/fp16, 1 int8

    def bytes(self, batch: int, positions: int) -> int:
        """Bytes of the cache holding `positions` positions of `batch` sequences."""
        return 2 * self.n_layer * batch * positions * self.n_kv_head * self.head_dim * self.bytes_per_element

    def bytes_per_token(self) -> int:
        return self.bytes(1, 1)


def max_batch(cache: CacheShape, positions: int, budget_bytes: float, weight_bytes: float) -> int:
    """The most sequences of `positions` positions whose caches fit `budget_bytes` beside the
    weights (0 when the weights alone do not fit)."""
    free = budget_bytes - weight_bytes
    return max(int(free // cache.bytes(1, positions)), 0)
