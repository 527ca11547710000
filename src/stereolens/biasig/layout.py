"""Where BiasIG writes: every path under results/biasig/ (stereolens.layout)."""

from stereolens.layout import READER_CORRECTION, Layout, extractor_jobs, image_shard

LAYOUT = Layout(
    "biasig",
    {
        "prompts": "prompts.parquet",
        "image_shard": image_shard("atype", "visibility"),
        "vqa": "vqa/{extractor}/{model}/{atype}/{visibility}/{shard}.jsonl",
        "merged": "merged/{model}/answers.parquet",
        "answers": "answers.parquet",
        "metrics": "metrics/{table}.parquet",
        **READER_CORRECTION,
        "reader_sample_form": "reader_sample/form.html",
        "reader_sample_key": "reader_sample/key.parquet",
        "reader_sample_template": "reader_sample/human_labels_template.csv",
        "reader_sample_design": "reader_sample/design.parquet",
    },
    jobs=extractor_jobs("vqa", "vqa"),
)
