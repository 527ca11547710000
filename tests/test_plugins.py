"""Benchmarks as plug-ins (stereolens.benchmark): rule all's targets and the report rule's
inputs are the loops over the registered plug-ins and equal the lists common.smk wrote by
hand before; the report's benchmark modules are the plug-ins' report_sections."""

from __future__ import annotations

from pathlib import Path

import pytest

from stereolens import benchmark as benchmark_module
from stereolens.benchmark import benchmarks
from stereolens.config import load_config
from stereolens.workflow_support import final_targets, report_inputs

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [
    "config/demo.yaml",
    "config/config.yaml",
    *sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / ".test" / "config").glob("*.yaml")
        # faults.yaml needs a generated registry; faults_schema.yaml is no config
        if not p.name.startswith("faults")
    ),
]


@pytest.fixture(autouse=True)
def _in_repo(repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)  # configs name the registry relative to the repo root


# ---- the hand-written lists of workflow/rules/common.smk before the loops (frozen here)


def _story_reading(lv: dict) -> bool:
    tasks = list(lv["tasks"]) if lv["enabled"] else []
    return bool(lv["enabled"] and "story" in tasks and lv["assistant"])


def _hand_targets(config: dict) -> list[str]:
    cb, bg, lv = config["contextbias"], config["biasig"], config["lvlm"]
    targets = []
    if bg["enabled"]:
        targets += ["results/biasig/answers.parquet", "results/biasig/metrics/eta.parquet"]
    if cb["validation"]["enabled"]:
        targets.append("results/contextbias/validation/scores.parquet")
    if cb["annotation"]["enabled"]:
        targets.append("results/contextbias/annotation/form.html")
    if cb["annotation"]["answers"]:
        targets.append("results/contextbias/annotation/agreement_summary.parquet")
    if lv["enabled"]:
        targets.append("results/lvlm/metrics/scores.parquet")
    if cb["validation"]["enabled"]:
        targets.append("results/contextbias/validation/group_gaps.parquet")
    if _story_reading(lv) and lv["story_reading"]["enabled"]:
        targets.append("results/lvlm/metrics/story_reading_gaps.parquet")
    return targets + [
        "results/contextbias/prompts.parquet",
        "results/contextbias/attributes.parquet",
        "results/contextbias/metrics/bi.parquet",
        "results/report/index.html",
    ]


def _hand_report_inputs(config: dict) -> dict[str, str]:
    cb, bg, lv = config["contextbias"], config["biasig"], config["lvlm"]
    inputs = {
        "prompts": "results/contextbias/prompts.parquet",
        "images": "results/contextbias/images.parquet",
        "attributes": "results/contextbias/attributes.parquet",
        "mapping": "results/contextbias/canonical_mapping.parquet",
        **{
            name: f"results/contextbias/metrics/{name}.parquet"
            for name in ("bi", "ccs", "ccs_mean", "robustness", "bootstrap")
        },
        "job_timings": "results/report/job_timings.parquet",
        "throughput_table": "config/throughput.yaml",
    }
    if cb["validation"]["enabled"]:
        inputs["validation"] = "results/contextbias/validation/scores.parquet"
    if cb["annotation"]["enabled"]:
        inputs["annotation_form"] = "results/contextbias/annotation/form.html"
    if cb["annotation"]["answers"]:
        inputs["agreement"] = "results/contextbias/annotation/agreement_summary.parquet"
    if bg["enabled"]:
        for name in ("implicit", "explicit", "eta"):
            inputs[f"biasig_{name}"] = f"results/biasig/metrics/{name}.parquet"
        inputs["biasig_prompts"] = "results/biasig/prompts.parquet"
        inputs["biasig_answers"] = "results/biasig/answers.parquet"
    if lv["enabled"]:
        inputs |= {
            f"lvlm_{name}": f"results/lvlm/metrics/{name}.parquet"
            for name in ("scores", "prompt_scores", "refusals", "story_skew", "exam_accuracy")
        } | {
            "lvlm_sets": "results/lvlm/sets.parquet",
            "lvlm_responses": "results/lvlm/responses.parquet",
            "lvlm_story_attributes": "results/lvlm/story_attributes.parquet",
        }
    if cb["validation"]["enabled"]:
        inputs["validation_by_group"] = "results/contextbias/validation/by_group.parquet"
        inputs["validation_group_gaps"] = "results/contextbias/validation/group_gaps.parquet"
    if _story_reading(lv) and lv["story_reading"]["enabled"]:
        inputs["story_reading"] = "results/lvlm/metrics/story_reading.parquet"
        inputs["story_reading_gaps"] = "results/lvlm/metrics/story_reading_gaps.parquet"
    return inputs


@pytest.mark.parametrize("path", CONFIGS)
def test_plugin_loops_equal_the_hand_written_lists(path):
    config, _ = load_config(path)
    targets = final_targets(config)
    assert len(targets) == len(set(targets))
    assert sorted(targets) == sorted(_hand_targets(config))
    assert targets[-1] == "results/report/index.html"
    assert report_inputs(config) == _hand_report_inputs(config)


def test_the_configs_cover_every_optional_table():
    """Between them the configs above switch on every benchmark, the validation and the
    story reading (so the comparison above is not vacuous)."""
    seen = set()
    for path in CONFIGS:
        config, _ = load_config(path)
        seen |= set(report_inputs(config))
    for name in ("validation_group_gaps", "biasig_eta", "lvlm_scores", "story_reading_gaps"):
        assert name in seen


def test_two_benchmarks_cannot_claim_one_report_table(monkeypatch):
    config, _ = load_config("config/demo.yaml")
    monkeypatch.setitem(benchmark_module.PLUGINS, "twin", benchmark_module.PLUGINS["contextbias"])
    with pytest.raises(ValueError, match="report table 'prompts'"):
        report_inputs(config)


def test_report_modules_are_the_plugins_report_sections():
    from stereolens.report import render

    names = [m.__name__ for m in render.benchmark_modules()]
    assert names == [p.report_sections for p in benchmarks()]
    assert names == [
        "stereolens.report.contextbias",
        "stereolens.report.biasig",
        "stereolens.report.lvlm",
    ]
    assert [m.KEY for m in render.benchmark_modules()] == [p.name for p in benchmarks()]
