"""Measured throughput (stereolens.throughput) from hand-made timing files, job records,
job logs and Snakemake benchmark files, with hand-computed expected numbers."""

import copy
import json
from pathlib import Path

import polars as pl
import pytest

from stereolens.config import validate_report_config
from stereolens.throughput import (
    SUMMARY_COLUMNS,
    collect_job_outputs,
    collect_jobs,
    measured_throughput,
)

BENCH_HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _config(sections: dict) -> dict:
    """A config as throughput gets one: validated, the schema's defaults filled."""
    return validate_report_config(copy.deepcopy(sections))


SECTIONS = {
    "contextbias": {"generators": ["tiny-sd"], "extractors": ["tiny-vlm"]},
    "biasig": {"enabled": True, "generators": ["tiny-sd"], "vqa": "tiny-vlm"},
}
CONFIG = _config(SECTIONS)
TABLE = {
    "gpu": "test GPU",
    "entries": {
        "tiny-sd": {"seconds_per_image": 0.5, "status": "measured", "source": "test"},
        "tiny-vlm": {"seconds_per_call": 0.25, "status": "estimate", "source": "test"},
    },
}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _timing(path: Path, load: float | None, per_image: dict) -> None:
    _write(
        path / "timing.json",
        json.dumps(
            {
                "model": path.parts[-4],
                "images": len(per_image),
                "load_seconds": load,
                "seconds_per_image": per_image,
            }
        ),
    )


def _bench(path: Path, s: str, max_rss: str) -> None:
    _write(path, BENCH_HEADER + f"{s}\t0:00:10\t{max_rss}\t1\t1\t1\t0\t0\t50\t1\n")


def _jsonl(path: Path, records: list[dict]) -> None:
    _write(path, "".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    """A run's results/, benchmarks/ and logs/ with:

    generate/contextbias/tiny-sd: job CF (load 3 s, images 0.5 s + 1.5 s, wall 10 s,
      rss 500 MB) and job CA-R (load 5 s, images 1 s + 1 s, wall 14 s, rss 700.5 MB)
      -> 2 jobs, 4 items, load 8 s total / 4 s mean, 4 s / 4 items = 1 s per item,
      3600 per hour, wall 24 s / 4 = 6 s per item, peak 700.5 MB, planned 0.5 -> 2.0.
    extract/contextbias/tiny-vlm: job CF (3 images: 0.2 s, 0.4 s over two attempts, one
      answered from the cache; load from the log's last line 2.5 s; wall 12 s, rss 1000)
      and job CA-R (1 image 0.9 s; load 1.5 s in the records; no benchmark file)
      -> 2 jobs, 4 items, load 4 s / 2 s, (0.6 + 0.9) s / 3 model-called items = 0.5 s,
      7200 per hour, wall 12 s / 3 items = 4 s, peak 1000 MB, planned 0.25 -> 2.0.
    vqa/biasig/tiny-vlm: one job, 2 images (3 rows: one image has two positions), no
      per-item time, load 4 s from the log, wall 8 s, max_rss NA
      -> 1 job, 2 items, load 4 / 4, s_per_item empty, wall 4 s per item, rss empty.
    Ignored: a .partial folder, and a model the config does not list (old-model).
    """
    res, bench, logs = tmp_path / "results", tmp_path / "benchmarks", tmp_path / "logs"
    img = res / "contextbias/images/tiny-sd/nurse"
    _timing(img / "CF/0", 3.0, {"a": 0.5, "b": 1.5})
    _timing(img / "CA-R/0", 5.0, {"c": 1.0, "d": 1.0})
    _timing(img / "CA-U/0.partial", 100.0, {"e": 100.0})
    _timing(res / "contextbias/images/old-model/nurse/CF/0", 1.0, {"f": 1.0})
    _bench(bench / "contextbias/generate/tiny-sd/nurse/CF/0.tsv", "10.0", "500")
    _bench(bench / "contextbias/generate/tiny-sd/nurse/CA-R/0.tsv", "14.0", "700.5")

    ext = res / "contextbias/extractions/tiny-vlm/tiny-sd/nurse"
    uncached, cached = {"cached": False}, {"cached": True}
    _jsonl(
        ext / "CF/0.jsonl",
        [
            {"image_id": "a", "seconds": 0.2, "attempt_log": [uncached]},
            {"image_id": "b", "seconds": 0.4, "attempt_log": [uncached, uncached]},
            {"image_id": "x", "seconds": 0.0, "attempt_log": [cached]},
        ],
    )
    _write(
        logs / "contextbias/extract/tiny-vlm/tiny-sd/nurse/CF/0.log",
        "2026 INFO x: tiny-vlm loaded in 9.9 s; 3 images\n"
        "2026 INFO x: tiny-vlm loaded in 2.5 s; 3 images\n",
    )
    _bench(bench / "contextbias/extract/tiny-vlm/tiny-sd/nurse/CF/0.tsv", "12.0", "1000")
    _jsonl(
        ext / "CA-R/0.jsonl",
        [{"image_id": "c", "seconds": 0.9, "load_seconds": 1.5, "attempt_log": [uncached]}],
    )

    vqa = "tiny-vlm/tiny-sd/Nurse/implicit/0"
    _jsonl(
        res / f"biasig/vqa/{vqa}.jsonl",
        [
            {"image_id": "i1", "position": "left"},
            {"image_id": "i1", "position": "right"},
            {"image_id": "i2", "position": "single"},
        ],
    )
    _write(logs / f"biasig/vqa/{vqa}.log", "INFO tiny-vlm loaded in 4.0 s; 2 images\n")
    _bench(bench / f"biasig/vqa/{vqa}.tsv", "8.0", "NA")
    return tmp_path


def _row(summary: pl.DataFrame, stage: str, model: str) -> dict:
    rows = summary.filter((pl.col("stage") == stage) & (pl.col("model") == model)).to_dicts()
    assert len(rows) == 1, summary
    return rows[0]


def test_collect_jobs_one_row_per_finished_job(run_dir):
    jobs = collect_jobs(run_dir / "results")
    assert sorted(zip(jobs["stage"], jobs["job"], strict=True)) == [
        ("extract", "tiny-vlm/tiny-sd/nurse/CA-R/0"),
        ("extract", "tiny-vlm/tiny-sd/nurse/CF/0"),
        ("generate", "old-model/nurse/CF/0"),
        ("generate", "tiny-sd/nurse/CA-R/0"),
        ("generate", "tiny-sd/nurse/CF/0"),
        ("vqa", "tiny-vlm/tiny-sd/Nurse/implicit/0"),
    ]


def test_collect_job_outputs_reads_only_the_named_jobs(run_dir):
    res = run_dir / "results"
    named = [
        res / "contextbias/images/tiny-sd/nurse/CF/0",
        res / "contextbias/images/tiny-sd/nurse/CA-U/0",  # not made (yet): no row
        res / "contextbias/extractions/tiny-vlm/tiny-sd/nurse/CF/0.jsonl",
        res / "biasig/vqa/tiny-vlm/tiny-sd/Nurse/implicit/0.jsonl",
    ]
    jobs = collect_job_outputs(named, res)
    every = collect_jobs(res)
    assert sorted(jobs["job"]) == [
        "tiny-sd/nurse/CF/0",
        "tiny-vlm/tiny-sd/Nurse/implicit/0",
        "tiny-vlm/tiny-sd/nurse/CF/0",
    ]
    assert jobs.sort("job").equals(
        every.filter(pl.col("job").is_in(jobs["job"].implode())).sort("job")
    )
    with pytest.raises(ValueError, match="not a job output"):
        collect_job_outputs([res / "contextbias/prompts.parquet"], res)


def test_measured_throughput_hand_computed(run_dir):
    summary = measured_throughput(run_dir / "results", config=CONFIG, throughput_table=TABLE)
    assert summary.columns == SUMMARY_COLUMNS
    assert summary.select("stage", "benchmark", "model").rows() == [
        ("generate", "contextbias", "tiny-sd"),
        ("extract", "contextbias", "tiny-vlm"),
        ("vqa", "biasig", "tiny-vlm"),
    ]
    gen = _row(summary, "generate", "tiny-sd")
    assert gen == pytest.approx(
        {
            "stage": "generate",
            "benchmark": "contextbias",
            "model": "tiny-sd",
            "jobs": 2,
            "items": 4,
            "load_s_total": 8.0,
            "load_s_mean": 4.0,
            "s_per_item": 1.0,
            "items_per_hour": 3600.0,
            "wall_s_per_item": 6.0,
            "peak_rss_mb": 700.5,
            "planned_s_per_item": 0.5,
            "planned_status": "measured",
            "measured_vs_planned": 2.0,
        }
    )
    ext = _row(summary, "extract", "tiny-vlm")
    assert ext == pytest.approx(
        {
            "stage": "extract",
            "benchmark": "contextbias",
            "model": "tiny-vlm",
            "jobs": 2,
            "items": 4,
            "load_s_total": 4.0,
            "load_s_mean": 2.0,
            "s_per_item": 0.5,
            "items_per_hour": 7200.0,
            "wall_s_per_item": 4.0,
            "peak_rss_mb": 1000.0,
            "planned_s_per_item": 0.25,
            "planned_status": "estimate",
            "measured_vs_planned": 2.0,
        }
    )
    vqa = _row(summary, "vqa", "tiny-vlm")
    assert vqa == {
        "stage": "vqa",
        "benchmark": "biasig",
        "model": "tiny-vlm",
        "jobs": 1,
        "items": 2,
        "load_s_total": 4.0,
        "load_s_mean": 4.0,
        "s_per_item": None,
        "items_per_hour": None,
        "wall_s_per_item": 4.0,
        "peak_rss_mb": None,
        "planned_s_per_item": 0.25,
        "planned_status": "estimate",
        "measured_vs_planned": None,
    }


def test_config_filter_and_no_table(run_dir):
    """Without a config every model found is shown; a benchmark switched off is not;
    without a throughput table the planned columns are empty."""
    everything = measured_throughput(run_dir / "results")
    assert set(everything["model"]) == {"tiny-sd", "old-model", "tiny-vlm"}
    assert everything["planned_s_per_item"].null_count() == everything.height
    old = _row(everything, "generate", "old-model")
    assert (old["jobs"], old["items"], old["s_per_item"], old["wall_s_per_item"]) == (
        1,
        1,
        1.0,
        None,
    )
    no_biasig = measured_throughput(
        run_dir / "results", config=_config({**SECTIONS, "biasig": {"enabled": False}})
    )
    assert set(no_biasig["benchmark"]) == {"contextbias"}


def test_timing_sidecar(tmp_path):
    """A job's <output>.timing.json (LVLM jobs) is used as it is: items, work seconds after
    loading, load seconds and the model that ran (not the folder's model)."""
    res = tmp_path / "results/lvlm"
    for folder, shard, timing in [
        ("responses", "0", {"model": "tiny-vlm", "load_seconds": 2.0, "seconds": 3.0, "items": 6}),
        ("responses", "1", {"model": "tiny-vlm", "load_seconds": 4.0, "seconds": 1.5, "items": 3}),
        (
            "story_attributes",
            "0",
            {"model": "tiny-llm", "load_seconds": 1.0, "seconds": 2.0, "items": 4},
        ),
    ]:
        # each at its template of the LVLM layout (stereolens.lvlm.layout)
        rel = (
            f"tiny-vlm/plain/story/gender/women/{shard}.jsonl"
            if folder == "responses"
            else "tiny-vlm/plain/gender.jsonl"
        )
        out = res / folder / rel
        _jsonl(out, [{"id": i} for i in range(timing["items"])])
        _write(out.with_name(out.name + ".timing.json"), json.dumps(timing))
    _bench(
        tmp_path / "benchmarks/lvlm/respond/tiny-vlm/plain/story/gender/women/0.tsv", "9.0", "100"
    )
    config = _config({"lvlm": {"enabled": True, "models": ["tiny-vlm"], "assistant": "tiny-llm"}})
    summary = measured_throughput(tmp_path / "results", config=config)
    assert summary.select("stage", "model", "jobs", "items").rows() == [
        ("respond", "tiny-vlm", 2, 9),
        ("story_attributes", "tiny-llm", 1, 4),
    ]
    respond = _row(summary, "respond", "tiny-vlm")
    # load 6 s / 3 s; (3 + 1.5) s / 9 items = 0.5 s; wall: 9 s over job 0's 6 items
    assert (respond["load_s_total"], respond["load_s_mean"]) == (6.0, 3.0)
    assert respond["s_per_item"] == pytest.approx(0.5)
    assert respond["items_per_hour"] == pytest.approx(7200.0)
    assert respond["wall_s_per_item"] == pytest.approx(1.5)
    assert respond["peak_rss_mb"] == 100.0
    assert _row(summary, "story_attributes", "tiny-llm")["s_per_item"] == pytest.approx(0.5)


def test_empty_results(tmp_path):
    (tmp_path / "results").mkdir()
    summary = measured_throughput(tmp_path / "results", config=CONFIG)
    assert summary.is_empty() and summary.columns == SUMMARY_COLUMNS


def test_report_section(run_dir):
    import yaml

    from stereolens.report.html import render_sections
    from stereolens.report.inputs import Inputs
    from stereolens.report.run import sections

    _write(run_dir / "config/throughput.yaml", yaml.safe_dump(TABLE))
    inputs = Inputs(
        {
            "prompts": run_dir / "results/contextbias/prompts.parquet",
            "throughput_table": run_dir / "config/throughput.yaml",
        }
    )
    html = render_sections(sections(inputs, CONFIG))
    assert "Measured throughput" in html
    assert "s_per_item" in html and "items_per_hour" in html and "config/throughput.yaml" in html
    # the generation row, formatted by the report's table helper
    assert (
        '<td>tiny-sd</td><td class="n" data-v="2">2</td><td class="n" data-v="4">4</td>'
        '<td class="n" data-v="8.0">8.000</td><td class="n" data-v="4.0">4.000</td>'
    ) in html
    assert '<td>measured</td><td class="n" data-v="2.0">2.000</td>' in html
    assert "old-model" not in html
    assert "Measured throughput against the planner" in html  # the figure
    # tables gathered from outside a results folder (a unit test's tmp files) and no timing
    # table: the section says so
    outside = render_sections(sections(Inputs({"prompts": run_dir / "prompts.parquet"}), CONFIG))
    assert "No job timing records" in outside


def test_one_timing_record_read_for_old_and_new_jobs(tmp_path):
    """Every model job writes one timing record (stereolens.models.job): the runner writes
    it beside a file output, a generation shard holds it as timing.json. Throughput reads
    the new records, and a shard's timing.json of an older stereolens (no ``seconds``, only
    ``seconds_per_image``) gives the same row."""
    import logging

    from stereolens.atomic import write_json
    from stereolens.models.job import ModelJob, read_job_timing, timing_path, timing_record
    from stereolens.models.registry import ModelSpec

    res = tmp_path / "results"
    img = res / "contextbias/images/tiny-sd/nurse"
    _timing(img / "CF/0", 3.0, {"a": 0.5, "b": 1.5})  # an older stereolens's record
    new = img / "CF/1"
    new.mkdir(parents=True)
    per_image = {"a": 0.5, "b": 1.5}
    record = timing_record("tiny-sd", 3.0, 2.0, 2, 4, {"mem_mb": 4000}, seconds_per_image=per_image)
    write_json(timing_path(new), record)
    assert timing_path(new) == new / "timing.json"
    assert read_job_timing(new)["seconds_per_item"] == 1.0

    out = res / "contextbias/extractions/tiny-vlm/tiny-sd/nurse/CF/0.jsonl"
    out.parent.mkdir(parents=True)
    spec = ModelSpec("tiny-vlm", "vlm", "openai", "x")
    job = ModelJob(str(out), log=logging.getLogger("t"), resources={"mem_mb": 1000})
    records = job.run(spec, lambda m: [{"image_id": i} for i in "xyz"], load=lambda s: object())
    _jsonl(out, records)
    assert timing_path(out) == out.with_name("0.jsonl.timing.json")
    written = json.loads(timing_path(out).read_text())
    assert written["model"] == "tiny-vlm" and written["items"] == 3
    assert written["batch_size"] == 1 and written["job_resources"] == {"mem_mb": 1000}

    jobs = collect_jobs(res).sort("stage", "job")
    cols = ["stage", "model", "items", "timed_items", "item_seconds", "load_seconds"]
    assert jobs.select("job", *cols).rows() == [
        ("tiny-vlm/tiny-sd/nurse/CF/0", "extract", "tiny-vlm", 3, 3, written["seconds"],
         written["load_seconds"]),
        ("tiny-sd/nurse/CF/0", "generate", "tiny-sd", 2, 2, 2.0, 3.0),
        ("tiny-sd/nurse/CF/1", "generate", "tiny-sd", 2, 2, 2.0, 3.0),
    ]  # fmt: skip
