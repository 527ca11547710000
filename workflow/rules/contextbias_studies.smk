# Extraction validation (paper Table 1, 7) and the human agreement study (Sec. 4.3).
# Validation images use the generation and extraction rules of contextbias.smk with
# condition "VAL".


rule merge_contextbias_validation:
    """Attributes and images tables of the validation prompts."""
    input:
        extractions=get_validation_extractions(),
        schema=get_extraction_files()["schema"],
    output:
        attributes=CB_OUT("validation", table="attributes"),
        images=CB_OUT("validation", table="images"),
    log:
        "logs/contextbias/merge_validation.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/merge_contextbias_attributes.py"


rule score_contextbias_validation:
    """Accuracy, recall, precision and F1 per model and dimension against the truth file."""
    input:
        attributes=CB_OUT("validation", table="attributes"),
        images=CB_OUT("validation", table="images"),
        truth=get_validation_truth(),
    output:
        scores=CB_OUT("validation", table="scores"),
        details=CB_OUT("validation", table="details"),
    log:
        "logs/contextbias/score_validation.log",
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/score_contextbias_validation.py"


rule export_contextbias_annotation:
    """Blinded annotation form (self-contained HTML; answers save to CSV) and its key."""
    input:
        images=CB_OUT.images,
        attributes=CB_OUT.attributes,
    output:
        form=CB_OUT.annotation_form,
        key=CB_OUT("annotation", table="key"),
    log:
        "logs/contextbias/export_annotation.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        settings=CB["annotation"],
        roles=CB["annotation"]["roles"] or CB_ROLES,
        generators=sorted(CB["generators"]),
        conditions=CB_CONDITIONS,
    script:
        "../scripts/export_contextbias_annotation.py"


rule compute_contextbias_agreement:
    """Raw agreement, Cohen's and Fleiss' kappa, and human consensus vs pipeline."""
    input:
        answers=CB["annotation"]["answers"],
        key=CB_OUT("annotation", table="key"),
        attributes=CB_OUT.attributes,
    output:
        summary=CB_OUT("annotation", table="agreement_summary"),
    log:
        "logs/contextbias/compute_agreement.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        replicates=CB["annotation"]["replicates"],
        seed=CB["annotation"]["seed"],
        extractor=CB["extractors"][0],
    script:
        "../scripts/compute_contextbias_agreement.py"


# The extractors audited per demographic group (issue 15).


rule audit_contextbias_extraction_by_group:
    """Extraction validation per group: the demographic the prompt states or the image shows
    (accuracy, precision, F1 with intervals; the largest error gap and a test; the flag
    against the CA-U - CF shift)."""
    input:
        details=CB_OUT("validation", table="details"),
        attributes=CB_OUT("validation", table="attributes"),
        bootstrap=CB_OUT("metrics", table="bootstrap"),
    output:
        by_group=CB_OUT("validation", table="by_group"),
        gaps=CB_OUT("validation", table="group_gaps"),
    log:
        "logs/contextbias/audit_extraction_by_group.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        seed=CB["metrics"]["seed"],
    script:
        "../scripts/audit_contextbias_extraction.py"


rule simulate_contextbias_human_labels:
    """SIMULATED human labels from the extractor's own (contextbias.reader_correction
    .simulate, the embedded default): a stratified sample, a seeded fraction flipped."""
    input:
        attributes=CB_OUT.attributes,
        images=CB_OUT.images,
        schema=get_extraction_files()["schema"],
    output:
        CB_OUT.human_labels_simulated,
    log:
        "logs/contextbias/simulate_human_labels.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        settings=preset_arg(CB, SIMULATE_SETTINGS),
    shell:
        "stereolens contextbias simulate-human-labels --attributes {input.attributes}"
        " --images {input.images} --schema {input.schema} --preset {params.settings}"
        " --out {output} > {log} 2>&1"


rule correct_contextbias_reader:
    """BI per role x condition x dimension, naive and corrected for the extractor's errors
    from the human-label table (docs/statistics.md)."""
    input:
        attributes=CB_OUT.attributes,
        images=CB_OUT.images,
        schema=get_extraction_files()["schema"],
        human=get_contextbias_human_labels,
    output:
        CB_OUT.corrected,
    log:
        "logs/contextbias/correct_reader.log",
    benchmark:
        "benchmarks/contextbias/correct_reader.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        outdir=get_metrics_dir,
        settings=preset_arg(CB, ("metrics", "reader_correction")),
    shell:
        "stereolens contextbias correct --attributes {input.attributes}"
        " --images {input.images} --schema {input.schema} --human {input.human}"
        " --preset {params.settings} --out {params.outdir} > {log} 2>&1"
