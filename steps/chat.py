"""Complete a prompt with a trained checkpoint, or chat interactively.

    python -m steps.chat --checkpoint results/gpt_train/main/ckpt.pt --prompt "ROMEO:"
    python -m steps.chat --checkpoint results/gpt_train/main/ckpt.pt          # interactive
Options pick the decoder: sampling as nanoGPT's sample.py does (default: --temperature 0.8 --top-k 200,
seeded by --seed, so a seed repeats its text), --greedy (the likeliest token each step; a small model
repeats one token, often a newline), --top-p, or beam search (--beams N). HF generate's controls:
--num-return-sequences N completions of each prompt (N samples, or the N best beams), --max-time S
stops generating after S seconds (HF's MaxTimeCriteria). Whitespace the terminal would hide is shown
(⏎ newline, · space, → tab, ∅ nothing): a small model often emits only that.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from steps.core.cli import parser
from steps.models.generate import WHITESPACE_NOTE, beam_search, generate, visible
from steps.models.gpt import GPTConfig, GPTLMHeadModel


def load(checkpoint: str | Path, device: str = "cpu"):
    path = Path(checkpoint)
    if not path.exists():
        sys.exit(f"{path} does not exist; fix: run `snakemake --cores 2 {path.parent / 'metrics.json'}` first")
    from steps.core.errors import InputError
    from steps.models.training import read_checkpoint  # weights only: a crafted file runs nothing

    try:
        ck = read_checkpoint(path, map_location=device)
    except InputError as exc:
        sys.exit(str(exc))
    model = GPTLMHeadModel(GPTConfig(**ck["config"])).to(device)
    model.load_state_dict(ck["model"])
    tok = AutoTokenizer.from_pretrained(str(path.parent / ck.get("tokenizer", "tokenizer")))
    return model.eval(), tok


def complete(
    model,
    tok,
    prompt: str,
    max_new_tokens: int = 60,
    temperature: float = 0.8,
    top_k: int | None = 200,
    top_p: float | None = None,
    beams: int = 1,
    seed: int = 0,
    num_return_sequences: int = 1,
    max_time: float | None = None,
) -> list[str]:
    """num_return_sequences completions of `prompt`: samples (one generator, seeded), or the best beams
    (greedy gives one; more is an error, as in HF generate)."""
    ids = torch.tensor([tok(prompt)["input_ids"] or [tok.eos_token_id]], device=next(model.parameters()).device)
    if beams > 1:
        out = beam_search(
            model,
            ids,
            beams,
            max_new_tokens,
            eos_token_id=tok.eos_token_id,
            num_return_sequences=num_return_sequences,
            max_time=max_time,
        )[0]
    else:
        out = generate(
            model,
            ids,
            max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature or 1.0,
            top_k=top_k,
            top_p=top_p,
            eos_token_id=tok.eos_token_id,
            generator=torch.Generator().manual_seed(seed),
            num_return_sequences=num_return_sequences,
            max_time=max_time,
        )
    return [tok.decode(row[ids.shape[1] :].tolist(), skip_special_tokens=True) for row in out]


def main(argv=None):
    ap = parser("python -m steps.chat", __doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default="results/gpt_train/main/ckpt.pt", help="gpt_train's checkpoint")
    ap.add_argument("--prompt", help="complete this and exit (default: interactive)")
    ap.add_argument("--max-new-tokens", type=int, default=60, help="tokens to generate")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 = greedy")
    ap.add_argument("--top-k", type=int, default=200, help="sample from the k likeliest tokens only; 0 = all")
    ap.add_argument("--greedy", action="store_true", help="the likeliest token each step, no sampling")
    ap.add_argument("--top-p", type=float, help="sample from the smallest set of tokens with this total probability")
    ap.add_argument("--beams", type=int, default=1, help="beam search with this many beams (1 = off)")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    ap.add_argument(
        "--num-return-sequences",
        type=int,
        default=1,
        help="completions of each prompt: that many samples, or the best beams (at most --beams)",
    )
    ap.add_argument("--max-time", type=float, help="stop generating after this many seconds (HF's max_time)")
    a = ap.parse_args(argv)
    n = a.num_return_sequences
    if n < 1 or (n > 1 and a.beams == 1 and (a.greedy or a.temperature == 0)) or (a.beams > 1 and n > a.beams):
        ap.error(
            f"--num-return-sequences {n}: greedy decoding gives one completion and beam search at most "
            f"--beams ({a.beams}); fix: sample (drop --greedy), or raise --beams"
        )
    if a.max_time is not None and a.max_time <= 0:
        ap.error(f"--max-time {a.max_time}: give a positive number of seconds")
    model, tok = load(a.checkpoint)
    kw = dict(
        max_new_tokens=a.max_new_tokens,
        temperature=0.0 if a.greedy else a.temperature,
        top_k=a.top_k or None,
        top_p=a.top_p,
        beams=a.beams,
        seed=a.seed,
        num_return_sequences=n,
        max_time=a.max_time,
    )
    noted = False

    def show(prompt: str) -> None:
        """Prompt and each completion, whitespace made visible (numbered when more than one); the legend
        once, on stderr."""
        nonlocal noted
        texts = [prompt + c for c in complete(model, tok, prompt, **kw)]
        for i, text in enumerate(texts, 1):
            shown = visible(text)
            print(f"[{i}] {shown}" if len(texts) > 1 else shown)
            if shown != text and not noted:
                print(WHITESPACE_NOTE, file=sys.stderr)
                noted = True

    if a.prompt is not None:
        show(a.prompt)
        return
    print("prompt> (empty line or Ctrl-D to quit)")
    for line in sys.stdin:
        if not line.strip():
            break
        show(line.rstrip("\n"))
        print("prompt> ", end="", flush=True)


if __name__ == "__main__":
    main()
