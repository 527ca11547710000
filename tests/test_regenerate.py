"""stereolens regenerate: which outputs a selection forces (the command runs snakemake
--forcerun on them; tests/test_faults.py runs it for real)."""

import pytest

from stereolens.regenerate import select_outputs, summary_rows

SUMMARY = "\n".join(
    "\t".join(row)
    for row in [
        ("output_file", "date", "rule", "log-file(s)", "status", "plan"),
        ("results/contextbias/images/sdxl/nurse/CF/0", "d", "generate_images", "l", "ok", "no"),
        ("results/contextbias/images/flux/nurse/CF/0", "d", "generate_images", "l", "ok", "no"),
        (
            "results/contextbias/extractions/qwen/sdxl/nurse/CF/0.jsonl",
            "d",
            "extract_contextbias_attributes",
            "l",
            "ok",
            "no",
        ),
        (
            "results/biasig/images/sdxl/occupation/implicit/0",
            "d",
            "generate_images",
            "l",
            "ok",
            "n",
        ),
        (
            "results/lvlm/responses/qwen/image/story/gender/female/0.jsonl",
            "d",
            "respond_lvlm",
            "",
            "",
            "",
        ),
        ("results/contextbias/attributes.parquet", "d", "merge_contextbias_attributes", "", "", ""),
    ]
)


def test_summary_rows_and_selections():
    rows = summary_rows(SUMMARY)
    assert len(rows) == 6 and rows[0] == (
        "results/contextbias/images/sdxl/nurse/CF/0",
        "generate_images",
    )
    # a model, whatever its role: sdxl's generation in both benchmarks and the extraction
    # of its images; never a merged table (it follows as downstream)
    assert select_outputs(rows, models=["sdxl"]) == [
        "results/contextbias/images/sdxl/nurse/CF/0",
        "results/contextbias/extractions/qwen/sdxl/nurse/CF/0.jsonl",
        "results/biasig/images/sdxl/occupation/implicit/0",
    ]
    assert select_outputs(rows, models=["sdxl"], benchmarks=["biasig"]) == [
        "results/biasig/images/sdxl/occupation/implicit/0"
    ]
    # an extractor or audited LVLM is a model too
    assert select_outputs(rows, models=["qwen"]) == [
        "results/contextbias/extractions/qwen/sdxl/nurse/CF/0.jsonl",
        "results/lvlm/responses/qwen/image/story/gender/female/0.jsonl",
    ]
    assert select_outputs(rows, benchmarks=["lvlm"]) == [
        "results/lvlm/responses/qwen/image/story/gender/female/0.jsonl"
    ]
    assert select_outputs(rows, shards=["results/contextbias/images/flux/nurse/CF/0/"]) == [
        "results/contextbias/images/flux/nurse/CF/0"
    ]
    assert select_outputs(rows, rules=["merge_contextbias_attributes"]) == [
        "results/contextbias/attributes.parquet"
    ]
    with pytest.raises(ValueError, match="not an output of this workflow"):
        select_outputs(rows, shards=["results/contextbias/images/nope/x/CF/0"])
