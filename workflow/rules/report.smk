# The DAG's final target: one table per stage from this DAG's metrics.json files and MLflow runs.
# Included last, so every stage registered above feeds it. Outputs marked report() also appear in
# `snakemake --report results/report.html`.

rule report:
    input:
        lambda wildcards: [f for stage in STAGES for f in stage_outputs(stage)],
    output:
        index="results/reports/index.md",
        html=report("results/reports/index.html", caption="report.rst", category="Report"),
        plots=report(directory("results/reports/plots"), patterns=["{name}.png"], category="Plots"),
        metrics="results/reports/metrics.json",
    params:
        cfg=lambda wildcards: json.dumps({
            "stage": "report", "cell": "main",
            "common": cell_config(config, "report", "main")["common"],
            "params": {**config.get("report", {}),
                       "stages": [[s, cells(config, s)] for s in STAGES]}}, sort_keys=True),
    log: "results/logs/report/main.log"
    benchmark: "results/benchmarks/report/main.tsv"
    threads: 1
    shell: STAGE_SHELL
