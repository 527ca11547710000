"""The adaptive design end to end (issue 23, items 1, 5 and 6): config/demo-adaptive.yaml
(ContextBias on the tiny random models, two rounds of seed shards) run once, then its
rounds, decisions and report checked for structure and invariants (never for the tiny
models' numbers), a rerun that has nothing to do, and a model added later that gets rounds
of its own without a job of the model already run."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import built_once, copy_workflow, dry_run_jobs, run_workflow, workflow_env
from scipy import stats

from stereolens.design.adaptive import DECISION_COLUMNS

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
CONFIG = "config/demo-adaptive.yaml"
TIMEOUT = int(os.environ.get("STEREOLENS_DEMO_TIMEOUT", "1500"))
ADAPTIVE = "results/contextbias/adaptive"
REASONS = {"excludes 0", "within the margin", "width reached", "cap reached", "open"}
# rules whose jobs belong to one generator (the adaptive rounds' group)
PER_MODEL_RULES = {
    "generate_images",
    "extract_contextbias_attributes",
    "merge_contextbias_model_attributes",
    "adaptive_round",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_models) -> Path:
    """config/demo-adaptive.yaml run end to end once (shared; the tests must not change
    it, except the last, which writes a config of its own and only dry-runs), on the
    session's tiny checkpoints (``tiny_models.seed_workflow``: no build_tiny_model job)."""

    def _run(wd: Path) -> None:
        run_workflow(
            wd, CONFIG, "adaptive-run.log", "the adaptive demo", TIMEOUT,
            prepare=tiny_models.seed_workflow,
        )  # fmt: skip

    return built_once(tmp_path_factory, "adaptive-demo-run", _run)


def _dry_run(wd: Path, config: str = CONFIG) -> tuple[str, list[dict]]:
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", config], cwd=wd, env=workflow_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    return text, dry_run_jobs(text)


@pytest.mark.slow
def test_rounds_decisions_and_their_invariants(run):
    table = pl.read_parquet(run / ADAPTIVE / "decisions.parquet")
    assert table.columns[: len(DECISION_COLUMNS)] == list(DECISION_COLUMNS)
    assert {"model", "extractor", "shards", "df", "goal", "benchmark"} <= set(table.columns)
    assert table["round"].max() >= 2
    assert set(table["decision"]) <= {"continue", "stop"}
    assert set(table["reason"]) <= REASONS
    for (cell,), rows in table.group_by(["cell"]):
        rows = rows.sort("round")
        rounds = rows["round"].to_list()
        assert rounds == list(range(1, len(rounds) + 1)), cell
        # a cell continues until it stops, and stops once, at its last round
        assert rows["decision"].to_list() == ["continue"] * (len(rounds) - 1) + ["stop"], cell
        assert rows["shards"].to_list() == [1, 2][: len(rounds)], cell
    # every cell open after round 1 has a round-2 row, every stopped one none
    first = table.filter(pl.col("round") == 1)
    second = set(table.filter(pl.col("round") == 2)["cell"])
    assert set(first.filter(pl.col("decision") == "continue")["cell"]) == second
    # the last round stops every cell; the RCI holds its estimate
    assert set(table.filter(pl.col("round") == 2)["decision"]) <= {"stop"}
    finite = table.filter(pl.col("ci_low").is_not_null() & pl.col("ci_low").is_not_nan())
    assert finite.height, "the demo's 2 roles give intervals (interval_min_roles 2)"
    assert (finite["ci_low"] <= finite["estimate"]).all()
    assert (finite["estimate"] <= finite["ci_high"]).all()
    assert (finite["critical"] > 0).all()
    # the rounds' own tables, one per round of the generator, add up to the final one
    parts = sorted((run / ADAPTIVE).glob("round_*/*/decisions.parquet"))
    assert len(parts) == table["round"].max()
    assert sum(pl.read_parquet(p).height for p in parts) == table.height


@pytest.mark.slow
def test_a_cell_at_the_cap_has_the_pipelines_own_estimate_and_interval(run):
    """With canonicalisation off the interim reads the labels the metrics read, so a cell
    that ran to the cap (all shards) has bootstrap.parquet's CA-U - CF overall estimate_bc,
    and its se x the t(R - 1) quantile is that bc-t interval's half-width."""
    table = pl.read_parquet(run / ADAPTIVE / "decisions.parquet")
    boot = pl.read_parquet(run / "results/contextbias/metrics/bootstrap.parquet").filter(
        (pl.col("comparison") == "CA-U - CF") & (pl.col("cohort") == "*")
        & (pl.col("dimension") == "*") & (pl.col("model") != "*")
    )  # fmt: skip
    capped = table.filter(pl.col("shards") == 2)
    assert capped.height
    for row in capped.iter_rows(named=True):
        got = boot.filter(
            (pl.col("extractor") == row["extractor"]) & (pl.col("model") == row["model"])
        )
        assert got.height == 1
        assert row["estimate"] == pytest.approx(got["estimate_bc"][0], rel=1e-9, abs=1e-12)
        half = got["ci_high"][0] - got["estimate_bc"][0]
        assert row["se"] * stats.t.ppf(0.975, row["df"]) == pytest.approx(half, rel=1e-9)


@pytest.mark.slow
def test_round_two_made_the_second_seed_only_for_open_cells(run):
    table = pl.read_parquet(run / ADAPTIVE / "decisions.parquet")
    images = pl.read_parquet(run / "results/contextbias/images.parquet")
    shards = sorted((run / "results/contextbias/extractions").glob("*/*/*/*/*.jsonl"))
    made = {p.stem for p in shards}
    open_after_1 = table.filter((pl.col("round") == 1) & (pl.col("decision") == "continue"))
    assert made == ({"0", "1"} if open_after_1.height else {"0"})
    # both rounds' images reach the final tables (the merge reads the shards the rounds ran)
    assert images.height > 0
    assert images.select("role", "condition").unique().height == 6


@pytest.mark.slow
def test_report_shows_the_rounds(run):
    page = (run / "results/report/index.html").read_text()
    assert "Adaptive design: rounds and stopping" in page
    assert "Rounds and decisions" in page
    assert "cap reached" in page or "excludes 0" in page


@pytest.mark.slow
def test_rerun_has_nothing_to_do_and_a_new_model_gets_rounds_of_its_own(run):
    text, jobs = _dry_run(run)
    assert "Nothing to be done" in text, text[-2000:]
    added = run / "config/demo-adaptive-added.yaml"
    added.write_text(
        (run / CONFIG)
        .read_text()
        .replace("generators: [tiny-sd-b]", "generators: [tiny-sd-b, tiny-sd]")
    )
    try:
        _, jobs = _dry_run(run, str(added.relative_to(run)))
    finally:
        added.unlink()
    per_model = [j for j in jobs if j["rule"] in PER_MODEL_RULES]
    assert per_model, "adding a generator plans its own jobs"
    assert {j["wildcards"].get("model") for j in per_model} == {"tiny-sd"}
    rounds = [j for j in jobs if j["rule"] == "adaptive_round"]
    # the new model's round 1: round 2 is known only once round 1 has decided (checkpoint)
    assert [j["wildcards"]["round"] for j in rounds] == ["1"]
    shards = {j["wildcards"]["shard"] for j in per_model if "shard" in j["wildcards"]}
    assert shards == {"0"}


@pytest.mark.slow
def test_a_gpu_hours_cap_plans_the_rounds_the_planner_prints(tmp_path):
    """The adaptive demo with its models on the GPU (a shard of 37 images at 60 + 40 s:
    37/36 GPU-hours): a cap the two seed shards exceed is refused at parse time naming the
    least cap that works; at 4 seeds per prompt a cap of 2.5 GPU-hours cuts the rounds to 2
    shards (1 and 2), so round 1 makes shard 0 alone where the uncapped run makes 0 and 1,
    as stereolens.design.rounds.budget (the planner's) says. Dry runs only."""
    from stereolens.config import validate_config
    from stereolens.design import rounds as R
    from stereolens.models.registry import load_registry

    wd = copy_workflow(tmp_path / "wd")
    registry = yaml.safe_load((wd / "config/models.yaml").read_text())
    registry["generators"]["tiny-sd-b"].update(device="cuda", seconds_per_image=60)
    registry["vlms"]["tiny-vlm"].update(device="cuda", seconds_per_item=40)
    (wd / "config/gpu-models.yaml").write_text(yaml.safe_dump(registry))
    config = yaml.safe_load((wd / CONFIG).read_text())
    config["registry"] = "config/gpu-models.yaml"
    config["design"]["adaptive"]["gpu_hours_cap"] = 1.5
    (wd / "config/capped.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", "config/capped.yaml"], cwd=wd, env=workflow_env(),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "design.adaptive.gpu_hours_cap 1.5: too small" in text
    assert "need a cap of at least 2.06 GPU-hours" in text
    config["contextbias"]["seeds"]["per_prompt"] = 4
    config["design"]["adaptive"]["gpu_hours_cap"] = 2.5
    (wd / "config/capped.yaml").write_text(yaml.safe_dump(config))
    valid = validate_config(copy.deepcopy(config))
    at = R.budget(valid, load_registry(wd / "config/gpu-models.yaml"), {"entries": {}})
    assert at.shards == {"contextbias": 2}
    for name in ("config/capped.yaml", "config/uncapped.yaml"):
        if name == "config/uncapped.yaml":
            config["design"]["adaptive"]["gpu_hours_cap"] = None
            (wd / name).write_text(yaml.safe_dump(config))
        _, jobs = _dry_run(wd, name)
        made = {(j["wildcards"]["role"], j["wildcards"]["condition"], j["wildcards"]["shard"])
                for j in jobs if j["rule"] == "extract_contextbias_attributes"}  # fmt: skip
        shards = {"0"} if name == "config/capped.yaml" else {"0", "1"}
        assert {s for _, _, s in made} == shards, name
        assert len(made) == 6 * len(shards)
        assert [j["wildcards"]["round"] for j in jobs if j["rule"] == "adaptive_round"] == ["1"]
