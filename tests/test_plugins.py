"""Benchmarks as plug-ins (stereolens.benchmark): rule all's targets and the report rule's
inputs are the loops over the registered plug-ins and equal the lists common.smk wrote by
hand before; the table is the built-ins then the entry points of stereolens.benchmarks; the
example benchmark of docs/adding-a-benchmark.md (examples/mybench, whose files the page
includes), its package on sys.path, is picked up by the config schema and checks, the
planner, those loops and the report."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from stereolens import benchmark as benchmark_module
from stereolens.benchmark import benchmarks, configured_models
from stereolens.config import load_config
from stereolens.workflow_support import final_targets, job_timing_inputs, report_inputs

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [
    "config/demo.yaml",
    "config/config.yaml",
    *sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / ".test" / "config").glob("*.yaml")
        # faults*.yaml need a generated registry; faults_schema.yaml is no config
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
    # the corrected tables (issue 21) of the benchmarks run with human labels or simulated ones
    for name, section, runs in (("contextbias", cb, True), ("biasig", bg, bg["enabled"]),
                                ("lvlm", lv, lv["enabled"])):  # fmt: skip
        rc = section["reader_correction"]
        if runs and (rc["human_labels"] or rc["simulate"]):
            targets.append(f"results/{name}/corrected.parquet")
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
        "contextbias_comparisons": "results/contextbias/metrics/comparisons.parquet",
        "contextbias_ranks": "results/contextbias/metrics/ranks.parquet",
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
        for name in ("implicit", "explicit", "eta", "comparisons", "ranks"):
            inputs[f"biasig_{name}"] = f"results/biasig/metrics/{name}.parquet"
        inputs["biasig_prompts"] = "results/biasig/prompts.parquet"
        inputs["biasig_answers"] = "results/biasig/answers.parquet"
    if lv["enabled"]:
        inputs |= {
            f"lvlm_{name}": f"results/lvlm/metrics/{name}.parquet"
            for name in (
                "scores",
                "prompt_scores",
                "refusals",
                "story_skew",
                "exam_accuracy",
                "comparisons",
                "ranks",
            )
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
    # the corrected tables and the simulated human labels (issue 21) the run writes
    for name, section, runs in (("contextbias", cb, True), ("biasig", bg, bg["enabled"]),
                                ("lvlm", lv, lv["enabled"])):  # fmt: skip
        rc = section["reader_correction"]
        if runs and (rc["human_labels"] or rc["simulate"]):
            inputs[f"{name}_corrected"] = f"results/{name}/corrected.parquet"
        if runs and rc["simulate"]:
            inputs[f"{name}_human_labels_simulated"] = (
                f"results/{name}/human_labels_simulated.parquet"
            )
    return inputs


@pytest.mark.parametrize("path", CONFIGS)
def test_plugin_loops_equal_the_hand_written_lists(path):
    config, _ = load_config(path)
    targets = final_targets(config)
    assert len(targets) == len(set(targets))
    assert sorted(targets) == sorted(_hand_targets(config))
    assert targets[-1] == "results/report/index.html"
    assert report_inputs(config) == _hand_report_inputs(config)


STANDARD = {
    # the report's standard paths as hand-written before the plug-ins named them
    "prompts": "contextbias/prompts.parquet",
    "images": "contextbias/images.parquet",
    "attributes": "contextbias/attributes.parquet",
    "mapping": "contextbias/canonical_mapping.parquet",
    **{n: f"contextbias/metrics/{n}.parquet" for n in ("bi", "ccs", "ccs_mean")},
    **{n: f"contextbias/metrics/{n}.parquet" for n in ("robustness", "bootstrap")},
    **{f"contextbias_{n}": f"contextbias/metrics/{n}.parquet" for n in ("comparisons", "ranks")},
    "validation": "contextbias/validation/scores.parquet",
    "annotation_form": "contextbias/annotation/form.html",
    "agreement": "contextbias/annotation/agreement_summary.parquet",
    "validation_by_group": "contextbias/validation/by_group.parquet",
    "validation_group_gaps": "contextbias/validation/group_gaps.parquet",
    **{
        f"biasig_{n}": f"biasig/metrics/{n}.parquet"
        for n in ("implicit", "explicit", "eta", "comparisons", "ranks")
    },
    "biasig_prompts": "biasig/prompts.parquet",
    "biasig_answers": "biasig/answers.parquet",
    **{
        f"lvlm_{n}": f"lvlm/metrics/{n}.parquet"
        for n in ("scores", "prompt_scores", "refusals", "story_skew", "exam_accuracy")
    },
    "lvlm_comparisons": "lvlm/metrics/comparisons.parquet",
    "lvlm_ranks": "lvlm/metrics/ranks.parquet",
    "lvlm_sets": "lvlm/sets.parquet",
    "lvlm_responses": "lvlm/responses.parquet",
    "lvlm_story_attributes": "lvlm/story_attributes.parquet",
    "story_reading": "lvlm/metrics/story_reading.parquet",
    "story_reading_gaps": "lvlm/metrics/story_reading_gaps.parquet",
    # the adaptive design's table of all rounds (a plug-in with rounds: stereolens.layout.ADAPTIVE)
    "contextbias_adaptive": "contextbias/adaptive/decisions.parquet",
    **{
        f"{b}_{n}": f"{b}/{n}.parquet"
        for b in ("contextbias", "biasig", "lvlm")
        for n in ("corrected", "human_labels_simulated")
    },
    "job_timings": "report/job_timings.parquet",
}


def _hand_roles(config: dict) -> list[tuple[str, str]]:
    """The report's model roles as hand-written before the plug-ins named them."""
    cb, bg, lv = config["contextbias"], config["biasig"], config["lvlm"]
    out = [("contextbias generator", n) for n in cb["generators"]]
    out += [("contextbias extractor", n) for n in cb["extractors"]]
    if cb["canonicalisation"]["enabled"] and cb["canonicalisation"]["llm"]:
        out.append(("contextbias canonicalisation LLM", cb["canonicalisation"]["llm"]))
    if bg["enabled"]:
        out += [("biasig generator", n) for n in bg["generators"]] + [("biasig VQA", bg["vqa"])]
    if lv["enabled"]:
        out += [("lvlm audited model", n) for n in lv["models"]]
        if lv["assistant"]:
            out.append(("lvlm assistant (story attributes, term judge)", lv["assistant"]))
        if lv["refusal_judge"]:
            out.append(("lvlm refusal judge", lv["refusal_judge"]))
    return out


def test_report_paths_are_the_standard_paths():
    """The report's standard paths (``stereolens report --results``) are the plug-ins'
    report_paths, and every config's report tables are among them."""
    from stereolens.report.inputs import standard_paths

    assert standard_paths() == STANDARD
    for path in CONFIGS:
        config, _ = load_config(path)
        for plugin in benchmarks(config):
            assert plugin.report_tables(config).items() <= plugin.report_paths.items()


@pytest.mark.parametrize("path", CONFIGS)
def test_model_roles_are_the_plugins_models(path):
    from stereolens.benchmark import model_roles

    config, _ = load_config(path)
    assert model_roles(config) == _hand_roles(config)


def test_generation_settings_are_the_rules_former_params():
    """generate_images' settings param, now the plug-ins' generation_settings, keeps the
    JSON the benchmarks' own rules had (a finished shard of an earlier run stays done)."""
    import json

    config, _ = load_config("config/demo.yaml")
    cb, bg = config["contextbias"], config["biasig"]
    model = cb["generators"][0]
    cbp, bgp = benchmark_module.benchmark("contextbias"), benchmark_module.benchmark("biasig")
    seeds = cb["seeds"]
    assert json.loads(cbp.generation_settings(config, model, "CF")) == {
        "per_prompt": seeds["per_prompt"],
        "bank_key": seeds["bank_keys"].get(model, seeds["default_bank_key"]),
        "default_bank_key": seeds["default_bank_key"],
        "fix_articles": cb["fix_articles"],
    }
    val = cb["validation"]
    assert cbp.generation_settings(config, model, "VAL") == json.dumps(
        {"per_prompt": val["seeds_per_prompt"], "seed_key": val["seed_key"]}, sort_keys=True
    )
    keys = ("acquired_types", "conditions", "acquired_attributes", "max_variants")
    keys += ("images_per_prompt", "prompts_per_shard", "seed_base")
    assert bgp.generation_settings(config, model, "implicit") == json.dumps(
        {k: bg[k] for k in keys}, sort_keys=True
    )
    assert [p.name for p in benchmark_module.generating()] == ["contextbias", "biasig"]


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
    import dataclasses

    from stereolens.contextbias import plugin as contextbias_plugin

    config, _ = load_config("config/demo.yaml")
    twin = dataclasses.replace(contextbias_plugin.BENCHMARK, name="twin")
    monkeypatch.setattr(contextbias_plugin, "TWIN", twin, raising=False)
    monkeypatch.setitem(benchmark_module.plugins(), "twin", f"{contextbias_plugin.__name__}:TWIN")
    with pytest.raises(ValueError, match="report table 'prompts'"):
        report_inputs(config)


def _distribution(site: Path, name: str, entry_points: str) -> None:
    """An installed distribution's metadata in ``site`` (as pip writes it), declaring
    ``entry_points``."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_entry_points_add_benchmarks_after_the_built_ins(tmp_path, monkeypatch):
    """The table is the built-ins in their order, then the group's other entry points by
    name; an entry point that claims a built-in's name is refused."""
    group = f"[{benchmark_module.ENTRY_POINT_GROUP}]\n"
    _distribution(tmp_path, "zeta", group + "zbench = zbench.plugin:BENCHMARK\n")
    _distribution(tmp_path, "alpha", group + "abench = abench.plugin:BENCHMARK\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    benchmark_module.plugins.cache_clear()
    try:
        table = benchmark_module.plugins()
        assert list(table) == ["contextbias", "biasig", "lvlm", "abench", "zbench"]
        assert table["abench"] == "abench.plugin:BENCHMARK"
        with pytest.raises(ValueError, match="unknown benchmark 'nobench'.*lvlm, abench"):
            benchmark_module.benchmark("nobench")
        _distribution(tmp_path, "clash", group + "lvlm = clash.plugin:BENCHMARK\n")
        benchmark_module.plugins.cache_clear()
        with pytest.raises(ValueError, match="claims the name of a built-in benchmark"):
            benchmark_module.plugins()
    finally:
        monkeypatch.undo()
        benchmark_module.plugins.cache_clear()
    assert list(benchmark_module.plugins()) == ["contextbias", "biasig", "lvlm"]


def test_report_modules_are_the_plugins_report_sections():
    from stereolens.report import render

    names = [m.__name__ for m in render.benchmark_modules()]
    assert names == [p.report_sections for p in benchmarks()]
    assert names == [
        "stereolens.contextbias.report",
        "stereolens.biasig.report",
        "stereolens.lvlm.report",
    ]
    assert [m.KEY for m in render.benchmark_modules()] == [p.name for p in benchmarks()]


# ---- the fourth benchmark of examples/mybench (docs/adding-a-benchmark.md), in this process;
# tests/test_example_benchmark.py installs it and runs it through the workflow

EXAMPLE = ROOT / "examples" / "mybench"
PACKAGE = EXAMPLE / "src" / "mybench"
EXAMPLE_FILES = (
    "pyproject.toml",
    "src/mybench/plugin.py",
    "src/mybench/report.py",
    "src/mybench/rules/mybench.smk",
    "src/mybench/config.schema.yaml",
    "src/mybench/jobs.py",
    "src/mybench/cli.py",
    "src/mybench/scripts/answer_mybench.py",
)
"""The example's files that docs/adding-a-benchmark.md shows (it includes them)."""


@pytest.fixture
def mybench(monkeypatch):
    """The example's package on sys.path and registered, as its entry point registers it
    once installed; returns its rules file's text."""
    page = (ROOT / "docs" / "adding-a-benchmark.md").read_text()
    for name in EXAMPLE_FILES:
        assert f'--8<-- "examples/mybench/{name}"' in page, f"the page does not show {name}"
    project = (EXAMPLE / "pyproject.toml").read_text()
    group = f'[project.entry-points."{benchmark_module.ENTRY_POINT_GROUP}"]\n'
    key, value = re.search(r'^(\w+) = "([^"]+)"$', project.split(group)[1], re.M).groups()
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    for name in [m for m in sys.modules if m == "mybench" or m.startswith("mybench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(benchmark_module.plugins(), key, value)
    return (PACKAGE / "rules" / "mybench.smk").read_text()


def _config_with_mybench(tmp_path: Path, **section) -> tuple[dict, dict]:
    config = yaml.safe_load(Path("config/demo.yaml").read_text())
    vlm = config["contextbias"]["extractors"][0]
    config["mybench"] = {"enabled": True, "models": [vlm], **section}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_config(path)


def test_example_is_a_benchmark(mybench, tmp_path):
    config, registry = _config_with_mybench(tmp_path, questions=7)
    vlm = config["mybench"]["models"][0]

    # its config section validates through the schema it ships, defaults filled
    assert _config_with_mybench(tmp_path)[0]["mybench"]["questions"] == 10
    with pytest.raises(Exception, match="mybench.questions"):
        _config_with_mybench(tmp_path, questions=0)

    # the config checks and the table
    assert [p.name for p in benchmarks(config)] == ["contextbias", "biasig", "lvlm", "mybench"]
    assert configured_models(config)["mybench"] == [vlm]
    with pytest.raises(Exception, match="mybench.models"):
        _config_with_mybench(tmp_path, models=["no-such-model"])

    # the planner reads its jobs
    from stereolens.plan import plan

    rows = [r for r in plan(config, registry)["rows"] if r["benchmark"] == "mybench"]
    assert [(r["stage"], r["model"], r["jobs"], r["calls"]) for r in rows] == [("vqa", vlm, 1, 7)]

    # rule all, the report rule and the job timings
    assert "results/mybench/metrics/scores.parquet" in final_targets(config)
    assert report_inputs(config)["mybench_scores"] == "results/mybench/metrics/scores.parquet"
    # `stereolens report --results DIR` finds its table at its standard path
    from stereolens.report.inputs import Inputs, standard_paths

    assert standard_paths()["mybench_scores"] == "mybench/metrics/scores.parquet"
    table = tmp_path / "res" / "mybench" / "metrics" / "scores.parquet"
    table.parent.mkdir(parents=True)
    pl.DataFrame({"model": [vlm], "score": [0.5]}).write_parquet(table)
    assert Inputs.from_results(tmp_path / "res").get("mybench_scores")["model"].to_list() == [vlm]
    # the measured throughput reads its job's output
    assert f"results/mybench/vqa/{vlm}/answers.jsonl" in job_timing_inputs(config)["answers"]

    # switched off, it is in no loop
    off, _ = _config_with_mybench(tmp_path, enabled=False)
    assert "mybench" not in [p.name for p in benchmarks(off)]
    assert "mybench_scores" not in report_inputs(off)


def test_example_rules_make_the_plugins_paths(mybench, tmp_path):
    """Every job of the plug-in is an output of the rule it names, with its wildcards, and
    every target and report table is some rule's output."""
    config, _ = _config_with_mybench(tmp_path)
    rules = mybench
    outputs = dict(
        re.findall(r'^rule (\w+):\n(?:.*\n)*?    output:\n        "([^"]+)"', rules, flags=re.M)
    )
    plugin = benchmark_module.benchmark("mybench")
    for job in plugin.jobs(config):
        assert outputs[job.rule].format(**job.wildcards) == job.output
    made = set(outputs.values())
    for path in [*plugin.targets(config), *plugin.report_tables(config).values()]:
        assert path in made
    # the Snakefile includes its rules file from the package, and its wildcard is shared
    assert plugin.rules == (str(PACKAGE / "rules" / "mybench.smk"),)
    assert str(PACKAGE / "rules" / "mybench.smk") in benchmark_module.rules_files()


def test_example_report_section(mybench, tmp_path):
    from stereolens.report.inputs import Inputs
    from stereolens.report.render import benchmark_modules, build_report

    config, _ = _config_with_mybench(tmp_path)
    assert [m.__name__ for m in benchmark_modules()][-1] == "mybench.report"
    scores = pl.DataFrame({"model": ["m1", "m2"], "score": [0.5, 0.25]})
    report = build_report(Inputs.from_frames({"mybench_scores": scores}), config, galleries=False)
    assert "mybench" in [s.id for s in report.sections]
    assert ("MyBench", ["models: m1, m2"]) in report.summary.facts
    assert ("ContextBias", ["not in this run"]) in report.summary.facts
