"""The wheel step: install what this Python lacks from a folder of wheels, offline.

The lent GPU machine has torch, JAX, Triton, transformers, pandas but no snakemake, mlflow or
datasets, and no network: `scripts/missing_wheels.sh` prepares the wheels here (only what the
image lacks). Each wheel whose distribution is already importable is skipped; the rest go, in one
`pip install --no-index --no-deps --target SITE`, into a folder put first on sys.path and on
PYTHONPATH, so this process and every cell's subprocess import them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    """PEP 503 name: `Foo_Bar.baz` -> `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> tuple[str, str]:
    """(distribution, version) from a wheel's file name (PEP 427: name-version-...whl)."""
    parts = path.name.removesuffix(".whl").split("-")
    if len(parts) < 5:
        raise ValueError(f"{path}: not a wheel file name (name-version-[build-]python-abi-platform.whl)")
    return canonical(parts[0]), parts[1]


def installed_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class WheelReport:
    folder: str
    site: str
    installed: list[str] = field(default_factory=list)  # name==version
    skipped: list[str] = field(default_factory=list)  # "name==version (have X)"
    error: str = ""

    def lines(self) -> list[str]:
        if not self.folder:
            return ["wheels: none given (the image must hold every package)"]
        n, k = len(self.installed), len(self.skipped)
        out = [f"wheels from {self.folder}: {n} installed into {self.site}, {k} skipped"]
        out += [f"  installed {w}" for w in self.installed]
        out += [f"  skipped {w}" for w in self.skipped]
        return out + ([f"  FAILED: {self.error}"] if self.error else [])


def add_site(site: Path) -> None:
    """Put `site` first on this process's sys.path and on PYTHONPATH (inherited by subprocesses)."""
    s = str(site.resolve())
    if s not in sys.path:
        sys.path.insert(0, s)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != s]
    os.environ["PYTHONPATH"] = os.pathsep.join([s, *parts])


def install_wheels(folder: str | Path | None, site: str | Path) -> WheelReport:
    """Install the wheels of `folder` that are not already installed into `site` (see module doc)."""
    if not folder:
        return WheelReport("", "")
    folder, site = Path(folder), Path(site)
    if not folder.is_dir():
        raise FileNotFoundError(f"--wheels {folder}: no such folder (make one with scripts/missing_wheels.sh)")
    report = WheelReport(str(folder), str(site))
    site.mkdir(parents=True, exist_ok=True)
    add_site(site)  # what an earlier call installed there counts as installed
    todo = []
    for whl in sorted(folder.glob("*.whl")):
        dist, version = wheel_name(whl)
        have = installed_version(dist)
        if have is not None:
            report.skipped.append(f"{dist}=={version} (have {have})")
        else:
            todo.append(whl)
            report.installed.append(f"{dist}=={version}")
    if todo:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
        proc = subprocess.run([*cmd, *map(str, todo)], capture_output=True, text=True)
        if proc.returncode != 0:
            report.error = (proc.stderr or proc.stdout).strip()[-2000:]
            report.installed = []
    return report
