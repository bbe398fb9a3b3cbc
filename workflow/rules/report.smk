# The DAG's final target: one table per stage from this DAG's metrics.json files and MLflow runs.
# Outputs marked report() also appear in `snakemake --report results/report.html`.

rule report:
    input:
        # Every other stage rule's selected cells: their metrics.json, named "<stage>/<cell>".
        unpack(lambda wildcards: {f"{r.name}/{cell}": expand(getattr(rules, r.name).output.metrics, cell=cell)[0]
                                  for r in stage_rules() if r.name != "report" for cell in cells(config, r.name)}),
    output:
        index="results/reports/index.md",
        html=report("results/reports/index.html", caption="report.rst", category="Report"),
        plots=report(directory("results/reports/plots"), patterns=["{name}.png"], category="Plots"),
        metrics="results/reports/metrics.json",
    params:
        # Its config: the report section, and the cells of every stage it tabulates (in DAG order).
        **stage_params("steps.report", cfg=lambda stage, wildcards: json.dumps({
            "stage": stage, "cell": "main",
            "common": cell_config(config, stage, "main")["common"],
            "params": {**config.get(stage, {}),
                       "stages": [[r.name, cells(config, r.name)] for r in stage_rules() if r.name != "report"],
                       # a sweep's cells by value (steps/config/sweep.py): its table and plot
                       **({"sweeps": sweep_plan(config)} if config.get("sweep") else {})}},
            sort_keys=True)),
    log: "results/logs/report/main.log"
    benchmark: "results/benchmarks/report/main.tsv"
    threads: 1
    conda: LAB_ENV
    shell: STAGE_SHELL
