"""Fixtures for the GPT tests: a tiny corpus + tokenizer laid out like data.smk's outputs,
tiny model configs, and the stage-config helper. Import explicitly (not via conftest)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

WORDS = ("the king queen lord lady speaks sleeps sword crown night day love death rose "
         "thou thee art hath doth fair foul sweet bitter").split()


def tiny_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + "." for _ in range(n)]


def make_data(root: Path, vocab_size: int = 300) -> Path:
    """results/data/corpus (DatasetDict train/validation, column text) + results/data/tokenizer."""
    import datasets

    from steps.train_tokenizer import train_bpe
    data = root / "results" / "data"
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": tiny_texts(300, 0)}),
                               "validation": datasets.Dataset.from_dict({"text": tiny_texts(30, 1)})})
    dd.save_to_disk(str(data / "corpus"))
    train_bpe(dd["train"]["text"], vocab_size, 2).save_pretrained(str(data / "tokenizer"))
    return root


@pytest.fixture(scope="module")
def gpt_data_dir(tmp_path_factory) -> Path:
    return make_data(tmp_path_factory.mktemp("gpt_data"))


def stage_params(stage: str, **over) -> dict:
    """Schema defaults of a stage's section with `over` merged in (as cell_config would)."""
    from steps.config import validate_config
    cfg = validate_config({stage: over})
    return {k: v for k, v in cfg[stage].items() if k not in ("cells", "select")}


TINY_TRAIN = {"model": {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32},
              "batch_size": 4, "max_steps": 6, "warmup_steps": 2, "eval_interval": 3,
              "eval_batches": 2, "ckpt_interval": 1,
              "samples": {"prompts": ["the king"], "max_new_tokens": 8, "num_beams": 2},
              "bench": {"enabled": False}}
