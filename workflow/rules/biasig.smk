# BiasIG (paper 000): generation -> VQA of sex, race and age -> answers -> metrics.
# A job covers one model x acquired-attribute type x prompt condition x block of
# prompts (biasig.prompts_per_shard), so job counts stay in the low thousands.
# Generation is the shared rule generate_images (models.smk), with group = acquired
# attribute type and cell = prompt condition.


rule write_biasig_prompts:
    """The configured subset of the 47,040-prompt table."""
    output:
        BG_OUT.prompts,
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
        images=BG_OUT.image_shard,
        checkpoint=get_extractor_checkpoint,
        models_checked=get_extractor_check,
    output:
        BG_OUT.vqa,
    log:
        BG_OUT.log("vqa"),
    benchmark:
        BG_OUT.bench("vqa")
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
        cache_dir=(
            SHARED("cache", kind="vlm") if config["contextbias"]["extraction"]["cache"] else None
        ),
        registry=config["registry"],
    script:
        "../scripts/answer_biasig_vqa.py"


rule merge_biasig_model_answers:
    """One generator's VQA shards -> its part of answers.parquet: adding a generator
    merges only its own shards."""
    input:
        get_biasig_vqa_outputs,
    output:
        BG_OUT.merged,
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
        expand(BG_OUT.merged, model=BG["generators"]),
    output:
        BG_OUT.answers,
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
        answers=BG_OUT.answers,
        prompts=BG_OUT.prompts,
    output:
        implicit=BG_OUT("metrics", table="implicit"),
        explicit=BG_OUT("metrics", table="explicit"),
        eta=BG_OUT("metrics", table="eta"),
        comparisons=BG_OUT("metrics", table="comparisons"),
        ranks=BG_OUT("metrics", table="ranks"),
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


rule simulate_biasig_human_labels:
    """SIMULATED human labels from the VQA reader's own answers (biasig.reader_correction
    .simulate, the embedded default): a stratified sample, a seeded fraction flipped."""
    input:
        answers=BG_OUT.answers,
        prompts=BG_OUT.prompts,
    output:
        BG_OUT.human_labels_simulated,
    log:
        "logs/biasig/simulate_human_labels.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        settings=preset_arg(BG, ("count", "scoring_unit", *SIMULATE_SETTINGS)),
    shell:
        "stereolens biasig simulate-human-labels --answers {input.answers}"
        " --prompts {input.prompts} --preset {params.settings} --out {output} > {log} 2>&1"


rule correct_biasig_reader:
    """Model-level S_imp, S_exp and eta, naive and corrected for the VQA reader's errors
    from the human-label table (docs/statistics.md)."""
    input:
        answers=BG_OUT.answers,
        prompts=BG_OUT.prompts,
        human=get_biasig_human_labels,
    output:
        BG_OUT.corrected,
    log:
        "logs/biasig/correct_reader.log",
    benchmark:
        "benchmarks/biasig/correct_reader.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        outdir=get_metrics_dir,
        settings=preset_arg(BG, ("count", "scoring_unit", "eta_variant", "reader_correction")),
    shell:
        "stereolens biasig correct --answers {input.answers} --prompts {input.prompts}"
        " --human {input.human} --preset {params.settings} --out {params.outdir}"
        " > {log} 2>&1"


rule export_biasig_reader_sample:
    """The human sample of the reader correction, drawn (biasig.reader_sample.export, off
    by default): the blinded form, its key, the human-label template and the allocation
    (docs/statistics.md, "Designing the human sample")."""
    input:
        answers=BG_OUT.answers,
        prompts=BG_OUT.prompts,
    output:
        form=BG_OUT.reader_sample_form,
        key=BG_OUT.reader_sample_key,
        template=BG_OUT.reader_sample_template,
        design=BG_OUT.reader_sample_design,
    log:
        "logs/biasig/export_reader_sample.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        images=get_biasig_images_dir,
        settings=preset_arg(BG, ("count", "scoring_unit", "reader_sample")),
    shell:
        "stereolens biasig reader-sample --answers {input.answers} --prompts {input.prompts}"
        " --images {params.images} --preset {params.settings}"
        " --out $(dirname {output.form}) > {log} 2>&1"
