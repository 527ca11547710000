rule build_tiny_model:
    """Build a tiny random-weight checkpoint from code (embedded default)."""
    output:
        directory("resources/models/{checkpoint}"),
    params:
        builder=get_tiny_builder,
    log:
        "logs/models/build_{checkpoint}.log",
    conda:
        "../../envs/generate.yaml"
    shell:
        "HF_HUB_OFFLINE=1 stereolens build-tiny --builder {params.builder} --out {output} > {log} 2>&1"
