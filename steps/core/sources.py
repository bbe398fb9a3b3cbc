"""The source a stage runs, as one hash: its module plus every `steps` module it imports, transitively.

The stage rules record it as a param (workflow/rules/common.smk: `code`), so Snakemake's params
trigger reruns a stage's jobs when any of that code changes, and only those: editing
steps/models/gpt.py reruns the stages that import it, not word2vec. Snakemake's own code trigger
compares a rule's shell text only, which is the same for every stage.

Imports are read with `ast`, never executed (the Snakefile must not load torch): `import a.b`,
`from a import b` (b as a module where it is one), relative imports, imports inside functions
(they run when called), and string constants that name a steps module exactly (`"steps.x.y"` or
`"steps.x.y:Attr"`: modules a stage starts with `python -m` or loads from a registry). Importing a
module runs its parent packages' `__init__.py`, and `python -m` on a package runs its `__main__.py`:
both count. A module only a config names (components' `extra_modules`) is not followed: a change
of the name reruns (it is in the job's config), an edit of that module does not.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
from pathlib import Path

PACKAGE = "steps"
ROOT = Path(__file__).resolve().parents[2]  # the folder holding the `steps` package
CACHE = ROOT / ".snakemake" / "steps-sources.json"  # ignored by git, beside Snakemake's own state
_NAMED_MODULE = re.compile(rf"{PACKAGE}(\.\w+)+(:\w+)?")


@functools.cache
def module_file(name: str) -> Path | None:
    """The file that defines module `name` (a package: its `__init__.py`), or None (no such module)."""
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _with_parents(name: str) -> list[str]:
    """`a.b.c` -> [a, a.b, a.b.c]: importing a module runs every package above it first."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _from_targets(node: ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    """What `from X import a, b` may load: X, and X.a, X.b (kept where they are modules)."""
    base = node.module or ""
    if node.level:  # relative to the importer's package
        package = importer.split(".") if is_package else importer.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [base] + [f"{base}.{a.name}" for a in node.names]


def parse(name: str, source: bytes, is_package: bool) -> dict:
    """What the hash needs of one module, a function of its text alone (so it is cached on disk):
    `imports`, every module name it names (any import statement, at any depth, or a string constant
    naming a steps module), and `code`, a digest of its syntax tree: an edit of the code or a
    docstring changes it, a comment or a reformatting does not."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.update(_from_targets(node, name, is_package))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAMED_MODULE.fullmatch(node.value):
            found.add(node.value.partition(":")[0])
    return {
        "imports": sorted(m for m in found if m.split(".")[0] == PACKAGE),
        "code": hashlib.sha256(ast.dump(tree).encode()).hexdigest(),
    }


_parsed: list[str] = []  # modules parsed since the cache was last written


@functools.cache
def _cache() -> dict:
    """{"<module>:<sha256 of its bytes>": parse(...)}, kept between Snakemake calls: parsing every
    module each time would cost the Snakefile's parse seconds on a busy machine."""
    try:
        return json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return {}


def _save_cache() -> None:
    """Write the cache atomically when a module was parsed (several Snakemake calls may run at
    once); a read-only checkout just parses again next time."""
    if not _parsed:
        return
    _parsed.clear()
    tmp = CACHE.with_name(f"{CACHE.name}.{os.getpid()}.tmp")
    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(_cache(), sort_keys=True))
        os.replace(tmp, CACHE)
    except OSError:
        tmp.unlink(missing_ok=True)


@functools.cache
def parsed(name: str) -> dict:
    """`parse` of module `name`, from the cache when its bytes are unchanged."""
    path = module_file(name)
    source = path.read_bytes()
    key = f"{name}:{hashlib.sha256(source).hexdigest()}"
    if key not in _cache():
        _cache()[key] = parse(name, source, path.name == "__init__.py")
        _parsed.append(name)
    return _cache()[key]


def direct_imports(name: str) -> frozenset[str]:
    """The existing `steps` modules that module `name` names, with their parent packages."""
    return frozenset(p for m in parsed(name)["imports"] for p in _with_parents(m) if module_file(p))


@functools.cache
def closure(module: str) -> tuple[str, ...]:
    """Every module of this package that `python -m <module>` may run, sorted: the module (a
    package's `__main__` too), its parents, and what they import, transitively."""
    start = set(_with_parents(module))
    if module_file(f"{module}.__main__"):
        start.add(f"{module}.__main__")
    seen: set[str] = set()
    todo = [m for m in start if module_file(m)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(direct_imports(name) - seen)
    return tuple(sorted(seen))


@functools.cache
def source_hash(module: str) -> str:
    """sha256 (16 hex digits) over the names and code digests of `closure(module)`: it changes when
    the code of any module the stage runs changes, or a module joins or leaves its imports."""
    names = closure(module)
    listing = "\n".join(f"{name} {parsed(name)['code']}" for name in names)
    _save_cache()
    return hashlib.sha256(listing.encode()).hexdigest()[:16]
