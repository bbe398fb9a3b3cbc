"""Decoding as the inference cells measure it: one greedy loop for any causal LM (ours or HF's),
with or without the KV cache, and the cache's bytes read from its tensors.

The loop is the same for every model, so a timing difference between two models is the models'
forward, not the loop around it (ours vs HF's own `generate` is timed separately: cells.vs_hf).
"""

from __future__ import annotations

import torch

from steps.models.gpt import GPTConfig, GPTLMHeadModel

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def build_model(model: dict, dtype: str, seed: int, device, **changes) -> GPTLMHeadModel:
    """Our GPT of the section's `model` knobs (and `changes`), random init from `seed`, in eval mode."""
    torch.manual_seed(seed)
    config = GPTConfig(**{**model, **changes})
    with torch.device(device):
        return GPTLMHeadModel(config).to(DTYPES[dtype]).eval()


def prompt_ids(vocab_size: int, batch: int, length: int, seed: int, device) -> torch.Tensor:
    """(batch, length) random token ids, the same for every model given the seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g).to(device)


@torch.no_grad()
def prefill(model, ids: torch.Tensor, use_cache: bool = True):
    """The prompt's forward: its output (logits (B, T, V), past_key_values with the cache)."""
    return model(ids, use_cache=use_cache)


@torch.no_grad()
def decode(model, ids: torch.Tensor, new_tokens: int, use_cache: bool, first=None):
    """Greedy: `new_tokens` tokens after `ids` (B, T). With the cache each step feeds one token and
    the cache; without, the whole sequence again. `first` is a prefill output to start from (so a
    timing can leave the prefill out). Returns (sequence (B, T + new_tokens), last step's logits
    (B, V), the last output)."""
    out = first if first is not None else prefill(model, ids, use_cache)
    seq = ids
    for _ in range(new_tokens):
        nxt = out.logits[:, -1:].argmax(-1)  # (B, 1)
        seq = torch.cat([seq, nxt], dim=1)  # (B, T + i + 1)
        if use_cache:
            out = model(nxt, past_key_values=out.past_key_values, use_cache=True)
        else:
            out = model(seq)
    return seq, out.logits[:, -1], out


def cache_bytes(past) -> int:
    """Bytes of a KV cache, summed over its tensors: ours is a tuple of (k, v) per layer; HF's a Cache
    whose layers hold .keys/.values."""
    layers = getattr(past, "layers", None)
    pairs = [(layer.keys, layer.values) for layer in layers] if layers is not None else past
    return sum(t.numel() * t.element_size() for kv in pairs for t in kv)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (a tied weight once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
