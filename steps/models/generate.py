"""Decoding: greedy, temperature / top-k / top-p sampling, beam search; all with a KV cache.

The KV cache keeps every layer's keys and values, so each new token costs one row of attention
instead of re-running the whole prefix: cached and uncached decoding give the same tokens.
Works with any model whose forward(input_ids, past_key_values=None, use_cache=False) returns an
object with .logits and .past_key_values (ours, or a toy one in the tests).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F


def filter_logits(logits, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None):
    """Scale by 1/temperature, then keep the top-k tokens and/or the smallest set whose
    probability mass reaches top_p (nucleus); the rest become -inf."""
    logits = logits / max(temperature, 1e-8)
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # mass before this token already reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))
    return logits


def _block_size(model) -> int:
    return getattr(getattr(model, "config", None), "block_size", None) or 1 << 30


class _Stepper:
    """Feeds tokens to the model: only the new ones when the cache is on, the (cropped)
    full context otherwise. Falls back to a fresh context when the window is full."""

    def __init__(self, model, use_cache: bool):
        self.model, self.use_cache, self.past = model, use_cache, None
        self.block = _block_size(model)

    def logits(self, seq, n_new: int):
        if self.use_cache and self.past is not None and seq.shape[1] <= self.block:
            out = self.model(seq[:, -n_new:], past_key_values=self.past, use_cache=True)
        else:
            out = self.model(seq[:, -self.block :], use_cache=self.use_cache)
        self.past = out.past_key_values if self.use_cache else None
        return out.logits[:, -1, :].float()

    def reorder(self, idx):
        if self.past is not None:
            self.past = tuple((k[idx], v[idx]) for k, v in self.past)


@torch.no_grad()
def generate(
    model,
    input_ids,
    max_new_tokens: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    use_cache: bool = True,
    generator=None,
):
    """Greedy (do_sample=False, HF's generate(do_sample=False)) or sampling. A sequence that
    emitted eos keeps emitting eos (as HF pads); stops when all have, or after max_new_tokens."""
    was_training = model.training
    model.eval()
    seq, step = input_ids, _Stepper(model, use_cache)
    done = torch.zeros(seq.shape[0], dtype=torch.bool, device=seq.device)
    n_new = seq.shape[1]
    for _ in range(max_new_tokens):
        logits = step.logits(seq, n_new)
        if do_sample:
            probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
            if generator is not None and generator.device != probs.device:  # a CPU generator, a GPU model:
                nxt = torch.multinomial(probs.float().cpu(), 1, generator=generator).to(probs.device)  # same draws
            else:
                nxt = torch.multinomial(probs, 1, generator=generator)
        else:
            nxt = logits.argmax(-1, keepdim=True)
        if eos_token_id is not None:
            nxt = nxt.masked_fill(done[:, None], eos_token_id)
            done |= nxt[:, 0] == eos_token_id
        seq, n_new = torch.cat([seq, nxt], dim=1), 1
        if eos_token_id is not None and bool(done.all()):
            break
    model.train(was_training)
    return seq


@torch.no_grad()
def beam_search(
    model,
    input_ids,
    num_beams: int = 4,
    max_new_tokens: int = 20,
    length_penalty: float = 1.0,
    eos_token_id: int | None = None,
    use_cache: bool = True,
):
    """Keep the num_beams best partial sequences by summed log-probability. A finished
    hypothesis is scored sum_logprob / new_len**length_penalty (HF's convention: >0 favours
    longer outputs). input_ids: (1, T). Returns (best sequence (1, T+n), its score)."""
    if input_ids.shape[0] != 1:
        raise ValueError("beam_search takes one prompt (batch 1)")
    was_training = model.training
    model.eval()
    T0 = input_ids.shape[1]
    seq = input_ids
    scores = torch.zeros(1, device=input_ids.device, dtype=torch.float64)
    finished: list[tuple[float, torch.Tensor]] = []
    step, n_new = _Stepper(model, use_cache), T0
    for t in range(1, max_new_tokens + 1):
        logp = F.log_softmax(step.logits(seq, n_new).double(), -1)  # (beams, V)
        V = logp.shape[-1]
        cand = (scores[:, None] + logp).view(-1)
        top, flat = torch.topk(cand, min(2 * num_beams, cand.numel()))
        keep_idx, keep_tok, keep_score = [], [], []
        for s, f in zip(top.tolist(), flat.tolist()):
            b, tok = divmod(f, V)
            if eos_token_id is not None and tok == eos_token_id:
                hyp = torch.cat([seq[b], seq.new_tensor([tok])])
                finished.append((s / t**length_penalty, hyp))
            else:
                keep_idx.append(b), keep_tok.append(tok), keep_score.append(s)
            if len(keep_idx) == num_beams:
                break
        finished = sorted(finished, key=lambda x: -x[0])[:num_beams]
        if not keep_idx:
            break
        idx = torch.tensor(keep_idx, device=seq.device)
        seq = torch.cat([seq[idx], seq.new_tensor(keep_tok)[:, None]], dim=1)
        scores = torch.tensor(keep_score, dtype=torch.float64, device=seq.device)
        step.reorder(idx)
        n_new = 1
        # done when no live beam can beat the worst kept finished one (HF's early_stopping=False)
        if len(finished) == num_beams and scores.max().item() / t**length_penalty <= finished[-1][0]:
            break
    for s, hyp in zip(scores.tolist(), seq):
        finished.append((s / (hyp.shape[0] - T0) ** length_penalty, hyp))
    best_score, best = max(finished, key=lambda x: x[0])
    model.train(was_training)
    return best[None], best_score


WHITESPACE_NOTE = "(⏎ = newline, · = a space you would not see, → = tab: the model's output as it came)"


def visible(text: str) -> str:
    """Decoded text with the whitespace a terminal or a Markdown block would hide made visible: a
    small model often emits only newlines and spaces, which print as blank lines. Newlines show as
    ⏎ (and still break the line), tabs as →, and spaces as · where they lead, trail or repeat (or
    make up the whole text); an empty completion shows as ∅."""
    if not text:
        return "∅"
    if not text.strip():
        return text.replace(" ", "·").replace("\t", "→").replace("\n", "⏎\n")
    out = []
    for line in text.split("\n"):
        body = line.strip(" ")
        lead, trail = len(line) - len(line.lstrip(" ")), len(line) - len(line.rstrip(" "))
        body = re.sub(r" {2,}", lambda m: "·" * len(m.group(0)), body).replace("\t", "→")
        out.append("·" * lead + body + "·" * trail if body else "·" * len(line))
    return "⏎\n".join(out)
