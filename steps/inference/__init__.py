"""The inference stage: decoding with and without the KV cache, MHA/GQA/MQA, batching, ours vs HF
(`python -m steps.inference`; cells in configs/default.yaml's `inference` section)."""


def __getattr__(name):  # `STAGE` imports the stage (torch, transformers) only when asked for
    if name == "STAGE":
        from steps.inference.stage import STAGE

        return STAGE
    raise AttributeError(name)
