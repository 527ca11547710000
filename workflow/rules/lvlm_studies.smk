# The assistant's story reading audited per demographic group (issue 15).


rule read_lvlm_story_sample:
    """The assistant reads the labelled story sample (every story once per gender x race
    group), through the audit's own story-reading code."""
    input:
        prompts=get_lvlm_prompt_file(),
        sample=get_story_reading_sample(),
        checkpoint=get_lvlm_assistant_checkpoint,
    output:
        LV_OUT.story_readings,
    log:
        "logs/lvlm/read_story_sample.log",
    benchmark:
        "benchmarks/lvlm/read_story_sample.tsv"
    conda:
        "../../envs/extract.yaml"
    resources:
        gpu=get_lvlm_assistant_gpu,
        mem_mb=get_lvlm_assistant_mem_mb,
        batch_size=get_lvlm_assistant_batch_size,
    params:
        assistant=LV["assistant"],
        assistant_fingerprint=helper_fingerprint(LV["assistant"]),
        settings=lvlm_params.story_sample_settings(LV),
        cache_dir=LV_CACHE,
        registry=config["registry"],
    script:
        "../scripts/read_lvlm_story_sample.py"


rule audit_lvlm_story_reading:
    """The assistant's reading accuracy per group, with the flag against the story TVD."""
    input:
        readings=LV_OUT.story_readings,
        sample=get_story_reading_sample(),
        scores=LV_OUT("metrics", table="scores"),
    output:
        rates=LV_OUT("metrics", table="story_reading"),
        gaps=LV_OUT("metrics", table="story_reading_gaps"),
    log:
        "logs/lvlm/audit_story_reading.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        axes=LV["axes"],
        seed=LV["seed"],
    script:
        "../scripts/audit_lvlm_story_reading.py"
