"""Decoding: greedy, temperature / top-k / top-p sampling, beam search; all with a KV cache.

The KV cache keeps every layer's keys and values, so each new token costs one row of attention
instead of re-running the whole prefix: cached and uncached decoding give the same tokens.
Works with any model whose forward(input_ids, past_key_values=None, use_cache=False) returns an
object with .logits and .past_key_values (ours, or a toy one in the tests).

HF generate's controls (tests/test_gpt_generate.py checks each against HF generate on the same weights):
num_return_sequences (sampling: each prompt repeated n times in a row, HF's order; beams: the n best
finished hypotheses; greedy: only 1, as HF) and max_time (seconds: stop after the token that crossed it,
as HF's MaxTimeCriteria, so max_time=0 gives one new token).
"""

from __future__ import annotations

import re
import time

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


def _deadline(max_time: float | None) -> float | None:
    return None if max_time is None else time.time() + max_time  # HF's MaxTimeCriteria clock


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.time() > deadline


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
    num_return_sequences: int = 1,
    max_time: float | None = None,
):
    """Greedy (do_sample=False, HF's generate(do_sample=False)) or sampling. A sequence that
    emitted eos keeps emitting eos (as HF pads); stops when all have, after max_new_tokens, or once
    max_time seconds have passed. Sampling returns num_return_sequences rows per prompt: (B·n, T + new)."""
    if num_return_sequences > 1 and not do_sample:
        raise ValueError(
            f"num_return_sequences={num_return_sequences}: greedy decoding gives one sequence per prompt "
            "(as HF generate); fix: do_sample=True, or beam_search(num_return_sequences=...)"
        )
    deadline = _deadline(max_time)
    was_training = model.training
    model.eval()
    seq, step = input_ids.repeat_interleave(num_return_sequences, 0), _Stepper(model, use_cache)  # (B·n, T)
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
        if (eos_token_id is not None and bool(done.all())) or _past(deadline):
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
    num_return_sequences: int = 1,
    max_time: float | None = None,
    pad_token_id: int | None = None,
):
    """Keep the num_beams best partial sequences by summed log-probability. A finished
    hypothesis is scored sum_logprob / new_len**length_penalty (HF's convention: >0 favours
    longer outputs). input_ids: (1, T). Returns (best sequence (1, T+n), its score); with
    num_return_sequences=n > 1, the n best as (n, T+n_max) (shorter ones padded with pad_token_id, else
    eos_token_id, else 0, as HF) and their n scores, best first. Stops early once max_time seconds pass."""
    if input_ids.shape[0] != 1:
        raise ValueError("beam_search takes one prompt (batch 1)")
    if not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences={num_return_sequences} must be between 1 and num_beams={num_beams}")
    deadline = _deadline(max_time)
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
        beaten = len(finished) == num_beams and scores.max().item() / t**length_penalty <= finished[-1][0]
        if beaten or _past(deadline):
            break
    for s, hyp in zip(scores.tolist(), seq):
        finished.append((s / (hyp.shape[0] - T0) ** length_penalty, hyp))
    ranked = sorted(finished, key=lambda x: -x[0])[:num_return_sequences]
    model.train(was_training)
    if num_return_sequences == 1:
        return ranked[0][1][None], ranked[0][0]
    pad = next((t for t in (pad_token_id, eos_token_id) if t is not None), 0)
    width = max(h.shape[0] for _, h in ranked)
    seqs = torch.stack([F.pad(h, (0, width - h.shape[0]), value=pad) for _, h in ranked])  # (n, T + n_max)
    return seqs, [s for s, _ in ranked]


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
