"""Hugging Face hub assets a config names, and whether the local HF cache already holds them.

One list, two users: the Snakefile checks it while planning (a config that needs an asset the cache
lacks stops before any job starts, naming every such asset and the prefetch command), and
`python -m steps.prefetch` downloads it. Where a config can name a hub asset:

  prepare_corpus.source      hf:<path>[:<name>]   datasets.load_dataset      (steps/data/text.py)
  prepare_mcq.source         hf:<path>[:<name>]   datasets.load_dataset      (steps/mcq/hf_sources.py)
  train_tokenizer.pretrained <repo id>            AutoTokenizer              (steps/train_tokenizer.py)
  word2vec[.cells.X].pretrained (backend pretrained) AutoTokenizer + AutoModel (steps/word2vec/pretrained.py)
  mcq_finetune[.cells.X].backbone  AutoTokenizer + AutoConfig + AutoModelForMultipleChoice (steps/mcq/model.py)
  gpt_parity[.cells.X].pretrained  GPT2LMHeadModel   (steps/gpt_parity.py; skipped on a CPU config)

A value is a hub asset when it is none of the offline names (installed packages, `minilm`,
`tiny-deberta`), not a local folder, and has the shape of a repo id. Presence is read from the cache
folders only, never the network: models from the hub cache (HF_HUB_CACHE, default $HF_HOME/hub),
datasets from the prepared Arrow cache that `load_dataset` reads offline (HF_DATASETS_CACHE, default
$HF_HOME/datasets).

Split by concern: assets.py (what a config names), cache.py (what the cache holds), message.py
(the planning check's message and the prefetch command)."""

from steps.hub.assets import Asset, hub_assets, looks_like_repo_id
from steps.hub.cache import datasets_cache_dir, hub_cache_dir, is_cached, missing_assets
from steps.hub.message import check_message, config_layers, key_origin, missing_message, prefetch_command

__all__ = [
    "Asset",
    "check_message",
    "config_layers",
    "datasets_cache_dir",
    "hub_assets",
    "hub_cache_dir",
    "is_cached",
    "key_origin",
    "looks_like_repo_id",
    "missing_assets",
    "missing_message",
    "prefetch_command",
]
