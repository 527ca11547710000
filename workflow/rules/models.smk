rule check_models:
    """The first job of each model. With config check_models.enabled, the model (its
    architecture twin, or with weights: auto its own weights where present) is loaded
    and answers one tiny request; a rejected setting fails the run here, before the
    model's jobs, which all wait for this table. Off, the table says so."""
    input:
        checkpoint=get_model_checkpoint,
    output:
        SHARED.check,
    log:
        "logs/checks/{model}.log",
    conda:
        "../../envs/generate.yaml"
    resources:
        gpu=get_check_gpu,
        mem_mb=get_check_mem_mb,
    params:
        registry=config["registry"],
    script:
        "../scripts/check_models.py"


if check_models_local():

    localrules:
        check_models,


rule build_tiny_model:
    """Build a tiny random-weight checkpoint from code (embedded default)."""
    output:
        directory("resources/models/{checkpoint}"),
    log:
        "logs/models/build_{checkpoint}.log",
    conda:
        "../../envs/generate.yaml"
    params:
        builder=get_tiny_builder,
    shell:
        "HF_HUB_OFFLINE=1 stereolens build-tiny --builder {params.builder} --out {output} > {log} 2>&1"


rule generate_images:
    """Text-to-image generation of every benchmark: one job per model x group x cell x
    shard (ContextBias: role x condition x seed block; BiasIG: acquired-attribute type x
    prompt condition x prompt block), loading the model once. A retry after a failure
    (--retries) asks for more memory and halves the batch size (same images)."""
    input:
        unpack(get_generation_input),
    output:
        directory(GENERATION.image_shard),
    log:
        GENERATION.log("image_shard"),
    benchmark:
        GENERATION.bench("image_shard")
    conda:
        "../../envs/generate.yaml"
    resources:
        gpu=get_model_gpu,
        mem_mb=get_model_mem_mb,
        batch_size=get_model_batch_size,
    params:
        model_fingerprint=get_model_fingerprint,
        settings=get_generation_settings,
        registry=config["registry"],
    script:
        "../scripts/generate_images.py"
