"""steps/sharding's shape: the engine registry covers the config schema, JAX imports go one way
(models -> engine -> entry point, lessons apart) and no module is loaded twice, the launching job
stays torch- and jax-free, one concern a file."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from steps.sharding import engines
from steps.sharding.plan import BACKENDS, PlanError
from tests.conftest import ROOT, clean_env

PARALLEL = ROOT / "steps" / "sharding"
SCHEMA = yaml.safe_load((ROOT / "workflow" / "schemas" / "sharding.schema.yaml").read_text())
SCHEMA_BACKENDS = SCHEMA["properties"]["backend"]["enum"]
SCHEMA_STRATEGIES = SCHEMA["properties"]["strategy"]["enum"]
RANK_METHODS = ("batch", "train_step", "full_state", "reference", "analytic", "comm_mode")


# ---- the engine registry -----------------------------------------------------------------------
def test_every_backend_the_schema_allows_has_a_process_kind():
    assert set(SCHEMA_BACKENDS) == set(BACKENDS) == set(engines.PROCESS)
    assert {engines.process(b) for b in BACKENDS} == {engines.TORCHRUN, engines.JAX}
    with pytest.raises(PlanError, match="unknown"):
        engines.process("mpi")


@pytest.mark.parametrize("backend", SCHEMA_BACKENDS)
@pytest.mark.parametrize("strategy", SCHEMA_STRATEGIES)
def test_every_schema_pair_maps_to_an_engine_or_a_clear_error(backend, strategy):
    try:
        entry = engines.entry(backend, strategy)
    except PlanError as exc:  # names the strategy, what the backend runs, and where to go instead
        msg = str(exc)
        assert f"backend {backend} has no engine for strategy {strategy!r}" in msg
        elsewhere = [b for b in SCHEMA_BACKENDS if b != "jax_lessons" and (b, strategy) in engines.ENGINES]
        assert "(it runs " in msg
        assert ("; use backend " + " or ".join(elsewhere) if elsewhere else "; no backend runs it") in msg
        return
    cls = entry.load()
    methods = RANK_METHODS if entry.process == engines.TORCHRUN else ("run",)
    missing = [m for m in methods if not callable(getattr(cls, m, None))]
    assert not missing, f"{entry.target} lacks {missing}"


def test_the_gaps_are_the_known_ones():
    """Strategies a backend does not run: the error, before any process starts."""
    gaps = {(b, s) for b in SCHEMA_BACKENDS for s in SCHEMA_STRATEGIES if (b, s) not in engines.ENGINES}
    assert gaps == {
        ("torch_scratch", "single"),
        ("torch_scratch", "fsdp_tp"),
        ("torch_scratch", "dp_fsdp_tp"),
        ("torch_scratch", "fsdp_ep"),
        ("torch_native", "single"),
        ("jax_jit", "pp"),
        ("jax_jit", "ep"),  # expert dispatch is shard_map's all_to_all
        ("jax_jit", "fsdp_ep"),
        ("jax_shard_map", "pp"),
        ("jax_shard_map", "fsdp_ep"),
        # PP combined runs on torch's native pipelining only (native/pp_mesh.py)
        *((b, s) for b in ("torch_scratch", "jax_jit", "jax_shard_map") for s in ("pp_dp", "pp_tp", "pp_fsdp")),
        # ZeRO-1/2 are the from-scratch lesson (scratch/zero1.py, zero2.py); natively, FSDP2 is ZeRO-3
        *((b, s) for b in ("torch_native", "jax_jit", "jax_shard_map") for s in ("zero1", "zero2")),
    }
    with pytest.raises(PlanError, match="use backend torch_native or jax_jit or jax_shard_map"):
        engines.entry("torch_scratch", "fsdp_tp")
    with pytest.raises(PlanError, match="use backend torch_scratch or torch_native"):
        engines.entry("jax_jit", "pp")


def test_scratch_builders_match_the_registry():
    from steps.sharding.scratch.engine import BUILDERS

    mlp_engine = "steps.sharding.scratch.engine:ScratchEngine"  # (scratch EP has its own engine, on the MoE)
    assert set(BUILDERS) == {
        s for (b, s), e in engines.ENGINES.items() if b == "torch_scratch" and e.target == mlp_engine
    }


# ---- imports -----------------------------------------------------------------------------------
def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (deferred imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


# models -> engine -> entry point; lessons apart (may use the engine, nothing uses it)
JAX_LAYERS = {
    "specs": 0,
    "toy_mlp": 1,
    "gpt_blocks": 1,
    "moe_blocks": 1,
    "measure": 1,
    "engine": 2,
    "lessons": 3,
    "__main__": 3,
}


def test_jax_imports_go_one_way():
    mods = {p.stem: p for p in (PARALLEL / "jax").glob("*.py") if p.stem != "__init__"}
    assert set(mods) == set(JAX_LAYERS)
    for name, path in mods.items():
        for imp in _imports(path):
            if imp.startswith("steps.sharding.jax."):
                dep = imp.split(".")[3]
                assert dep in JAX_LAYERS and JAX_LAYERS[dep] < JAX_LAYERS[name], f"jax/{name}.py imports {imp}"
    for path in PARALLEL.rglob("*.py"):  # outside jax/, nothing imports it (engines.py names it in strings)
        if "jax" not in path.relative_to(PARALLEL).parts:
            assert not any(i.startswith("steps.sharding.jax") for i in _imports(path)), path


def test_the_launching_side_imports_neither_torch_nor_jax():
    """The stage job, the plan, the registry and the launcher run in the Snakemake job (and the
    plan/registry in the JAX process): jax only after launch.jax_env set its platform, torch only
    where a cell needs it."""
    code = (
        "import sys; import steps.sharding.stage, steps.sharding.engines, steps.sharding.parity, "
        "steps.analytic.costs, steps.sharding.toy_mlp_init; "
        "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=clean_env(), cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


# runs the entry point as `python -m` does, then reports what it left in sys.modules
RUN_ENTRY = """
import json, os, runpy, sys
sys.argv = ["steps.sharding.jax", "--plan", os.environ["PLAN"], "--out", os.environ["OUT"]]
runpy.run_module("steps.sharding.jax", run_name="__main__", alter_sys=True)
files = [os.path.realpath(m.__file__) for n, m in list(sys.modules.items())
         if n.startswith("steps") and getattr(m, "__file__", None)]
print(json.dumps({"modules": sorted(n for n in sys.modules if n.startswith("steps")),
                  "files_loaded_twice": sorted({f for f in files if files.count(f) > 1}),
                  "torch": "torch" in sys.modules}))
"""


@pytest.mark.slow
def test_the_jax_entry_point_is_loaded_once(tmp_path):
    """`python -m steps.sharding.jax` runs a cell and no module imports the entry point back, nor
    any module under a second name (the old jax_mlp.py ran as __main__ and was imported again as
    steps.sharding.jax_mlp by jax_gpt.py and jax_lessons.py)."""
    plan = {
        "backend": "jax_jit",
        "strategy": "dp",
        "mesh": {"dp": 2},
        "steps": 1,
        "batch_size": 4,
        "mlp": {"dim": 4, "hidden": 8, "layers": 2},
        "cross_backend": False,
    }
    env = {
        **clean_env(),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "PLAN": json.dumps(plan),
        "OUT": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUN_ENTRY], capture_output=True, text=True, env=env, cwd=ROOT, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "steps.sharding.jax.engine" in seen["modules"] and "steps.sharding.jax.__main__" not in seen["modules"]
    assert seen["files_loaded_twice"] == []
    assert not seen["torch"]  # no cross_backend: the JAX process stays torch-free
    assert json.loads((tmp_path / "rank0.json").read_text())["dparam"] <= 1e-5


def test_one_concern_a_file():
    sizes = {str(p.relative_to(PARALLEL)): len(p.read_text().splitlines()) for p in PARALLEL.rglob("*.py")}
    assert max(sizes.values()) <= 250, {k: v for k, v in sizes.items() if v > 250}
