"""MyBench's part of the report: one line on the first screen and one section."""

from stereolens.report.html import Section, Table
from stereolens.report.summary import profile_frame

KEY = "mybench"
TITLE = "MyBench"
HEADLINE = "mybench_scores"  # its results are there when this table is (`stereolens report`)


def infer_config(inputs):
    """Its config section from the tables, for `stereolens report` without a config."""
    scores = inputs.get("mybench_scores")
    if scores is None:
        return {}
    return {"enabled": True, "models": sorted(scores["model"].unique().to_list())}


def enabled(inputs, config):
    return inputs.has("mybench_scores")


def facts(inputs, config):
    return [f"models: {', '.join(inputs.get('mybench_scores')['model'].unique().sort())}"]


def profile(inputs, config):
    return profile_frame([])  # rows of the first screen's bias profile, if it has any


def sections(inputs, config):
    scores = Table("mybench-scores", "Scores", "Score per model.", inputs.get("mybench_scores"))
    return [Section(KEY, TITLE, tables=[scores])]


def galleries(inputs, config, settings):
    return []
