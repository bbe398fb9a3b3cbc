"""train_tokenizer: byte-level BPE (HF `tokenizers`) trained on the train split only.

Saved as a `PreTrainedTokenizerFast`, so `AutoTokenizer.from_pretrained(<the rule's data output>)`
loads it exactly like a hub tokenizer; the GPU config names `gpt2` instead and takes the same path.
"""

from __future__ import annotations

import datasets
from tokenizers import ByteLevelBPETokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from steps.core import InputError, Stage, StageRun
from steps.data.config import TrainTokenizerConfig
from steps.presentation.train_tokenizer import SHOWN

EOS = "<|endoftext|>"


def train_bpe(texts, vocab_size: int, min_frequency: int):
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS], show_progress=False
    )
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS, pad_token=EOS)


def run(ctx: StageRun) -> dict:
    p = TrainTokenizerConfig.of(ctx.params)
    dd = datasets.load_from_disk(ctx.inputs["corpus"])
    if p.pretrained:
        try:
            tok = AutoTokenizer.from_pretrained(p.pretrained)
        except OSError as exc:
            raise InputError(
                f"cannot load tokenizer {p.pretrained!r} ({exc}); offline, set "
                "train_tokenizer.pretrained: null to train one"
            ) from None
        ctx.info["tokenizer"] = p.pretrained
    else:
        tok = train_bpe(dd["train"]["text"], p.vocab_size, p.min_frequency)
        ctx.info["tokenizer"] = f"byte-level BPE {p.vocab_size}"
    tok.save_pretrained(ctx.outputs["data"])
    reloaded = AutoTokenizer.from_pretrained(ctx.outputs["data"])
    metrics = {"vocab_size": len(reloaded)}
    for split, ds in dd.items():
        texts = list(ds["text"])
        n_tok = sum(len(ids) for ids in reloaded(texts)["input_ids"])
        metrics[f"{split}_tokens"] = n_tok
        metrics[f"{split}_chars_per_token"] = sum(map(len, texts)) / max(n_tok, 1)
    return metrics


STAGE = Stage.of(__spec__.name, run, SHOWN)

if __name__ == "__main__":
    STAGE.main()
