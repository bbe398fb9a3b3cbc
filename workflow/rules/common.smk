# Helpers for the rules files (functions only; the rules are in the other .smk files).
#
# A stage is a rule named after its module, `rule <stage>` -> `python -m steps.<stage>` (the stage
# contract, steps/stage.py). Its name is typed once, as the rule's name: its params (stage_params) are bound
# to it after every rules file is read (bind_stage_rules), and a stage module takes its name from
# its own import name. The rule's named input and output paths are passed to the module as
# `--input NAME=PATH` / `--output NAME=PATH` (`ctx.inputs`, `ctx.outputs`): Snakemake is the single
# source of the DAG's paths, and a rule names another rule's file as `rules.<rule>.output.<name>`.
import importlib.util
import os
import shlex
import subprocess

# Every stage rule runs its module the same way; outputs land beside its metrics.json.
STAGE_SHELL = "python -m steps.{params.stage} {params.io} --cfg {params.cfg:q} > {log} 2>&1"

# The software every rule runs with (documents it; `--sdm conda` would build it from this file).
LAB_ENV = str(ROOT / "environment.yml")


class StageParam:
    """A params entry of a stage rule computed from the rule's name (bound by bind_stage_rules)."""

    def __init__(self, fn):
        self.fn, self.stage = fn, None

    def __call__(self, wildcards, input, output):
        return self.fn(self.stage, wildcards, input, output)


def stage_params(cfg=None):
    """params of a stage rule: `stage` (its module, = the rule's name), `cfg` (the job's resolved
    cell config as JSON: a change reruns the job) and `io` (its input/output as arguments)."""
    return {"stage": StageParam(lambda stage, wildcards, input, output: stage),
            "cfg": StageParam(cfg or job_config),
            "io": StageParam(lambda stage, wildcards, input, output: stage_io(input, output))}


def job_config(stage, wildcards, input, output):
    """The job's resolved cell config, plus the cell's own overrides of its stage's section (what
    the cell is: its MLflow run's note, steps/tracking/describe.py)."""
    cell = getattr(wildcards, "cell", "main")
    overrides = (config.get(stage, {}).get("cells") or {}).get(cell) or {}
    return json.dumps({**cell_config(config, stage, cell), "overrides": overrides}, sort_keys=True)


def stage_io(input, output):
    """`--input NAME=PATH ... --output NAME=PATH ...` from the rule's named files (each job's
    metrics output sets its folder)."""
    args = [f"--input {shlex.quote(f'{k}={v}')}" for k, v in input.items()]
    args += [f"--output {shlex.quote(f'{k}={v}')}" for k, v in output.items()]
    return " ".join(args)


def stage_rules():
    """The stage rules in the order they were defined (DAG order)."""
    return [r for r in workflow.rules if isinstance(getattr(r.params, "stage", None), StageParam)]


def bind_stage_rules():
    """Give every stage rule's params its rule's name, and check the module exists (found, not
    imported: importing every stage would load torch and transformers into each Snakemake call)."""
    for r in stage_rules():
        for param in r.params:
            if isinstance(param, StageParam):
                param.stage = r.name
        if importlib.util.find_spec(f"steps.{r.name}") is None:
            raise WorkflowError(f"rule {r.name} runs `python -m steps.{r.name}`, and there is no such "
                                "module: a stage rule is named after its module (steps/stage.py)")


def reported_stages():
    """Stages whose cells the report tabulates: every stage rule but the report's own."""
    return [r.name for r in stage_rules() if r is not rules.report.rule]


def stage_metrics(stage):
    """{"<stage>/<cell>": metrics.json} for the stage's selected cells, from its rule's output."""
    template = getattr(rules, stage).output.metrics
    return {f"{stage}/{cell}": expand(template, cell=cell)[0] for cell in cells(config, stage)}


def report_inputs(wildcards):
    return {name: path for stage in reported_stages() for name, path in stage_metrics(stage).items()}


def report_config(stage, wildcards, input, output):
    return json.dumps({
        "stage": stage, "cell": "main",
        "common": cell_config(config, stage, "main")["common"],
        "params": {**config.get(stage, {}),
                   "stages": [[s, cells(config, s)] for s in reported_stages()]}}, sort_keys=True)


def cell_params(stage, wildcards):
    return cell_config(config, stage, getattr(wildcards, "cell", "main"))["params"]


def job_gpus(per_cell=None):
    """resources.gpu of a stage's jobs: the CUDA devices a job computes on. 0 on a CPU config; else
    `per_cell(the cell's params)` where the stage's rules file gives one (word2vec: 1 for torch,
    0 for gensim and pretrained embeddings; sharding: its devices per node), else 1. Profiles cap
    the total (workstation: `resources: gpu: 1`, so GPU jobs take turns on the card); the SLURM
    executor turns it into --gpus=N. Snakemake passes the rule's name (`rulename`): the stage is
    never typed again here."""
    def gpus(wildcards, rulename):
        if config["device"] == "cpu":
            return 0
        return per_cell(cell_params(rulename, wildcards)) if per_cell else 1
    return gpus


def sharding_gpus(p):
    """A cell's devices per node (torch ranks, or the JAX mesh: steps/parallel/launch.py). One
    needing more than the profile's cap asks for the cap, so the DAG still schedules (Snakemake
    rejects a job asking more than the global limit); the cell then finds fewer GPUs than ranks
    and says so itself."""
    nodes = max(int((p.get("launch") or {}).get("nnodes") or 1), 1)
    need = math.ceil(math.prod((p.get("mesh") or {}).values()) / nodes)
    cap = workflow.global_resources.get("gpu").value
    return min(need, cap) if isinstance(cap, int) else need


def all_cores(wildcards):
    """threads of a job that must run alone (perf): every core of a local run (--cores). A cluster
    run gives no --cores: there the job asks the config's `threads`, and its allocation's cores are
    its own (a profile's set-threads asks more); the job, re-planned on its node (not the main
    process, `--cores all` there), must ask the same or its step exceeds the allocation."""
    cores = workflow.global_resources["_cores"].value if workflow.is_main_process else None
    return cores or config["threads"]


def cell_threads(key):
    """threads of a stage's jobs: the cell's own `key` param, else the config's `threads`."""
    def threads(wildcards, rulename):
        return cell_params(rulename, wildcards)[key] or config["threads"]
    return threads


def word2vec_input(wildcards):
    """Trained cells read a corpus (word2vec.corpus, else prepare_corpus's); pretrained-embedding
    cells only for its vocabulary, when their common analogy questions include it."""
    p = cell_params("word2vec", wildcards)
    if p["backend"] == "pretrained" and "corpus" not in p["common_questions"]:
        return {}
    return {"corpus": p["corpus"] or rules.prepare_corpus.output.data}


def mcq_input(wildcards):
    """The splits a cell reads: mcq_finetune.data (a Kaggle folder), else prepare_mcq's."""
    return {"data": cell_params("mcq_finetune", wildcards)["data"] or rules.prepare_mcq.output.data}


def perf_baseline(wildcards):
    """The cell's baseline's metrics.json (the section's, or its ladder shape's baseline cell)."""
    base = cell_params("perf", wildcards)["baseline_cell"]
    return {} if wildcards.cell == base else {"baseline": expand(rules.perf.output.metrics, cell=base)[0]}


def scale_measured(wildcards):
    """A scale cell's `measured` sharding cells: their metrics.json (rules/scale.smk)."""
    names = cell_params("scale", wildcards).get("measured") or []
    return {c: expand(rules.sharding.output.metrics, cell=c)[0] for c in names}


def scale_config(stage, wildcards, input, output):
    """A scale job's config, plus the resolved plans of the sharding cells it replays."""
    cfg = json.loads(job_config(stage, wildcards, input, output))
    names = cfg["params"].get("measured") or []
    cfg["params"]["sharding_plans"] = {c: cell_config(config, "sharding", c)["params"] for c in names}
    return json.dumps(cfg, sort_keys=True)


LAB_RUN_ENV = "N00BGPT_LAB_RUN"  # = steps.tracking.mlflow_run.LAB_RUN_ENV


def lab_run(action, status="FINISHED", snakemake_log=None):
    """Open (onstart) or close (onsuccess/onerror) this invocation's MLflow lab run
    (steps/tracking/lab.py). Its id reaches every job through the environment: local jobs inherit
    it, and cluster executors pass the submitting shell's environment on."""
    cmd = ["python", "-m", "steps.tracking.lab", action]
    if config["tracking"].get("uri"):
        cmd += ["--uri", config["tracking"]["uri"]]
    if action == "start":
        proc = subprocess.run([*cmd, "--command", shlex.join(["snakemake", *sys.argv[1:]])], input=json.dumps(config, default=str),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise WorkflowError(f"could not open the lab run in the MLflow store:\n{proc.stderr[-3000:]}")
        os.environ[LAB_RUN_ENV] = proc.stdout.split()[-1]
        return
    if not os.environ.get(LAB_RUN_ENV):
        return
    logs = [snakemake_log] if isinstance(snakemake_log, str) else list(snakemake_log or [])  # a list in Snakemake 9
    cmd += ["--status", status] + (["--snakemake-log", str(logs[0])] if logs else [])
    subprocess.run(cmd)
