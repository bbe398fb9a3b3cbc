"""Layers of `steps/`, read from the source with ast (nothing is imported but in the last test):

- no import cycle among steps modules. An edge is a module-level import, `if TYPE_CHECKING:`
  blocks included (a type-only import is still a dependency of the layer); an import inside a
  function runs when it is called, after both modules are loaded, so it does not count. The edge
  goes to the module named: `from a.b import c` is a.b.c when that is a module, else a.b.
- no two modules import each other even inside a function (a deferred import hides a cycle; it
  does not untie it), but a package and its own submodules (`steps.<pkg>.STAGE` loads lazily).
- only the job runner and the entry points import `steps.tracking` (MLflow), any import counted:
  steps.core.job, the stage modules (those that declare `STAGE`), the report stage's package, the
  UI launcher and the command lines that read a store. Library packages raise steps.core's errors
  and get what they need of MLflow from their stage (`ctx`).
- the report reads every stage's presentation (steps/presentation/) without torch, JAX or transformers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "steps"

TRACKING_ALLOWED = {
    "steps.core.job",  # opens each job's MLflow run and hands it to StageRun
    "steps.core.runcache",  # the run cache: a finished job's run saved, or checked and restored, in its store
    "steps.report.gather",  # the report stage's package: it reads this DAG's runs back from MLflow
    "steps.report.plots",
    "steps.report.render",
    "steps.report.sweep",  # ... a sweep's table links its runs and its saved view
    "steps.ui",  # python -m steps.ui: the lab's MLflow app
    "steps.ui_app",  # ... the app the MLflow server runs for it (mlflow.app entry point)
    "steps.ui_compare",  # ... and its compare page (the lab runs' links: steps.tracking.describe)
    "steps.compare",  # python -m steps.compare: runs of a store side by side (run links: steps.tracking.describe)
    "steps.compare.read",  # ... which reads the store
    "steps.compare.sweep",  # ... and a sweep's runs (run links: steps.tracking.describe)
    "steps.jobserver.cost",  # python -m steps.jobserver.cost: the machine named in its record
    "steps.record.write",  # python -m steps.record: a finished run's dated record, from its store
    "steps.campaign.__main__",  # python -m steps.campaign: opens the campaign's lab run
    "steps.campaign.record",  # python -m steps.campaign.record: a record from a finished run's store
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(STEPS.rglob("*.py"))}


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importer's package
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every import statement of the module."""
    found = []

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, module_level) for t in _targets(child, name, path.name == "__init__.py", known))
            inner = module_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner)

    visit(ast.parse(path.read_text()), True)
    return found


def graph() -> dict[str, dict[str, bool]]:
    """steps module -> {imported module: imported at module level anywhere in it}."""
    mods = modules()
    known = set(mods)
    out = {}
    for name, path in mods.items():
        edges: dict[str, bool] = {}
        for target, module_level in imports(name, path, known):
            edges[target] = edges.get(target, False) or module_level
        out[name] = edges
    return out


def cycles(g: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The module-level import cycles: strongly connected components of more than one module
    (or a module importing itself), Tarjan's algorithm."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, module_level in g[v].items():
            if not module_level or w not in g:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or g[v].get(v):
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(g)))
    for v in g:
        if v not in index:
            strong(v)
    return out


def stage_modules() -> dict[str, str]:
    """Modules that declare `STAGE = ...` at their top level (the stages' entry points) -> the
    stage's name: the module's own, or the one its Stage is given (`Stage.of("steps.minitorch", ...)`)."""
    out = {}
    for name, path in modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "STAGE" for t in node.targets):
                given = node.value.args[0] if isinstance(node.value, ast.Call) and node.value.args else None
                module = given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else name
                out[name] = module.rpartition(".")[2]
    return out


def test_no_import_cycle_among_steps_modules():
    assert cycles(graph()) == []


# the pairs issue 33 named, untied
UNTIED = [
    ("steps.sharding.launch", "steps.sharding.stage"),
    ("steps.minitorch.tensor", "steps.minitorch.tensor_functions"),
    ("steps.core.job", "steps.core.stage"),
]


def mutual_imports(g: dict[str, dict[str, bool]]) -> set[tuple[str, str]]:
    """Pairs of modules that import each other anywhere (module level or inside a function), but a
    package and a module inside it."""

    def inside(module: str, package: str) -> bool:
        return module.startswith(package + ".")

    return {
        (a, b)
        for a, edges in g.items()
        for b in edges
        if a < b and b in g and a in g[b] and not inside(a, b) and not inside(b, a)
    }


@pytest.mark.parametrize("a, b", UNTIED)
def test_the_untied_modules_do_not_import_each_other(a, b):
    g = graph()
    assert {a, b} <= set(g), "a module of the pair is gone: update UNTIED"
    assert (a, b) not in mutual_imports(g)


def test_no_two_modules_import_each_other_even_inside_a_function():
    pending = {tuple(p.values) for p in UNTIED if hasattr(p, "marks")}  # pytest.param: a ParameterSet
    assert mutual_imports(graph()) - pending == set()


def test_only_the_job_runner_and_entry_points_import_tracking():
    allowed = TRACKING_ALLOWED | set(stage_modules())
    offenders = {
        name: sorted(t for t in edges if t == "steps.tracking" or t.startswith("steps.tracking."))
        for name, edges in graph().items()
        if name not in allowed and not name.startswith("steps.tracking")
    }
    assert {name: found for name, found in offenders.items() if found} == {}
    assert TRACKING_ALLOWED <= set(modules()), "a module named in TRACKING_ALLOWED is gone: update the list"


def test_core_does_not_import_torch_jax_or_transformers_at_module_level():
    heavy = ("torch", "jax", "transformers")
    g = graph()
    found = {
        name: sorted(t for t, module_level in g[name].items() if module_level and t.split(".")[0] in heavy)
        for name in g
        if name == "steps.core" or name.startswith("steps.core.")
    }
    assert {name: ts for name, ts in found.items() if ts} == {}


def test_report_reads_every_presentation_without_torch_jax_or_transformers():
    stages = sorted(stage_modules().values())
    assert len(stages) >= 10, stages
    code = (
        "import sys, steps.report\n"
        "from steps.core.stage import presentation\n"
        f"shown = {{s: presentation(s) for s in {stages!r}}}\n"
        "assert all(p.columns or s == 'report' for s, p in shown.items()), shown\n"
        "print(sorted(m for m in ('torch', 'jax', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


# The floors: steps.core (the job runner) stands on steps.tracking (MLflow), which stands on the
# leaves below; neither imports anything above them, and tracking never reaches back up into core
# (issue 48: core.job -> tracking.mlflow_run -> tracking.views -> core.stage was a circle of rooms).
FLOOR_LEAVES = {
    "steps.config",
    "steps.paths",
    "steps.tables",
    "steps.lifeline",
    "steps.presentation",
    "steps.commandline",
}


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "steps" else parts[0]


@pytest.mark.parametrize("room", ["steps.core", "steps.tracking"])
def test_the_floors_import_nothing_above_them(room):
    below = {"steps.tracking": FLOOR_LEAVES, "steps.core": FLOOR_LEAVES | {"steps.tracking"}}[room]
    found = {
        name: sorted(t for t in edges if t.startswith("steps") and _room(t) not in below | {room, "steps"})
        for name, edges in graph().items()
        if _room(name) == room
    }
    assert {name: ts for name, ts in found.items() if ts} == {}
    # the leaves import no room of steps but their own (steps.config's own submodules)
    leaves = {
        name: sorted(t for t in edges if t.startswith("steps.") and _room(t) != _room(name))
        for name, edges in graph().items()
        if _room(name) in FLOOR_LEAVES and not (name.startswith("steps.presentation.") and name.count(".") >= 2)
    }
    assert {name: ts for name, ts in leaves.items() if ts} == {}
