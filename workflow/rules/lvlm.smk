# Guardrail-agnostic LVLM bias (paper 001): user photos -> balanced per-group sets ->
# the audited model answers person-irrelevant tasks -> the assistant reads stories and
# judges term explanations -> refusal labels -> merged tables -> TVD scores.
# Response jobs: one per model x setting x task x axis x group x shard.


rule build_lvlm_synthetic_faces:
    """Embedded default: small drawn faces with arbitrary labels (pipeline tests only)."""
    output:
        directory(LV_OUT.synthetic_faces),
    log:
        "logs/lvlm/build_synthetic_faces.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        per_cell=LV["user_images"]["synthetic_per_cell"],
        seed=LV["seed"],
    script:
        "../scripts/build_lvlm_synthetic_faces.py"


rule export_lvlm_hf_images:
    """A Hugging Face face dataset (default FairFace) written once as PNGs + labels.csv."""
    output:
        directory("resources/lvlm/huggingface"),
    log:
        "logs/lvlm/export_hf_images.log",
    conda:
        "../../envs/lvlm-data.yaml"
    params:
        settings=LV["user_images"],
    script:
        "../scripts/export_lvlm_hf_images.py"


rule draw_lvlm_sets:
    """Per task and axis, balanced user-image sets (non-target labels matched), sharded."""
    input:
        folder=get_lvlm_image_folder(),
    output:
        images=LV_OUT.user_images,
        sets=LV_OUT.sets,
    log:
        "logs/lvlm/draw_sets.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        labels_csv=get_lvlm_labels_csv(),
        draw=get_lvlm_draw_settings,
    script:
        "../scripts/draw_lvlm_sets.py"


rule respond_lvlm:
    """The audited model answers one task for one shard of one group's user images."""
    input:
        sets=LV_OUT.sets,
        prompts=get_lvlm_prompt_file(),
        checkpoint=get_model_checkpoint,
        models_checked=get_models_checked,
    output:
        LV_OUT.responses,
    log:
        LV_OUT.log("responses"),
    benchmark:
        LV_OUT.bench("responses")
    conda:
        get_model_env
    resources:
        gpu=get_model_gpu,
        mem_mb=get_model_mem_mb,
        batch_size=get_model_batch_size,
    params:
        model_fingerprint=get_model_fingerprint,
        task_settings=get_lvlm_task_settings,
        cache_dir=LV_CACHE,
        registry=config["registry"],
    script:
        "../scripts/respond_lvlm.py"


rule extract_lvlm_story_attributes:
    """The assistant reads each story (text only) into the character-attribute schema;
    one job per model x setting x axis, so the assistant loads once for all groups."""
    input:
        responses=get_lvlm_story_responses,
        prompts=get_lvlm_prompt_file(),
        checkpoint=get_lvlm_assistant_checkpoint,
        models_checked=get_model_check(LV["assistant"]),
    output:
        LV_OUT.story_attributes,
    log:
        LV_OUT.log("story_attributes"),
    benchmark:
        LV_OUT.bench("story_attributes")
    conda:
        "../../envs/extract.yaml"
    resources:
        gpu=get_lvlm_assistant_gpu,
        mem_mb=get_lvlm_assistant_mem_mb,
        batch_size=get_lvlm_assistant_batch_size,
    params:
        assistant=LV["assistant"],
        assistant_fingerprint=helper_fingerprint(LV["assistant"]),
        settings=lvlm_params.story_settings(LV),
        cache_dir=LV_CACHE,
        registry=config["registry"],
    script:
        "../scripts/run_lvlm_helper.py"


rule judge_lvlm_terms:
    """The assistant picks the more technical explanation in cross-group pairs."""
    input:
        responses=get_lvlm_term_responses,
        prompts=get_lvlm_prompt_file(),
        checkpoint=get_lvlm_assistant_checkpoint,
        models_checked=get_model_check(LV["assistant"]),
    output:
        LV_OUT.term_judgements,
    log:
        "logs/lvlm/term_judgements/{model}/{setting}/{axis}.log",
    benchmark:
        "benchmarks/lvlm/term_judgements/{model}/{setting}/{axis}.tsv"
    conda:
        "../../envs/extract.yaml"
    resources:
        gpu=get_lvlm_assistant_gpu,
        mem_mb=get_lvlm_assistant_mem_mb,
        batch_size=get_lvlm_assistant_batch_size,
    params:
        assistant=LV["assistant"],
        assistant_fingerprint=helper_fingerprint(LV["assistant"]),
        settings=lvlm_params.judge_settings(LV),
        cache_dir=LV_CACHE,
        registry=config["registry"],
    script:
        "../scripts/run_lvlm_helper.py"


rule label_lvlm_refusals:
    """Refusals of one model and setting: phrase rules, plus the LLM judge if configured."""
    input:
        responses=get_lvlm_setting_responses,
        checkpoint=get_lvlm_judge_checkpoint,
        models_checked=get_model_check(LV["refusal_judge"]),
    output:
        LV_OUT.refusals,
    log:
        "logs/lvlm/refusals/{model}/{setting}.log",
    conda:
        "../../envs/extract.yaml"
    resources:
        gpu=get_lvlm_judge_gpu,
        mem_mb=get_lvlm_judge_mem_mb,
        batch_size=get_lvlm_judge_batch_size,
    params:
        judge=LV["refusal_judge"],
        judge_fingerprint=helper_fingerprint(LV["refusal_judge"]),
        settings=lvlm_params.refusal_settings(LV),
        cache_dir=LV_CACHE,
        registry=config["registry"],
    script:
        "../scripts/run_lvlm_helper.py"


rule merge_lvlm_model_responses:
    """One audited model's part of each merged table (its responses with refusal labels,
    story readings, judgements): adding a model merges only its files."""
    input:
        unpack(get_lvlm_model_merge_inputs),
    output:
        responses=LV_OUT("merged", table="responses"),
        story_attributes=LV_OUT("merged", table="story_attributes"),
        stories=LV_OUT("merged", table="stories"),
        term_judgements=LV_OUT("merged", table="term_judgements"),
    log:
        "logs/lvlm/merge_responses/{model}.log",
    benchmark:
        "benchmarks/lvlm/merge_responses/{model}.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/merge_lvlm_responses.py"


rule merge_lvlm_responses:
    """results/lvlm/{responses,story_attributes,stories,term_judgements}.parquet: the
    models' parts, concatenated."""
    input:
        unpack(get_lvlm_merge_parts),
    output:
        responses=LV_OUT("table", table="responses"),
        story_attributes=LV_OUT("table", table="story_attributes"),
        stories=LV_OUT("table", table="stories"),
        term_judgements=LV_OUT("table", table="term_judgements"),
    log:
        "logs/lvlm/merge_responses.log",
    benchmark:
        "benchmarks/lvlm/merge_responses.tsv"
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/merge_lvlm_responses.py"


rule compute_lvlm_metrics:
    """TVD scores with bootstrap CIs and permutation noise floors, refusal rates, skewed
    story attributes (the CLI; it reads the story attributes and term judgements beside
    the responses)."""
    input:
        responses=LV_OUT("table", table="responses"),
        story_attributes=LV_OUT("table", table="story_attributes"),
        term_judgements=LV_OUT("table", table="term_judgements"),
    output:
        scores=LV_OUT("metrics", table="scores"),
        prompt_scores=LV_OUT("metrics", table="prompt_scores"),
        refusals=LV_OUT("metrics", table="refusals"),
        story_skew=LV_OUT("metrics", table="story_skew"),
        exam_accuracy=LV_OUT("metrics", table="exam_accuracy"),
        comparisons=LV_OUT("metrics", table="comparisons"),
        ranks=LV_OUT("metrics", table="ranks"),
    log:
        "logs/lvlm/compute_metrics.log",
    benchmark:
        "benchmarks/lvlm/compute_metrics.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        outdir=get_metrics_dir,
        settings=preset_arg(LV, ("metrics", "seed")),
    shell:
        "stereolens lvlm metrics --responses {input.responses}"
        " --preset {params.settings} --out {params.outdir} > {log} 2>&1"


rule simulate_lvlm_human_labels:
    """SIMULATED human labels from the assistant's own story attributes and term judgements
    (lvlm.reader_correction.simulate, the embedded default): a stratified sample, a seeded
    fraction flipped."""
    input:
        responses=LV_OUT("table", table="responses"),
        story_attributes=LV_OUT("table", table="story_attributes"),
        term_judgements=LV_OUT("table", table="term_judgements"),
    output:
        LV_OUT.human_labels_simulated,
    log:
        "logs/lvlm/simulate_human_labels.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        settings=preset_arg(LV, SIMULATE_SETTINGS),
    shell:
        "stereolens lvlm simulate-human-labels --responses {input.responses}"
        " --preset {params.settings} --out {output} > {log} 2>&1"


rule correct_lvlm_reader:
    """Story and term scores, naive and corrected for the assistant's errors from the
    human-label table (docs/statistics.md; it reads the story attributes and term
    judgements beside the responses)."""
    input:
        responses=LV_OUT("table", table="responses"),
        story_attributes=LV_OUT("table", table="story_attributes"),
        term_judgements=LV_OUT("table", table="term_judgements"),
        human=get_lvlm_human_labels,
    output:
        LV_OUT.corrected,
    log:
        "logs/lvlm/correct_reader.log",
    benchmark:
        "benchmarks/lvlm/correct_reader.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        outdir=get_metrics_dir,
        settings=preset_arg(LV, ("metrics", "reader_correction")),
    shell:
        "stereolens lvlm correct --responses {input.responses} --human {input.human}"
        " --preset {params.settings} --out {params.outdir} > {log} 2>&1"


rule export_lvlm_reader_sample:
    """The human sample of the reader correction, drawn (lvlm.reader_sample.export, off by
    default): a blinded text form and its key per task (the drawn stories' attributes, the
    drawn judged term pairs), the human-label template and the allocation
    (docs/statistics.md, "Designing the human sample"); each file written atomically."""
    input:
        responses=LV_OUT("table", table="responses"),
        story_attributes=LV_OUT("table", table="story_attributes"),
        term_judgements=LV_OUT("table", table="term_judgements"),
        prompts=get_lvlm_prompt_file(),
    output:
        **get_lvlm_reader_sample_files(),
    log:
        "logs/lvlm/export_reader_sample.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        settings=preset_arg(LV, ("reader_sample",)),
    shell:
        "stereolens lvlm reader-sample --responses {input.responses}"
        " --prompts {input.prompts} --preset {params.settings}"
        " --out $(dirname {output.template}) > {log} 2>&1"
