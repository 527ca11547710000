"""Each benchmark's layout (stereolens.layout) owns its output paths: every job output,
target and report path of a run is one of its templates, and parse reads the keys back."""

import pytest

from stereolens.benchmark import benchmarks
from stereolens.config import load_config
from stereolens.contextbias.layout import LAYOUT as CB
from stereolens.lvlm.layout import LAYOUT as LV


@pytest.mark.parametrize("path", ["config/demo.yaml", "config/config.yaml"])
def test_every_job_output_parses_back_to_its_wildcards(path):
    config, _ = load_config(path)
    seen = 0
    for plugin in benchmarks(config):
        layout = plugin.layout
        for job in plugin.jobs(config):
            parsed = layout.parse(job.output)
            assert parsed is not None, job.output
            assert layout.path(parsed.name, **parsed.keys) == job.output
            assert {k: str(v) for k, v in job.wildcards.items() if k in parsed.keys} == {
                k: v for k, v in parsed.keys.items() if k in job.wildcards
            }
            seen += 1
        for target in [*plugin.targets(config), *plugin.report_paths.values()]:
            assert layout.parse(target) is not None, target
    assert seen > 0


def test_parse_and_path():
    out = "results/contextbias/extractions/tiny-vlm/tiny-sd/nurse/CA-R/3.jsonl"
    stage, parsed = CB.job(out)
    assert stage == "extract" and CB.job_model(parsed) == "tiny-vlm"
    assert parsed.keys == {
        "extractor": "tiny-vlm",
        "model": "tiny-sd",
        "role": "nurse",
        "condition": "CA-R",
        "shard": "3",
    }
    assert CB.extraction == (
        "results/contextbias/extractions/{extractor}/{model}/{role}/{condition}/{shard}.jsonl"
    )
    # the most literal template wins; a file of no template, or of another benchmark, is None
    assert CB.parse("results/contextbias/images.parquet").name == "images"
    assert CB.parse("results/contextbias/metrics/bi.parquet").keys == {"table": "bi"}
    assert CB.parse("results/contextbias/extractions/a/b.jsonl") is None
    assert CB.parse("results/biasig/prompts.parquet") is None
    assert LV.parse("results/lvlm/merged/tiny-vlm/stories.parquet").keys == {
        "model": "tiny-vlm",
        "table": "stories",
    }
    with pytest.raises(KeyError, match="needs shard"):
        CB.path("image_shard", model="m", role="r", condition="CF")
    with pytest.raises(AttributeError, match="no path 'nothing'"):
        CB.nothing  # noqa: B018


def test_job_logs_and_names():
    """A model job's log and benchmark file sit at logs|benchmarks/<benchmark>/<stage>/ +
    its template below the folder (what the rules name and the measured throughput reads)."""
    from stereolens.layout import GENERATION, JobFolder, Layout

    assert CB.log("extraction") == (
        "logs/contextbias/extract/{extractor}/{model}/{role}/{condition}/{shard}.log"
    )
    assert LV.bench("responses") == (
        "benchmarks/lvlm/respond/{model}/{setting}/{task}/{axis}/{usergroup}/{shard}.tsv"
    )
    assert GENERATION.log("image_shard") == (
        "logs/{benchmark}/generate/{model}/{group}/{cell}/{shard}.log"
    )
    _, parsed = CB.job("results/contextbias/images/tiny-sd/nurse/CF/0")
    assert CB.job_name(parsed) == "tiny-sd/nurse/CF/0"
    assert CB("merged", table="images") == (
        "results/contextbias/merged/{extractor}/{model}/images.parquet"
    )
    with pytest.raises(ValueError, match="are methods"):
        Layout("x", {"path": "a.parquet"})
    with pytest.raises(ValueError, match="not templates"):
        Layout("x", {"a": "a.parquet"}, jobs={"b": JobFolder("vqa")})
