"""Install metadata: where the project installs, what CI pins, and that both agree.

Fast checks read pyproject.toml, constraints.txt, README.md, docs/cluster.md and .ci/run; one asks
pip (offline) what `pip install -e .` would change in this environment. The slow ones resolve the whole dependency
tree for Python 3.12 and 3.13 against the package index (a dry run: nothing is installed, and
no multi-GB CUDA wheel is downloaded).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CONSTRAINTS = ROOT / "constraints.txt"
# what CI installs and tests today; moving one of these is a deliberate edit of constraints.txt
CI_PINS = {"torch": "2.13.0", "jax": "0.10.2", "jaxlib": "0.10.2", "triton": "3.7.1"}


def dependencies(extras: bool = True) -> list[Requirement]:
    reqs = [Requirement(r) for r in PYPROJECT["dependencies"]]
    if extras:
        reqs += [Requirement(r) for rs in PYPROJECT.get("optional-dependencies", {}).values() for r in rs]
    return reqs


def constraints() -> dict[str, Requirement]:
    pins = {}
    for n, line in enumerate(CONSTRAINTS.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        assert not line.startswith("-"), f"constraints.txt:{n}: options/editables do not belong here: {line}"
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in pins, f"constraints.txt:{n}: {name} pinned twice"
        pins[name] = req
    return pins


def pinned_version(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==" and "*" not in spec.version, f"not an exact pin: {req}"
    return spec.version


# ---- pyproject ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "python,admitted", [("3.10.14", False), ("3.11.0", True), ("3.12.1", True), ("3.13.9", True), ("3.14.0", False)]
)
def test_requires_python_admits_311_to_313(python, admitted):
    """3.11-3.13 are claimed (3.12/3.13 resolved by the slow tests below); 3.14 is not, untested."""
    spec = SpecifierSet(PYPROJECT["requires-python"])
    assert (python in spec) is admitted, f"requires-python {spec} vs Python {python}"


def test_dependencies_are_ranges_so_an_installed_cuda_torch_is_kept():
    """No exact pin of torch (an environment holding a CUDA build keeps it) or of the JAX/Triton
    stack; torch has a lower bound only."""
    for req in dependencies():
        if canonicalize_name(req.name) in {"torch", "jax", "jaxlib", "triton"}:
            ops = {s.operator for s in req.specifier}
            assert not ops & {"==", "==="}, f"{req} pins exactly: belongs in constraints.txt"
            if req.name == "torch":
                assert ops and ops <= {">=", ">"}, f"torch takes a lower bound only, got {req}"
    names = {canonicalize_name(r.name) for r in dependencies(extras=False)}
    assert {"torch", "jax", "triton"} <= names


def test_triton_only_where_it_ships_and_cuda_jax_as_extras():
    (triton,) = [r for r in dependencies(extras=False) if r.name == "triton"]
    env = default_environment()
    assert triton.marker.evaluate({**env, "platform_system": "Linux", "platform_machine": "x86_64"})
    assert not triton.marker.evaluate({**env, "platform_system": "Darwin", "platform_machine": "arm64"})
    extras = {name: [Requirement(r) for r in rs] for name, rs in PYPROJECT["optional-dependencies"].items()}
    for cuda in ("cuda13", "cuda12"):  # JAX's own extras of those names bring its CUDA plugin; numba-cuda's
        # (cu13/cu12) bring the CUDA runtime miniTorch's cuda backend compiles against
        assert [(r.name, r.extras) for r in extras[cuda]] == [
            ("jax", {cuda}),
            ("numba-cuda", {cuda.replace("uda", "u")}),
        ]


# ---- constraints --------------------------------------------------------------------------------
def test_constraints_pin_exactly_what_ci_tests():
    pins = constraints()
    for name, version in CI_PINS.items():
        assert name in pins, f"constraints.txt does not pin {name}"
        assert pinned_version(pins[name]) == version, f"{pins[name]}: CI tests {name} {version}"
    for req in pins.values():
        pinned_version(req)
    assert canonicalize_name(PYPROJECT["name"]) not in pins, "the project itself is not a constraint"
    # the CPU build on this project's machines carries a local label; ==2.13.0 still matches it
    assert Version("2.13.0+cpu") in pins["torch"].specifier


def test_constraints_satisfy_every_dependency_range():
    """Every direct dependency is pinned, inside its pyproject range (else pip would refuse the
    constraints, or CI would test something pyproject forbids)."""
    pins = constraints()
    for req in dependencies(extras=False):
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is a dependency but constraints.txt does not pin it"
        version = pinned_version(pins[name])
        assert req.specifier.contains(version, prereleases=True), (
            f"constraints.txt pins {name}=={version}, outside pyproject's {req}"
        )


# ---- README and CI use the constraints -----------------------------------------------------------
def _pip_install_lines(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if re.search(r"\bpip install\b.*-e '?\.", line) and not line.lstrip().startswith("#")
    ]


def test_readme_install_and_ci_pass_the_constraints_file():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("<!-- test-command -->", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", setup, flags=re.S)
    assert len(blocks) == 1 and len(blocks[0].strip().splitlines()) == 1, (
        "README's set-up stays one install-and-run command before the test command"
    )
    ci = (ROOT / ".ci" / "run").read_text()
    for where, text in (("README set-up", blocks[0]), (".ci/run", ci)):
        lines = _pip_install_lines(text)
        assert lines, f"{where}: no `pip install ... -e .` line"
        for line in lines:
            assert re.search(r"-c constraints\.txt\b", line), f"{where} installs without the constraints: {line}"


def test_docs_have_the_air_gapped_recipe():
    """The recipe lives in docs/cluster.md, which README links to."""
    readme, cluster = (ROOT / "README.md").read_text(), (ROOT / "docs" / "cluster.md").read_text()
    assert "docs/cluster.md#air-gapped-cluster" in readme and "## Air-gapped cluster" in cluster
    recipe = cluster.split("## Air-gapped cluster", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"pip wheel .*-w wheelhouse .*-c constraints\.txt", recipe), recipe
    assert re.search(r"pip install --no-index --find-links wheelhouse .*-e \.", recipe), recipe


# ---- pip itself -----------------------------------------------------------------------------------
def _pip(*args: str, timeout: int = 300, python: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    if python:
        cmd += ["--python", python]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_pip_install_e_keeps_the_installed_torch(tmp_path):
    """`pip install -e .` in this (installed) environment changes nothing but the project: the
    torch already there is kept. Offline: --no-index, so a range the installed torch (or any
    other installed dependency) does not satisfy fails here instead of downloading. The torch here
    is a CPU build; pip compares versions only, so a CUDA build (2.x.y+cuXXX) is kept the same way."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("needs setuptools in this environment (the project's build backend, offline)")
    report = tmp_path / "report.json"
    proc = _pip(
        "install",
        "--dry-run",
        "--no-index",
        "--no-build-isolation",
        "--report",
        str(report),
        "-e",
        str(ROOT),
        timeout=120,
    )
    assert proc.returncode == 0, f"pip cannot satisfy pyproject from this environment:\n{proc.stderr[-3000:]}"
    would = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert set(would) == {PYPROJECT["name"]}, f"pip would also install/replace: {would}"


# ---- resolves for Python 3.12 and 3.13 (slow: the package index) --------------------------------
PLATFORMS = [f"manylinux_2_{g}_x86_64" for g in range(28, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
# dependencies published as sdists only (pure Python): a resolve for a Python that is not running
# takes wheels only (--only-binary=:all:), so these are built into wheels first. If a new one
# appears, pip's error lists it under "no matching distributions available for your environment".
SDIST_ONLY = ["connection_pool"]


def _index_url() -> str:
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    # pip's default index, whatever its address; asked in a child process: importing pip here
    # switches off setuptools' distutils shim for the whole test session, and a later
    # torch.compile (Inductor imports setuptools) then fails on the stdlib distutils
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def _interpreter(version: str) -> str | None:
    """A real CPython `version` interpreter: on PATH, or a pyenv build (pyenv's shims only work
    for the selected version, so each candidate is asked for its version)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which(f"python{version}")] + sorted(
        str(p) for p in root.glob(f"versions/{version}.*/bin/python{version}")
    )
    for exe in filter(None, candidates):
        try:
            out = subprocess.run(
                [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out == version:
            return exe
    return None


@pytest.fixture(scope="module")
def resolves(tmp_path_factory):
    """Both resolves at once (they wait on the network, not the CPU): version -> (how, proc, report).

    With a real interpreter of that version: `pip --python <it> install --dry-run --ignore-installed`,
    a true resolve (markers evaluated for that Python, sdists' metadata built). Without one:
    `--python-version X --only-binary=:all: --platform manylinux..._x86_64`, which picks wheels for
    that Python but evaluates environment markers on the running one (pypa/pip#11010).
    --use-feature=fast-deps reads each wheel's metadata with HTTP range requests where the index
    serves no separate metadata file (PEP 658), instead of downloading torch and the CUDA wheels."""
    try:
        urllib.request.urlopen(_index_url().rstrip("/") + "/pip/", timeout=15).close()
    except OSError as exc:
        pytest.skip(f"the package index is unreachable here ({exc}); CI reaches it")
    tmp = tmp_path_factory.mktemp("resolve")
    common = [
        "install",
        "--dry-run",
        "--ignore-installed",
        "--use-feature=fast-deps",
        "--timeout",
        "30",
        "--retries",
        "2",
        "--quiet",
    ]
    procs, wheels = {}, None
    for version in ("3.12", "3.13"):
        report = tmp / f"report-{version}.json"
        exe = _interpreter(version)
        if exe:
            how = f"a real Python {version} ({exe})"
            cmd = [sys.executable, "-m", "pip", "--python", exe, *common, "--report", str(report), str(ROOT)]
        else:
            if wheels is None:
                wheels = tmp / "sdist-wheels"
                built = _pip("wheel", "--no-deps", "-w", str(wheels), *SDIST_ONLY)
                assert built.returncode == 0, built.stderr[-3000:]
            how = f"--python-version {version} (no such interpreter here; markers as on this Python)"
            platforms = [a for p in PLATFORMS for a in ("--platform", p)]
            cmd = [
                sys.executable,
                "-m",
                "pip",
                *common,
                "--only-binary=:all:",
                "--python-version",
                version,
                "--implementation",
                "cp",
                *platforms,
                "--find-links",
                str(wheels),
                "--report",
                str(report),
                str(ROOT),
            ]
        procs[version] = (
            how,
            subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
            report,
        )
    out = {}
    for version, (how, proc, report) in procs.items():
        try:
            log, _ = proc.communicate(timeout=540)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
        out[version] = (how, proc.returncode, log, report)
    return out


@pytest.mark.slow
@pytest.mark.live  # waits ~100 s on the package index, a service outside: README's second command
@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_whole_dependency_tree_resolves_for_python(resolves, version):
    how, rc, log, report = resolves[version]
    assert rc == 0, f"no resolve for Python {version} with {how}:\n{log[-5000:]}"
    data = json.loads(report.read_text())
    env = data["environment"]
    if "real Python" in how:
        assert env["python_version"] == version, env
    got = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in data["install"]}
    project = got[canonicalize_name(PYPROJECT["name"])]
    assert f"{version}.0" in SpecifierSet(project["requires_python"])
    for req in dependencies(extras=False):
        # markers: the resolve's own environment, its platform for the cross resolve
        marker_env = (
            {
                **env,
                "python_version": version,
                "platform_machine": "x86_64",
                "sys_platform": "linux",
                "platform_system": "Linux",
            }
            if "real Python" not in how
            else env
        )
        if req.marker and not req.marker.evaluate(marker_env):
            continue
        name = canonicalize_name(req.name)
        assert name in got, f"Python {version} ({how}): {req.name} missing from the resolve"
        assert req.specifier.contains(got[name]["version"], prereleases=True), (name, got[name]["version"])
    for name in ("torch", "jax", "jaxlib"):
        assert name in got, f"Python {version}: {name} not resolved"
    print(
        f"Python {version} via {how}: torch {got['torch']['version']}, jax {got['jax']['version']}, "
        f"triton {got.get('triton', {}).get('version')}, {len(got)} packages"
    )
