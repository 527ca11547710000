"""Where the LVLM audit writes: every path under results/lvlm/ (stereolens.layout)."""

from stereolens.layout import READER_CORRECTION, JobFolder, Layout

LAYOUT = Layout(
    "lvlm",
    {
        "synthetic_faces": "user_images/synthetic",
        "user_images": "user_images.parquet",
        "sets": "sets.parquet",
        "responses": "responses/{model}/{setting}/{task}/{axis}/{usergroup}/{shard}.jsonl",
        "story_attributes": "story_attributes/{model}/{setting}/{axis}.jsonl",
        "term_judgements": "term_judgements/{model}/{setting}/{axis}.parquet",
        "refusals": "refusals/{model}/{setting}.parquet",
        "merged": "merged/{model}/{table}.parquet",
        "table": "{table}.parquet",
        "metrics": "metrics/{table}.parquet",
        "story_readings": "story_reading/readings.jsonl",
        **READER_CORRECTION,
        "reader_sample_story_form": "reader_sample/story/form.html",
        "reader_sample_story_key": "reader_sample/story/key.parquet",
        "reader_sample_term_form": "reader_sample/term/form.html",
        "reader_sample_term_key": "reader_sample/term/key.parquet",
        "reader_sample_template": "reader_sample/human_labels_template.csv",
        "reader_sample_design": "reader_sample/design.parquet",
    },
    jobs={
        "responses": JobFolder("respond"),
        # the folder names the audited model; the timing record, the assistant that read
        "story_attributes": JobFolder("story_attributes"),
    },
)
