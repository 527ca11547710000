# MyBench: one answer job per model, then the scores. Included by the Snakefile from the
# plug-in's rules; script: and conda: paths are relative to this file, in the package.


rule answer_mybench:
    """One model's answers to every question."""
    input:
        checkpoint=get_model_checkpoint,
        models_checked=get_models_checked,
    output:
        "results/mybench/vqa/{model}/answers.jsonl",
    log:
        "logs/mybench/vqa/{model}/answers.log",
    benchmark:
        "benchmarks/mybench/vqa/{model}/answers.tsv"
    conda:
        "../envs/mybench.yaml"
    resources:
        gpu=get_model_gpu,
        mem_mb=get_model_mem_mb,
        batch_size=get_model_batch_size,
    params:
        fingerprint=get_model_fingerprint,
        questions=config["mybench"]["questions"],
        registry=config["registry"],
        cache_dir=None,
    script:
        "../scripts/answer_mybench.py"


rule score_mybench:
    """One row per model."""
    input:
        expand(
            "results/mybench/vqa/{model}/answers.jsonl",
            model=config["mybench"]["models"],
        ),
    output:
        "results/mybench/metrics/scores.parquet",
    log:
        "logs/mybench/score.log",
    conda:
        "../envs/mybench.yaml"
    shell:
        "stereolens mybench score {input} --out {output} > {log} 2>&1"
