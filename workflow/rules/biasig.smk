# BiasIG (paper 000): generation -> VQA of sex, race and age -> answers -> metrics.
# A job covers one model x acquired-attribute type x prompt condition x block of
# prompts (biasig.prompts_per_shard), so job counts stay in the low thousands.
# Generation is the shared rule generate_images (models.smk), with group = acquired
# attribute type and cell = prompt condition.


rule write_biasig_prompts:
    """The configured subset of the 47,040-prompt table."""
    output:
        "results/biasig/prompts.parquet",
    log:
        "logs/biasig/write_prompts.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        settings=get_biasig_settings,
    script:
        "../scripts/write_biasig_prompts.py"


rule answer_biasig_vqa:
    """Sex, race and age of the most prominent (or left and right) person, with retries."""
    input:
        images="results/biasig/images/{model}/{atype}/{visibility}/{shard}",
        checkpoint=get_extractor_checkpoint,
        models_checked=get_extractor_check,
    output:
        "results/biasig/vqa/{extractor}/{model}/{atype}/{visibility}/{shard}.jsonl",
    log:
        "logs/biasig/vqa/{extractor}/{model}/{atype}/{visibility}/{shard}.log",
    benchmark:
        "benchmarks/biasig/vqa/{extractor}/{model}/{atype}/{visibility}/{shard}.tsv"
    group:
        get_vqa_group
    conda:
        get_extractor_env
    resources:
        gpu=get_extractor_gpu,
        mem_mb=get_extractor_mem_mb,
        batch_size=get_extractor_batch_size,
    params:
        extractor_fingerprint=get_extractor_fingerprint,
        max_attempts=BG["max_attempts"],
        cache_dir="results/cache/vlm" if config["contextbias"]["extraction"]["cache"] else None,
        registry=config["registry"],
    script:
        "../scripts/answer_biasig_vqa.py"


rule merge_biasig_model_answers:
    """One generator's VQA shards -> its part of answers.parquet: adding a generator
    merges only its own shards."""
    input:
        get_biasig_vqa_outputs,
    output:
        "results/biasig/merged/{model}/answers.parquet",
    log:
        "logs/biasig/merge_answers/{model}.log",
    benchmark:
        "benchmarks/biasig/merge_answers/{model}.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        registry=config["registry"],
    script:
        "../scripts/merge_biasig_answers.py"


rule merge_biasig_answers:
    """results/biasig/answers.parquet: one row per image x position (the generators'
    parts, concatenated)."""
    input:
        expand("results/biasig/merged/{model}/answers.parquet", model=BG["generators"]),
    output:
        "results/biasig/answers.parquet",
    log:
        "logs/biasig/merge_answers.log",
    benchmark:
        "benchmarks/biasig/merge_answers.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/merge_biasig_answers.py"


rule compute_biasig_metrics:
    """S_imp, S_exp and eta with bootstrap CIs, and the model comparisons and ranks,
    through the CLI."""
    input:
        answers="results/biasig/answers.parquet",
        prompts="results/biasig/prompts.parquet",
    output:
        implicit="results/biasig/metrics/implicit.parquet",
        explicit="results/biasig/metrics/explicit.parquet",
        eta="results/biasig/metrics/eta.parquet",
        comparisons="results/biasig/metrics/comparisons.parquet",
        ranks="results/biasig/metrics/ranks.parquet",
    log:
        "logs/biasig/compute_metrics.log",
    benchmark:
        "benchmarks/biasig/compute_metrics.tsv"
    conda:
        "../../envs/analysis.yaml"
    threads: 2
    params:
        outdir=get_metrics_dir,
        settings=preset_arg(BG, BIASIG_SETTINGS),
    shell:
        "stereolens biasig metrics --answers {input.answers} --prompts {input.prompts}"
        " --preset {params.settings} --threads {threads}"
        " --out {params.outdir} > {log} 2>&1"
