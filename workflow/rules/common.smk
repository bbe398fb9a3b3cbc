# What several rules files share: the stage rules' shell command and params, the job's config and
# paths as arguments, per-job GPUs and threads, and this invocation's MLflow lab run.
#
# A stage's rule names the module it runs
#     params: **stage_params("steps.<stage>")
# and carries its stage's name (the module takes its name from its own import name, steps/core/stage.py).
# The rule's named input and output paths are passed to the module as `--input NAME=PATH` /
# `--output NAME=PATH` (`ctx.inputs`, `ctx.outputs`): Snakemake is the single source of the DAG's
# paths, and a rule names another rule's file as `rules.<rule>.output.<name>`. What is one stage's
# own (its input functions, its config extras) is written in its rule, as lambdas: Snakemake's
# --lint wants no function definitions in a file of rules.
import importlib.util
import os
import shlex
import shutil
import subprocess
import tempfile

from steps import jobserver
from steps.core import runcache
from steps.config.sweep import sweep_of, sweep_plan
from steps.core.sources import source_hash
from steps.tracking.outputs import BrokenStore, set_aside

# Every stage rule runs its module the same way; outputs land beside its metrics.json. The run cache
# goes first (steps/core/runcache.py): it restores a job run before and exits 0, or exits 1 and the
# job runs (and saves its entry when it ends ok or skipped).
STAGE_SHELL = ("python -m steps.core.runcache {params.stage} {params.io} --cfg {params.cfg:q} > {log} 2>&1"
               " || python -m steps.{params.stage} {params.io} --cfg {params.cfg:q} >> {log} 2>&1")

# The run cache's folder (or "off") reaches the jobs in the environment, like the lab run's id: the
# knobs `cache` and `cache_dir` are in no job's config (steps/config: RUN_CACHE_KEYS), so changing them
# reruns no job. A folder relative to the workdir is made absolute.
os.environ[runcache.ENV] = runcache.location(config)

# The software every rule runs with (documents it; `--sdm conda` would build it from this file).
LAB_ENV = str(ROOT / "environment.yml")


def stage_params(module, cfg=None):
    """params of the stage rule that runs `python -m <module>`; `stage` (the module's stage name),
    `cfg` (the job's resolved cell config as JSON, `cfg(stage, wildcards)`, default job_config),
    `code` (a hash of the module and every steps module it imports, steps/core/sources.py) and `io`
    (its input/output as arguments). `cfg` and `code` are functions of the wildcards alone, so
    Snakemake records them and its params trigger reruns the job when either changes (configs/
    README.md, "When a job reruns"); `io` needs the job's paths, which the input trigger tracks. The
    module is found, not imported (importing every stage would load torch into each Snakemake call)."""
    stage = module.removeprefix("steps.")
    if stage == module or importlib.util.find_spec(module) is None:
        raise WorkflowError(f"a stage rule runs `python -m {module}`, and there is no such module; "
                            "name a stage module, steps.<stage> (steps/<stage>.py or steps/<stage>/)")
    cfg = cfg or job_config
    return {"stage": stage,
            "cfg": lambda wildcards: cfg(stage, wildcards),
            "code": lambda wildcards: source_hash(module),
            "io": lambda wildcards, input, output: stage_io(input, output)}


def stage_rules():
    """The stage rules (those with stage_params), in the order they were defined: DAG order."""
    return [r for r in workflow.rules if hasattr(r.params, "stage")]


def job_config(stage, wildcards):
    """The job's resolved cell config, plus the cell's own overrides of its stage's section (what
    the cell is: its MLflow run's note, steps/tracking/describe.py); a sweep's cell, its sweep (the run's
    tags, steps/config/sweep.py: only there, so no other job's config changes)."""
    cell = getattr(wildcards, "cell", "main")
    overrides = (config.get(stage, {}).get("cells") or {}).get(cell) or {}
    sweep = {"sweep": tags} if (tags := sweep_of(config, stage, cell)) else {}
    return json.dumps({**cell_config(config, stage, cell), "overrides": overrides, **sweep}, sort_keys=True)


def stage_io(input, output):
    """`--input NAME=PATH ... --output NAME=PATH ...` from the rule's named files (each job's
    metrics output sets its folder)."""
    args = [f"--input {shlex.quote(f'{k}={v}')}" for k, v in input.items()]
    args += [f"--output {shlex.quote(f'{k}={v}')}" for k, v in output.items()]
    return " ".join(args)


def cell_params(stage, wildcards):
    """The resolved params of the job's cell (`main` for a rule without a cell wildcard)."""
    return cell_config(config, stage, getattr(wildcards, "cell", "main"))["params"]


def job_gpus(per_cell=None):
    """resources.gpu of a stage's jobs: the CUDA devices a job computes on. 0 on a CPU config; else
    `per_cell(the cell's params)` where the stage's rules file gives one (word2vec: 1 for torch,
    0 for gensim and pretrained embeddings; sharding: its devices per node), else 1. Profiles cap
    the total (workstation: `resources: gpu: 1`, so GPU jobs take turns on the card); a cell needing
    more than the cap asks for the cap, so the DAG still schedules (Snakemake rejects a job asking
    more than the global limit), and the cell finds fewer GPUs than it needs and says so itself.
    The SLURM executor turns it into --gpus=N. Snakemake passes the rule's name (`rulename`), its
    stage."""
    def gpus(wildcards, rulename):
        if config["device"] == "cpu":
            return 0
        if per_cell is None:
            return 1
        need, cap = per_cell(cell_params(rulename, wildcards)), workflow.global_resources.get("gpu").value
        return min(need, cap) if isinstance(cap, int) else need
    return gpus


def cell_threads(key):
    """threads of a stage's jobs: the cell's own `key` param, else the config's `threads`."""
    def threads(wildcards, rulename):
        return cell_params(rulename, wildcards)[key] or config["threads"]
    return threads


def set_aside_broken_results():
    """Before Snakemake plans: every selected job's metrics.json that cannot be trusted (unreadable,
    not JSON, no run id, or its run not in the local store) is moved aside with one line saying so,
    and so is the report built from it: Snakemake redoes the job, what consumes it, and the report
    (steps/tracking/outputs.py). A dry run (`-n`: the Snakefile is read before Snakemake knows its
    executor, so the CLI's output settings tell) moves nothing and says what a real run would redo."""
    files = [expand(getattr(rules, r.name).output.metrics, cell=cell)[0] for r in stage_rules()
             for cell in (cells(config, r.name) if r.name != "report" else ["main"])]
    dry_run = bool(getattr(workflow.output_settings, "dryrun", False)) or workflow.dryrun
    try:
        lines = set_aside(files, config["tracking"].get("uri"), rules.report.output.index, dry_run=dry_run)
    except (BrokenStore, OSError) as exc:
        raise WorkflowError(str(exc)) from None
    for line in lines:
        print(line, file=sys.stderr)


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


JOB_SERVER_READY_S = 60  # onstart waits this long at most for the server to listen (its imports: ~5 s)


def _wait_listening(proc, sock, log):
    """Until the server listens, it exits, or JOB_SERVER_READY_S: then the jobs (and the lab run) that
    find no socket run in their own processes, as before, and one line says why."""
    if (why := jobserver.wait_listening(proc, sock, JOB_SERVER_READY_S)) is None:
        return
    with open(log) as f:
        last = (f.read().strip().splitlines() or [""])[-1]
    print(f"job server: {why}{f' ({last})' if last else ''}; jobs run in their own processes until it listens",
          file=sys.stderr)


def job_server(action):
    """Start (onstart) or stop (onsuccess/onerror) this invocation's job server (steps/jobserver/):
    jobs forked from one process with MLflow and torch loaded, on a local run only; a cluster's jobs
    start on their own. `N00BGPT_JOBSERVER=off` turns it off. Its socket reaches the jobs in the
    environment; a job that finds no server runs in its own process, as before. Started before the
    lab run opens, and waited for until it listens: the lab run's start and end (MLflow's imports,
    twice) and the DAG's first jobs fork from it too, so it pays for itself from one job on."""
    global _job_server
    if action == "start":
        if os.environ.get(jobserver.SOCKET_ENV) == "off" or not workflow.local_exec or workflow.dryrun:
            return
        if not any(job.rule.shellcmd for job in workflow.dag.needrun_jobs()):
            return  # no stage job to run
        folder = tempfile.mkdtemp(prefix="n00bgpt-jobs-")
        sock = os.path.join(folder, "socket")
        log_file = open(os.path.join(folder, "server.log"), "w")
        _job_server = (subprocess.Popen([sys.executable, "-m", "steps.jobserver", sock], stdout=log_file,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), folder)
        os.environ[jobserver.SOCKET_ENV] = sock
        _wait_listening(_job_server[0], sock, log_file.name)
        return
    if not globals().get("_job_server"):
        return
    proc, folder = _job_server
    _job_server = None
    os.environ.pop(jobserver.SOCKET_ENV, None)
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(folder, ignore_errors=True)
