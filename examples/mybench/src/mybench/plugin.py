"""MyBench as a plug-in: every configured VLM answers the questions once (one job per
model), and one table of scores comes out."""

from pathlib import Path

from stereolens.benchmark import Benchmark, Job
from stereolens.layout import JobFolder, Layout
from stereolens.validation import ConfigError

HERE = Path(__file__).parent
LAYOUT = Layout(
    "mybench",  # every path under results/mybench/: one template per output
    {"answers": "vqa/{model}/answers.jsonl", "metrics": "metrics/{table}.parquet"},
    jobs={"answers": JobFolder("vqa")},  # model-job outputs: the measured throughput's
)


def _enabled(config):
    return bool(config.get("mybench", {}).get("enabled"))


def _check(config, registry):
    for name in config["mybench"]["models"]:
        if registry.get(name) is None or registry[name].kind != "vlm":
            raise ConfigError(
                f"mybench.models: {name!r} is not a vlm in the registry {config['registry']}"
            )


def _jobs(config, counts=False):
    mb = config["mybench"]
    return [
        Job(
            "answer_mybench",  # the rule
            "vqa",  # the stage: a row of the plan
            model,
            LAYOUT.path("answers", model=model),  # exactly the rule's output
            mb["questions"] if counts else 0,  # requests it sends
            "calls",
            {"model": model},
        )
        for model in mb["models"]
    ]


def _targets(config):
    return [LAYOUT.path("metrics", table="scores")]


def _models(config):
    return {"mybench model": list(config.get("mybench", {}).get("models", []))}


REPORT_PATHS = {"mybench_scores": LAYOUT.path("metrics", table="scores")}
"""Every table the report can read of MyBench (`stereolens report --results` looks there)."""


BENCHMARK = Benchmark.from_functions(
    globals(),  # its callables: _enabled, _check, _jobs, _targets, _models above
    name="mybench",
    title="MyBench",
    report_paths=REPORT_PATHS,
    report_sections="mybench.report",  # a module name: the report imports it, not the plug-in
    rules=(str(HERE / "rules" / "mybench.smk"),),  # absolute: shipped in this package
    config_schema=str(HERE / "config.schema.yaml"),  # its config section, merged in
    cli="mybench.cli",  # `stereolens mybench ...`
    model_rules=("answer_mybench",),  # what `stereolens regenerate --benchmark mybench` redoes
    layout=LAYOUT,  # its output paths
)
