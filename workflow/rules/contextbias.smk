rule write_contextbias_prompts:
    """The prompt table: one row per prompt with per-model seeds."""
    input:
        bank=get_prompt_bank(),
    output:
        CB_OUT.prompts,
    log:
        "logs/contextbias/write_prompts.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        generators=sorted(CB["generators"]),
        roles=CB_ROLES,
        seeds=CB["seeds"],
        fix_articles=CB["fix_articles"],
    script:
        "../scripts/write_contextbias_prompts.py"


rule extract_contextbias_attributes:
    """Schema-constrained attribute extraction, one JSON line per image."""
    input:
        images=CB_OUT.image_shard,
        checkpoint=get_extractor_checkpoint,
        models_checked=get_extractor_check,
        schema=get_extraction_files()["schema"],
        prompt=get_extraction_files()["prompt"],
    output:
        CB_OUT.extraction,
    log:
        CB_OUT.log("extraction"),
    benchmark:
        CB_OUT.bench("extraction")
    group:
        get_extraction_group
    conda:
        get_extractor_env
    resources:
        gpu=get_extractor_gpu,
        mem_mb=get_extractor_mem_mb,
        batch_size=get_extractor_batch_size,
    params:
        extractor_fingerprint=get_extractor_fingerprint,
        max_attempts=CB["extraction"]["max_attempts"],
        cache_dir=SHARED("cache", kind="vlm") if CB["extraction"]["cache"] else None,
        registry=config["registry"],
    script:
        "../scripts/extract_contextbias_attributes.py"


rule merge_contextbias_model_attributes:
    """One extractor x generator's extraction shards -> its part of the attributes and
    images tables: adding a generator or an extractor merges only its shards."""
    input:
        extractions=get_contextbias_extractions,
        schema=get_extraction_files()["schema"],
    output:
        attributes=CB_OUT("merged", table="attributes_raw"),
        images=CB_OUT("merged", table="images"),
    log:
        "logs/contextbias/merge_attributes/{extractor}/{model}.log",
    benchmark:
        "benchmarks/contextbias/merge_attributes/{extractor}/{model}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/merge_contextbias_attributes.py"


rule merge_contextbias_attributes:
    """Long attributes table (one row per image x dimension x label) and images table:
    the parts, concatenated."""
    input:
        unpack(get_contextbias_merge_parts),
    output:
        attributes=CB_OUT.attributes_raw,
        images=CB_OUT.images,
    log:
        "logs/contextbias/merge_attributes.log",
    benchmark:
        "benchmarks/contextbias/merge_attributes.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/merge_contextbias_attributes.py"


rule canonicalise_contextbias_labels:
    """Open-vocabulary labels -> canonical labels (embedding clusters, optional LLM step,
    reviewed overrides); the attributes table gains canonical_label."""
    input:
        attributes=CB_OUT.attributes_raw,
        checkpoint=get_canonical_llm_checkpoint,
        models_checked=get_model_check(CB["canonicalisation"]["llm"]),
        overrides=get_canonical_overrides,
    output:
        attributes=CB_OUT.attributes,
        mapping=CB_OUT.mapping,
        review=CB_OUT.mapping_review,
    log:
        "logs/contextbias/canonicalise_labels.log",
    benchmark:
        "benchmarks/contextbias/canonicalise_labels.tsv"
    conda:
        "../../envs/extract.yaml"
    params:
        settings=CB["canonicalisation"],
        llm_fingerprint=get_canonical_llm_fingerprint,
        registry=config["registry"],
        cache_dir=SHARED("cache", kind="llm") if CB["extraction"]["cache"] else None,
    script:
        "../scripts/canonicalise_contextbias_labels.py"


rule compute_contextbias_metrics:
    """Bias Intensity, CCS, prompt robustness and the role bootstrap via the CLI."""
    input:
        attributes=CB_OUT.attributes,
        images=CB_OUT.images,
        schema=get_extraction_files()["schema"],
    output:
        bi=CB_OUT("metrics", table="bi"),
        ccs=CB_OUT("metrics", table="ccs"),
        ccs_mean=CB_OUT("metrics", table="ccs_mean"),
        robustness=CB_OUT("metrics", table="robustness"),
        bootstrap=CB_OUT("metrics", table="bootstrap"),
        comparisons=CB_OUT("metrics", table="comparisons"),
        ranks=CB_OUT("metrics", table="ranks"),
    log:
        "logs/contextbias/compute_metrics.log",
    benchmark:
        "benchmarks/contextbias/compute_metrics.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        outdir=get_metrics_dir,
        settings=preset_arg(CB, ("metrics",)),
    shell:
        "stereolens contextbias metrics --attributes {input.attributes}"
        " --images {input.images} --schema {input.schema} --preset {params.settings}"
        " --out {params.outdir} > {log} 2>&1"
