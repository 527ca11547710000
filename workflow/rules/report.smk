# The report: results/report/index.html with figures/, tables/ and galleries/ beside it.
# `snakemake --report report.zip` also gets every figure and table (report() below).


rule collect_job_timings:
    """Model-load time, time per item, wall time and peak memory of every model job
    (stereolens.throughput), from the outputs of those jobs and the timing records,
    benchmark files and logs each job writes beside them."""
    input:
        unpack(get_job_timing_inputs),
    output:
        REPORT.job_timings,
    log:
        "logs/report/collect_job_timings.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/collect_job_timings.py"


rule render_report:
    """The report: summary first, one section per benchmark, galleries, the run's models,
    throughput and settings. Opens from disk (no server)."""
    input:
        unpack(get_report_inputs),
    output:
        index=report(
            REPORT.index,
            caption="../report/caption.rst",
            category="Report",
            labels={"file": "index.html"},
        ),
        figures=report(
            directory(REPORT.figures),
            patterns=["{name}.png"],
            caption="../report/figure.rst",
            category="Figures",
            labels={"figure": "{name}"},
        ),
        tables=report(
            directory(REPORT.tables),
            patterns=["{name}.csv"],
            caption="../report/table.rst",
            category="Tables",
            labels={"table": "{name}"},
        ),
        galleries=directory(REPORT.galleries),
    log:
        "logs/report/render_report.log",
    benchmark:
        "benchmarks/report/render_report.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        config=get_report_config(),
        models=get_report_models(),
        # thumbnails kept between runs, keyed by image hash: a rebuild encodes new ones only
        thumbnail_cache=SHARED("cache", kind="thumbnails"),
    script:
        "../scripts/render_report.py"
