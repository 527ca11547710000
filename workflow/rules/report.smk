rule render_report:
    """Self-contained HTML report (opens from disk)."""
    input:
        prompts="results/contextbias/prompts.parquet",
        images="results/contextbias/images.parquet",
        bi="results/contextbias/metrics/bi.parquet",
    output:
        report(
            "results/report/index.html",
            caption="../report/caption.rst",
            category="Report",
        ),
    params:
        config=config,
    log:
        "logs/report/render_report.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/render_report.py"
