rule render_report:
    """Self-contained HTML report (opens from disk)."""
    input:
        unpack(get_report_inputs),
    output:
        report(
            "results/report/index.html",
            caption="../report/caption.rst",
            category="Report",
        ),
    params:
        config=get_report_config(),
    log:
        "logs/report/render_report.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/render_report.py"
