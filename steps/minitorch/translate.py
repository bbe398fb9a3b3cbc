"""Assignment 2's translation pipeline on the engine: German -> English as a decoder-only LM.

Each pair becomes one sequence `german <sep> english <eos>`; the loss counts the English tokens
only; translation is greedy decoding after `german <sep>`; BLEU is sacrebleu's corpus BLEU against
the references. Data: IWSLT 2017 De->En from the hub (`hf:IWSLT/iwslt2017:iwslt2017-de-en`, fetched
by `python -m steps.prefetch` through configs/hub.yaml) or a local TSV file, `german<TAB>english`
per line. The BPE vocabulary is trained here on the training pairs (HF `tokenizers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from steps.core import InputError, StageRun

if TYPE_CHECKING:
    from steps.minitorch.config import MinitorchTranslate

SPECIALS = ["<pad>", "<sep>", "<eos>"]


def load_pairs(source: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, test) pairs of (german, english)."""
    if source.startswith("hf:"):
        import datasets

        path, _, name = source.removeprefix("hf:").partition(":")
        dd = datasets.load_dataset(path, name or None)
        split = {s: [(r["de"], r["en"]) for r in dd[s]["translation"]] for s in ("train", "test")}
        return split["train"], split["test"]
    path = Path(source)
    if not path.is_file():
        raise InputError(
            f"minitorch.translate.source: {source} is neither hf:<dataset> nor a file; "
            "fix: point it at a TSV of 'german<TAB>english' lines or use hf:IWSLT/iwslt2017:iwslt2017-de-en"
        )
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            de, tab, en = line.partition("\t")
            if not tab or not de.strip() or not en.strip():
                raise InputError(f"{path}:{n}: expected 'german<TAB>english', got {line[:60]!r}")
            pairs.append((de.strip(), en.strip()))
    cut = max(1, len(pairs) // 10)  # the last tenth is the test set
    return pairs[:-cut], pairs[-cut:]


def train_bpe(pairs, vocab_size: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((text for pair in pairs for text in pair), trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    return tok


def encode_pairs(tok, pairs, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, T) inputs and (N, T) targets: english tokens scored, german/padding ignored (-100)."""
    pad, sep, eos = (tok.token_to_id(s) for s in SPECIALS)
    idx = np.full((len(pairs), block_size), pad, dtype=np.int64)
    targets = np.full((len(pairs), block_size), -100, dtype=np.int64)
    for i, (de, en) in enumerate(pairs):
        src, tgt = tok.encode(de).ids, tok.encode(en).ids + [eos]
        seq = (src[: block_size // 2] + [sep] + tgt)[: block_size + 1]
        first_scored = min(len(src), block_size // 2)  # position of <sep>: it predicts english's first token
        n = len(seq) - 1
        idx[i, :n] = seq[:-1]
        targets[i, first_scored:n] = seq[first_scored + 1 :]
    return idx, targets


def greedy(model, tok, german: str, block_size: int, max_new: int) -> str:
    sep, eos = tok.token_to_id("<sep>"), tok.token_to_id("<eos>")
    ids = tok.encode(german).ids[: block_size // 2] + [sep]
    out = []
    for _ in range(max_new):
        logits = model.forward(np.asarray([ids[-block_size:]])).to_numpy()  # (1, T, V)
        nxt = int(logits[0, -1].argmax())
        if nxt == eos:
            break
        out.append(nxt)
        ids.append(nxt)
    return tok.decode(out).strip()


def run_translate(ctx: StageRun, t: MinitorchTranslate, backend: str) -> dict:
    import pandas as pd
    import sacrebleu
    import torch

    from steps import minitorch as mt
    from steps.minitorch.models import DecoderLM
    from steps.models.gpt import GPTLMHeadModel

    train, test = load_pairs(t.source)
    train, test = train[: t.max_pairs], test[: t.test_pairs]
    tok = train_bpe(train, t.vocab_size)
    idx, targets = encode_pairs(tok, train, t.block_size)
    torch.manual_seed(ctx.seed)  # GPT-2's initialisation, taken from our torch GPT
    cfg = t.knobs(vocab_size=tok.get_vocab_size(), dropout=0.0)  # the trained BPE's size
    model = DecoderLM.from_torch(GPTLMHeadModel(cfg).double(), backend)
    opt = mt.AdamW(model.parameters(), lr=t.lr, weight_decay=0.0)
    rng = np.random.default_rng(ctx.seed)
    for step in ctx.progress(range(t.steps), desc="train"):
        rows = rng.integers(0, len(idx), t.batch_size)
        opt.zero_grad()
        loss = model.loss(idx[rows], targets[rows])
        loss.backward()
        opt.step()
        ctx.log_metrics({"train_loss": loss.item()}, step=step)
    hyps = [greedy(model, tok, de, t.block_size, t.max_new_tokens) for de, _ in ctx.progress(test, desc="translate")]
    refs = [en for _, en in test]
    ctx.log_table(
        pd.DataFrame({"german": [de for de, _ in test], "reference": refs, "translation": hyps}), "translations"
    )
    bleu = sacrebleu.corpus_bleu(hyps, [refs])
    return {
        "bleu": bleu.score,
        "train_loss_last": loss.item(),
        "train_pairs": len(train),
        "test_pairs": len(test),
        "vocab_size": tok.get_vocab_size(),
    }
