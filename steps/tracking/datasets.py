"""A job's data inputs as MLflow datasets (`log_inputs`), so the runs table's Dataset column and a
run's Datasets tab say which corpus, tokenizer and MCQ splits it read, each with a digest of its bytes.

Which inputs: every `--input NAME=PATH` of the job (the rule's named inputs, `ctx.inputs`) but other
jobs' metrics.json (the report's inputs, a perf cell's baseline). One dataset per split where the
folder has splits: an HF DatasetDict folder (dataset_dict.json) gives one per split directory, a
folder of CSVs one per file (context = split name); anything else (the tokenizer folder, a text file)
is one dataset whose context is the input's name.

digest: sha256 over (relative path, bytes) of every file, first 12 hex digits; past 1 GiB only
(path, size) is hashed, and the profile says so. HF `state.json` is left out: it records the path
the split was saved from, not its content.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

FULL_HASH_LIMIT = 1 << 30
SKIP = {"state.json"}


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(f for f in path.rglob("*") if f.is_file() and f.name not in SKIP)


def digest(path: Path) -> tuple[str, dict]:
    """(12-hex digest, profile) of a file or folder."""
    files = _files(path)
    total = sum(f.stat().st_size for f in files)
    full = total <= FULL_HASH_LIMIT
    h = hashlib.sha256()
    for f in files:
        rel = f.name if path.is_file() else str(f.relative_to(path))
        h.update(rel.encode() + b"\0")
        if full:
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
        else:
            h.update(str(f.stat().st_size).encode())
    profile = {"files": len(files), "bytes": total, "digest_of": "file bytes" if full else "file names and sizes"}
    return h.hexdigest()[:12], profile


def _hf_split(folder: Path) -> tuple[dict | None, dict]:
    """(mlflow colspec schema, rows) of one saved HF split: features from dataset_info.json, rows
    counted over its memory-mapped Arrow shards."""
    import pyarrow as pa  # steps.tracking stays light (every job imports it; mlflow_run's docstring)

    schema, extra = None, {}
    info_file = folder / "dataset_info.json"
    if info_file.exists():
        features = json.loads(info_file.read_text()).get("features") or {}
        cols = [{"name": k, "type": str(v.get("dtype") or "object")} for k, v in features.items()]
        schema = {"mlflow_colspec": cols} if cols else None
    rows = 0
    for shard in sorted(folder.glob("*.arrow")):
        with pa.memory_map(str(shard)) as src:
            rows += sum(batch.num_rows for batch in pa.ipc.open_stream(src))
    extra["num_rows"] = rows
    return schema, extra


def _csv(file: Path) -> tuple[dict, dict]:
    import pandas as pd  # as above

    df = pd.read_csv(file)
    cols = [{"name": str(c), "type": "string" if df[c].dtype == object else str(df[c].dtype)} for c in df.columns]
    return {"mlflow_colspec": cols}, {"num_rows": len(df)}


def parts(name: str, path: Path) -> list[tuple[str, str, Path, dict | None, dict]]:
    """(dataset name, context, path, schema, extra profile) of each dataset an input holds."""
    base = path.name or name
    if path.is_dir() and (path / "dataset_dict.json").exists():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        return [(base, s, path / s, *_hf_split(path / s)) for s in splits if (path / s).is_dir()]
    csvs = sorted(path.glob("*.csv")) if path.is_dir() else []
    if csvs:
        return [(base, f.stem, f, *_csv(f)) for f in csvs]
    return [(base, name, path, None, {})]


def is_dataset_input(path: str) -> bool:
    """Other jobs' records (metrics.json) are dependencies, not data; an input a rule left empty (an
    optional input: `[]` reaches the job as "") names no file (Path("") is the working directory)."""
    return bool(str(path).strip()) and Path(path).name != "metrics.json" and Path(path).exists()


def dataset_inputs(inputs: dict[str, str]) -> list:
    """MLflow DatasetInput entities for a job's data inputs (see the module docstring)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag  # as above
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    out = []
    for name, raw in sorted(inputs.items()):
        if not is_dataset_input(raw):
            continue
        for ds_name, context, path, schema, extra in parts(name, Path(raw)):
            dig, profile = digest(path)
            ds = Dataset(
                name=ds_name,
                digest=dig,
                source_type="local",
                source=json.dumps({"uri": str(path.resolve())}),
                schema=json.dumps(schema) if schema else None,
                profile=json.dumps({**extra, **profile}),
            )
            out.append(DatasetInput(ds, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return out
