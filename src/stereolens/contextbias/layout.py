"""Where ContextBias writes: every path under results/contextbias/ (stereolens.layout)."""

from stereolens.layout import READER_CORRECTION, Layout, extractor_jobs, image_shard

LAYOUT = Layout(
    "contextbias",
    {
        "prompts": "prompts.parquet",
        "image_shard": image_shard("role", "condition"),
        "extraction": "extractions/{extractor}/{model}/{role}/{condition}/{shard}.jsonl",
        "merged": "merged/{extractor}/{model}/{table}.parquet",
        "attributes_raw": "attributes_raw.parquet",
        "images": "images.parquet",
        "attributes": "attributes.parquet",
        "mapping": "canonical_mapping.parquet",
        "mapping_review": "canonical_mapping.csv",
        "metrics": "metrics/{table}.parquet",
        "validation": "validation/{table}.parquet",
        "annotation_form": "annotation/form.html",
        "annotation": "annotation/{table}.parquet",
        **READER_CORRECTION,
    },
    jobs=extractor_jobs("extraction", "extract"),
)
