# Sharding beyond this machine: one job per model × cluster × plan cell (steps/scale/stage.py). A cell
# simulates one rank at full world size on torch's fake process group (nothing big is allocated)
# and runs the analytic and step-time models; one core each, so two cells share the 2 cores.

rule scale:
    input:
        # A cell with `measured: [<sharding cells>]` replays those gloo cells on the fake group and
        # reads what their ranks measured: their metrics.json are its inputs ...
        unpack(lambda wildcards: {c: expand(rules.sharding.output.metrics, cell=c)[0]
                                  for c in cell_params("scale", wildcards).get("measured") or []}),
    output: metrics="results/scale/{cell}/metrics.json"
    params:
        # ... and their resolved plans part of its config.
        **stage_params("steps.scale", cfg=lambda stage, wildcards: json.dumps(
            (cfg := json.loads(job_config(stage, wildcards)))
            | {"params": cfg["params"] | {"sharding_plans": {c: cell_config(config, "sharding", c)["params"]
                                                             for c in cfg["params"].get("measured") or []}}},
            sort_keys=True)),
    log: "results/logs/scale/{cell}.log"
    benchmark: "results/benchmarks/scale/{cell}.tsv"
    threads: 1
    conda: LAB_ENV
    shell: STAGE_SHELL
