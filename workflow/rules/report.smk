# The DAG's final target: one table per stage from this DAG's metrics.json files and MLflow runs.
# Its inputs are every other stage rule's selected cells (common.smk: report_inputs), named
# "<stage>/<cell>". Outputs marked report() also appear in `snakemake --report results/report.html`.

rule report:
    input: unpack(report_inputs)
    output:
        index="results/reports/index.md",
        html=report("results/reports/index.html", caption="report.rst", category="Report"),
        plots=report(directory("results/reports/plots"), patterns=["{name}.png"], category="Plots"),
        metrics="results/reports/metrics.json",
    params: **stage_params(cfg=report_config)
    log: "results/logs/report/main.log"
    benchmark: "results/benchmarks/report/main.tsv"
    threads: 1
    conda: LAB_ENV
    shell: STAGE_SHELL
