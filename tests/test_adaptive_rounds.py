"""The workflow's adaptive rounds (stereolens.design.rounds; issue 23, items 1 and 5): which
jobs each round makes, a round's decisions and the config checks. The end-to-end run of
config/demo-adaptive.yaml is tests/test_adaptive_workflow.py."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from scipy import stats

from stereolens.benchmark import Job, benchmark
from stereolens.config import validate_config
from stereolens.design import adaptive as A
from stereolens.design import rounds as R
from stereolens.validation import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CB = benchmark("contextbias")


def _config(**adaptive) -> dict:
    config = yaml.safe_load((ROOT / "config/demo-adaptive.yaml").read_text())
    config["design"]["adaptive"].update(adaptive)
    return validate_config(config)


def _current(rows: list[tuple[str, float, float | None]]) -> pl.DataFrame:
    """An interim estimate's frame: (extractor, estimate, se) per cell of generator g."""
    return pl.DataFrame(
        {
            "model": ["g"] * len(rows),
            "extractor": [e for e, _, _ in rows],
            "cell": [f"{e} / g" for e, _, _ in rows],
            "effect": ["contextbias.bi_shift:g"] * len(rows),
            "estimate": [x for _, x, _ in rows],
            "se": [s for _, _, s in rows],
            "df": [None] * len(rows),
        },
        schema_overrides={"se": pl.Float64, "df": pl.Int64},
    )


def test_rounds_split_the_seed_shards_and_leave_validation_whole():
    config = _config()
    config["contextbias"]["validation"]["enabled"] = True
    assert R.in_rounds(config) == [CB]
    assert R.sizes(config, CB) == [1, 2]
    bounds = R.sizes(config, CB)
    jobs = CB.jobs(config)
    rounds = {(j.wildcards["condition"], j.wildcards["shard"], R.job_round(CB, j, bounds))
              for j in jobs}  # fmt: skip
    assert ("CF", 0, 1) in rounds and ("CF", 1, 2) in rounds
    assert {r for c, _, r in rounds if c == "VAL"} == {None}
    # the fixed design runs no rounds, whatever its design.adaptive says
    fixed = copy.deepcopy(config)
    fixed["design"]["mode"] = "fixed"
    assert R.in_rounds(fixed) == []


def test_a_generation_job_belongs_to_every_extractor_cell_of_its_model():
    gen = Job("generate_images", "generate", "g", "x", wildcards={"model": "g", "shard": 0})
    ext = Job(
        "extract", "extract", "e", "y", wildcards={"model": "g", "extractor": "e", "shard": 0}
    )
    assert R.belongs(gen, {"model": "g", "extractor": "e"})
    assert R.belongs(ext, {"model": "g", "extractor": "e"})
    assert not R.belongs(ext, {"model": "g", "extractor": "f"})
    assert not R.belongs(gen, {"model": "h", "extractor": "e"})
    assert R.select(CB, [gen, ext], [1, 2], [1], [{"model": "g", "extractor": "e"}]) == [gen, ext]
    assert R.select(CB, [gen, ext], [1, 2], [1], [{"model": "g", "extractor": "f"}]) == [gen]
    assert R.select(CB, [gen, ext], [1, 2], [2], [{"model": "g", "extractor": "e"}]) == []
    assert R.select(CB, [gen, ext], [1, 2], [1], [{"model": "g", "extractor": "e"}], "extract") == [
        ext
    ]


def test_round_one_stops_a_settled_cell_and_continues_an_open_one():
    """Round 1 of 3 at O'Brien-Fleming spending: an estimate 10 standard errors from 0 stops
    ("excludes 0"), one 1 standard error away continues, one without a standard error
    continues ("open"); the critical value is above the fixed design's 1.96 and the RCI is
    estimate +- critical x se."""
    config = _config(rounds=3, first_fraction=0.25)
    config["contextbias"]["seeds"]["per_prompt"] = 8
    table = R.decide_round(
        config, CB, 1, _current([("a", 0.5, 0.05), ("b", 0.05, 0.05), ("c", 0.1, None)])
    )
    assert table.columns[: len(A.DECISION_COLUMNS)] == list(A.DECISION_COLUMNS)
    by = {row["extractor"]: row for row in table.iter_rows(named=True)}
    assert (by["a"]["decision"], by["a"]["reason"]) == ("stop", "excludes 0")
    assert (by["b"]["decision"], by["b"]["reason"]) == ("continue", "open")
    assert (by["c"]["decision"], by["c"]["reason"]) == ("continue", "open")
    assert by["a"]["critical"] > stats.norm.isf(0.025)
    assert by["a"]["ci_low"] == pytest.approx(0.5 - by["a"]["critical"] * 0.05)
    assert np.isnan(by["c"]["critical"])
    assert set(table["shards"]) == {R.sizes(config, CB)[0]}


def test_the_last_round_stops_every_cell_and_spends_what_is_left():
    """At the cap every cell stops ("cap reached" where the goal does not hold); its
    critical value comes from the cell's information over the rounds and lies between the
    fixed design's 1.96 and round 1's."""
    config = _config()
    first = R.decide_round(config, CB, 1, _current([("a", 0.05, 0.05)]))
    last = R.decide_round(config, CB, 2, _current([("a", 0.04, 0.035)]), [first])
    row = last.row(0, named=True)
    assert (row["round"], row["decision"], row["reason"]) == (2, "stop", "cap reached")
    assert stats.norm.isf(0.025) < row["critical"] < first["critical"][0]
    expected = A.Rule(rounds=2, first_fraction=0.5).critical([1, 2], info=[400, 1 / 0.035**2])
    assert row["critical"] == pytest.approx(expected[-1], rel=1e-6)


def test_a_t_interval_gets_the_t_quantile_of_the_same_tail():
    config = _config()
    current = _current([("a", 0.05, 0.05)]).with_columns(pl.lit(4, pl.Int64).alias("df"))
    normal = R.decide_round(config, CB, 1, _current([("a", 0.05, 0.05)]))["critical"][0]
    t = R.decide_round(config, CB, 1, current)["critical"][0]
    assert t == pytest.approx(stats.t.isf(stats.norm.sf(normal), 4))


def test_collect_sorts_all_rounds():
    config = _config()
    first = R.decide_round(config, CB, 1, _current([("b", 0.05, 0.05), ("a", 0.5, 0.01)]))
    second = R.decide_round(config, CB, 2, _current([("b", 0.05, 0.04)]), [first])
    table = R.collect([second, first])
    assert table["round"].to_list() == [1, 1, 2]
    assert table["cell"].to_list() == ["a / g", "b / g", "b / g"]
    with pytest.raises(ValueError, match="empty"):
        R.collect([])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"goal": "width"}, "design.adaptive.width"),
        ({"goal": "equivalence"}, "design.adaptive.margin"),
    ],
)
def test_a_config_the_rounds_cannot_run_is_refused_naming_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        R.check(_config(**change))


def test_shards_too_coarse_for_rounds_are_refused_naming_the_shard_key():
    config = _config()
    config["contextbias"]["seeds"]["per_shard"] = 2  # one shard of both seeds
    with pytest.raises(ConfigError, match="contextbias.seeds.per_shard"):
        R.check(config)
    config["design"]["adaptive"]["rounds"] = 1  # one round asked for: allowed
    R.check(config)


def test_a_width_for_another_effect_is_an_error_naming_the_missing_one():
    config = _config(goal="width", width={"lvlm.other": 0.1})
    with pytest.raises(ConfigError, match="contextbias.bi_shift"):
        R.decide_round(config, CB, 1, _current([("a", 0.05, 0.05)]))
    config = _config(goal="width", width={"contextbias.bi_shift": 0.5})
    row = R.decide_round(config, CB, 1, _current([("a", 0.05, 0.01)])).row(0, named=True)
    assert (row["decision"], row["reason"]) == ("stop", "width reached")


def test_a_round_without_an_interval_is_no_look():
    """A cell whose first round had no standard error gets, at its second (last) round, the
    critical value of a single look at the cap: the fixed design's 1.96."""
    config = _config()
    first = R.decide_round(config, CB, 1, _current([("a", 0.05, None)]))
    assert first["decision"][0] == "continue"
    last = R.decide_round(config, CB, 2, _current([("a", 0.05, 0.04)]), [first])
    assert last["critical"][0] == pytest.approx(stats.norm.isf(0.025), abs=1e-6)


def test_report_section_shows_every_round_and_why_each_cell_stopped():
    from stereolens.report import adaptive as report
    from stereolens.report.inputs import Inputs

    config = _config()
    first = R.decide_round(config, CB, 1, _current([("b", 0.05, 0.05), ("a", 0.5, 0.01)]))
    second = R.decide_round(config, CB, 2, _current([("b", 0.05, 0.04)]), [first])
    table = R.collect([first, second])
    assert report.section(Inputs.from_frames({}), config) == []
    [top] = report.section(Inputs.from_frames({"contextbias_adaptive": table}), config)
    [sub] = top.subsections
    assert "2 cell(s) over 2 round(s)" in sub.paragraphs[0]
    assert "1 cap reached; 1 excludes 0" in sub.paragraphs[0]
    [shown] = sub.tables
    assert shown.frame.height == 3
    assert shown.intervals == {"estimate": ("ci_low", "ci_high")}
    assert "P(|Z_j| < c_j for all j <= k)" in shown.caption


def test_report_and_table_state_the_gpu_hours_cap_the_workflow_cut_the_rounds_to():
    """The table of all rounds records the workflow's Budget (a cap of 5 on the GPU demo, by
    hand in test_a_gpu_hours_cap_cuts_the_rounds_to_whole_shards_by_hand: 2 of 4 shards,
    2 + 2 x 37/36 = 4.06 GPU-hours at the cap, 2 + 4 x 37/36 = 6.11 configured), and the
    report states it in describe_budget's words; without a cap the columns are null and
    the report says nothing of a cap."""
    from stereolens.models.registry import load_registry
    from stereolens.report import adaptive as report
    from stereolens.report.inputs import Inputs

    config = _config()
    first = R.decide_round(config, CB, 1, _current([("b", 0.05, 0.05), ("a", 0.5, 0.01)]))
    second = R.decide_round(config, CB, 2, _current([("b", 0.05, 0.04)]), [first])
    registry = load_registry(ROOT / "config/models.yaml")
    at = R.budget(_gpu_config(gpu_hours_cap=5.0), registry, THROUGHPUT)
    table = R.collect([first, second], at)
    row = table.row(0, named=True)
    assert row["gpu_hours_cap"] == 5.0 and row["fixed_hours"] == 0.0
    assert row["configured_hours"] == pytest.approx(6.1111, abs=1e-4)
    assert row["capped_hours"] == pytest.approx(4.0556, abs=1e-4)
    assert (row["configured_shards"], row["cap_shards"]) == (4, 2)
    assert R.table_budget([table]) == at
    [top] = report.section(Inputs.from_frames({"contextbias_adaptive": table}), config)
    assert top.paragraphs[-1] == (
        "GPU-hours cap 5: the benchmarks that run fixed take 0.00; the rounds' cap ContextBias "
        "2 of 4 shard(s) per cell; the run at the cap 4.06 GPU-hours (configured: 6.11)."
    )
    assert (
        "The rounds' cap: 2 of 4 shard(s) per cell (design.adaptive.gpu_hours_cap 5)."
        in (top.subsections[0].paragraphs[0])
    )
    uncapped = R.collect([first, second], R.budget(config))
    assert uncapped["gpu_hours_cap"].is_null().all() and uncapped["cap_shards"][0] == 2
    assert R.table_budget([uncapped]) is None
    [top] = report.section(Inputs.from_frames({"contextbias_adaptive": uncapped}), config)
    assert len(top.paragraphs) == 1 and "rounds' cap" not in top.subsections[0].paragraphs[0]


def test_contextbias_interim_keeps_a_cell_without_labels_open(tmp_path):
    """An extractor that discarded every image of the rounds so far gives its cell no
    estimate and no standard error: the round continues it instead of failing."""
    from stereolens.atomic import write_jsonl
    from stereolens.contextbias.adaptive import interim

    config = _config()
    paths = []
    for cond in ("CF", "CA-U"):
        rec = {
            "extractor": "v", "model": "g", "role": "nurse", "condition": cond,
            "image_id": f"i-{cond}", "seed": 1, "status": "discarded", "reason": "invalid",
        }  # fmt: skip
        paths.append(str(tmp_path / f"{cond}.jsonl"))
        write_jsonl(paths[-1], [rec])
    current = interim(config, paths)
    row = current.row(0, named=True)
    assert (current.height, row["cell"], row["se"]) == (1, "v / g / CA-U - CF / overall", None)
    assert np.isnan(row["estimate"])
    decided = R.decide_round(config, CB, 1, current).row(0, named=True)
    assert (decided["decision"], decided["reason"]) == ("continue", "open")
    with pytest.raises(ValueError, match="no extraction shard"):
        interim(config, [])


# a GPU generator and extractor at round figures: 100 s per image made and read
THROUGHPUT = {
    "entries": {
        "sdxl": {"seconds_per_image": 60, "status": "estimate", "source": "test"},
        "qwen2.5-vl-7b": {"seconds_per_call": 40, "status": "estimate", "source": "test"},
    }
}


def _gpu_config(**adaptive) -> dict:
    """The adaptive demo on GPU models: 4 seed shards of 37 prompts (nurse CF 3, CA-R 8,
    CA-U 8; carpenter 3, 7, 8) per cell, and the validation prompts (carpenter 5, nurse 3)
    at 9 seeds, which run in full."""
    config = _config(**adaptive)
    cb = config["contextbias"]
    cb["generators"], cb["extractors"] = ["sdxl"], ["qwen2.5-vl-7b"]
    cb["seeds"]["per_prompt"] = 4
    cb["validation"].update(enabled=True, seeds_per_prompt=9)
    return config


def test_a_gpu_hours_cap_cuts_the_rounds_to_whole_shards_by_hand():
    """A shard: 37 images x 100 s = 37/36 GPU-hours; the validation prompts 8 x 9 x 100 s =
    2 GPU-hours; configured 2 + 4 x 37/36 = 6.111. A cap of 5 leaves 3 for the rounds:
    floor(3 / (37/36)) = 2 shards per cell, rounds at 1 and 2, 2 + 2 x 37/36 = 4.056 spent
    at the cap; the jobs of shards 2 and 3 are beyond it."""
    from stereolens.models.registry import load_registry

    registry = load_registry(ROOT / "config/models.yaml")
    config = _gpu_config(gpu_hours_cap=5.0)
    at = R.budget(config, registry, THROUGHPUT)
    assert (at.configured, at.shards) == ({"contextbias": 4}, {"contextbias": 2})
    assert at.fixed_hours == 0.0  # ContextBias alone: nothing else runs fixed
    assert at.configured_hours == pytest.approx(2 + 4 * 37 / 36)
    assert at.capped_hours == pytest.approx(2 + 2 * 37 / 36)
    assert R.sizes(config, CB, at) == [1, 2]
    bounds = R.sizes(config, CB, at)
    got = {(j.wildcards["condition"], j.wildcards["shard"]): R.job_round(CB, j, bounds)
           for j in CB.jobs(config)}  # fmt: skip
    assert got[("CF", 0)] == 1 and got[("CF", 1)] == 2
    assert got[("CF", 2)] == got[("CF", 3)] == 3  # beyond the cap: never made
    assert got[("VAL", 8)] is None  # the validation prompts run in full
    assert R.select(CB, CB.jobs(config), bounds, [1, 2], [{"model": "sdxl"}]) == [
        j for j in CB.jobs(config) if j.wildcards["condition"] != "VAL" and j.wildcards["shard"] < 2
    ]
    assert "contextbias 2 of 4 shard(s) per cell" in R.describe_budget(at)
    # a cap at or above the configured run leaves the configured shards
    assert R.budget(_gpu_config(gpu_hours_cap=6.2), registry, THROUGHPUT).shards == {
        "contextbias": 4
    }
    # one round: one shard (2 + 37/36 = 3.03) fits a cap of 3.1
    one = R.budget(_gpu_config(gpu_hours_cap=3.1, rounds=1), registry, THROUGHPUT)
    assert one.shards == {"contextbias": 1}


def test_the_ceiling_counts_the_jobs_the_capped_rounds_can_make():
    """The GPU demo, per stage (generate, extract): 2 roles x (3 conditions x 4 seed shards +
    9 validation shards) = 42 jobs, 84 in all, 220 images made (4 x 37 + 8 x 9). Under a
    cap of 5 (2 of 4 shards) the rounds make 2 x (3 x 2 + 9) = 30 a stage, 60 jobs, 146
    images (2 x 37 + 72), 4.06 GPU-hours: limits.max_jobs 70 refuses the configured run and
    passes the capped one."""
    from stereolens.models.registry import load_registry
    from stereolens.plan import check_ceiling

    registry = load_registry(ROOT / "config/models.yaml")
    config = _gpu_config()
    config["limits"]["max_jobs"] = 70
    with pytest.raises(ConfigError, match=r"the run is larger than its ceilings: 84 jobs > "):
        check_ceiling(config, registry, THROUGHPUT)
    config["design"]["adaptive"]["gpu_hours_cap"] = 5.0
    got = check_ceiling(config, registry, THROUGHPUT)
    assert (got["jobs"], got["images"], got["capped"]) == (60, 146, True)
    assert got["gpu_hours"] == pytest.approx(2 + 2 * 37 / 36)
    bounds = R.sizes(config, CB, R.budget(config, registry, THROUGHPUT))
    made = [j for j in CB.jobs(config) if R.job_round(CB, j, bounds) in (None, 1, 2)]
    assert len(made) == 60  # the jobs the rounds can make, counted from the job list
    same = check_ceiling(config, registry, THROUGHPUT, R.budget(config, registry, THROUGHPUT))
    assert same == got
    config["limits"]["max_jobs"] = 59
    with pytest.raises(ConfigError, match=r"gpu_hours_cap's shards is larger.*60 jobs > "):
        check_ceiling(config, registry, THROUGHPUT)


def test_a_cap_below_two_rounds_is_refused_naming_the_key_and_the_least_cap():
    from stereolens.models.registry import load_registry

    registry = load_registry(ROOT / "config/models.yaml")
    # two rounds need 2 shards per cell: 2 + 2 x 37/36 = 4.06 GPU-hours
    with pytest.raises(ConfigError, match=r"gpu_hours_cap 4: too small.*at least 4\.06"):
        R.check(_gpu_config(gpu_hours_cap=4.0), registry, THROUGHPUT)
    # one round: one shard, 2 + 37/36 = 3.03
    with pytest.raises(ConfigError, match=r"one shard per cell.*at least 3\.03"):
        R.budget(_gpu_config(gpu_hours_cap=3.0, rounds=1), registry, THROUGHPUT)
    # a model without a throughput figure: the cap cannot be priced
    with pytest.raises(ConfigError, match="no throughput figure for sdxl"):
        R.budget(_gpu_config(gpu_hours_cap=5.0), registry, {"entries": {}})


def test_the_benchmarks_that_run_fixed_take_their_hours_off_the_cap_first():
    """LVLM runs fixed: its configured GPU-hours (the plan's) come off the cap, and the
    rounds get what is left, the same 2 shards as without it."""
    from stereolens.models.registry import load_registry
    from stereolens.plan import benchmark_hours

    registry = load_registry(ROOT / "config/models.yaml")
    demo = yaml.safe_load((ROOT / "config/demo.yaml").read_text())
    throughput = copy.deepcopy(THROUGHPUT)
    throughput["entries"]["qwen3-32b"] = {"seconds_per_call": 5, "status": "estimate",
                                          "source": "test"}  # fmt: skip
    config = _gpu_config()
    config["lvlm"] = {**demo["lvlm"], "models": ["qwen2.5-vl-7b"], "assistant": "qwen3-32b"}
    config = validate_config(config)
    lvlm = benchmark_hours(config, registry, throughput, {"lvlm"})[0]["lvlm"]
    assert lvlm > 0
    config["design"]["adaptive"]["gpu_hours_cap"] = 5.0 + lvlm
    at = R.budget(config, registry, throughput)
    assert at.shards == {"contextbias": 2} and at.fixed_hours == pytest.approx(lvlm)
    assert at.capped_hours == pytest.approx(lvlm + 2 + 2 * 37 / 36)
    config["design"]["adaptive"]["gpu_hours_cap"] = 4.0 + lvlm
    with pytest.raises(ConfigError, match="fixed take"):
        R.budget(config, registry, throughput)


def test_the_paper_config_runs_in_rounds_with_shards_of_two_seeds():
    """docs/planner.md's recipe: config/config.yaml with design.mode adaptive and
    contextbias.seeds.per_shard 2 is 5 shards per cell, rounds at 1, 2 and 5 (2, 4 and 10
    seeds), 30,977 model jobs at the cap, under limits.max_jobs; shards of 1 seed are
    51,917 and refused by the ceiling, one shard of 10 by the rounds."""
    from stereolens.config import load_config
    from stereolens.plan import check_ceiling, default_throughput

    config, registry = load_config(ROOT / "config/config.yaml")
    config["design"]["mode"] = "adaptive"
    throughput = default_throughput()
    with pytest.raises(ConfigError, match="contextbias.seeds.per_shard"):
        R.check(config, registry, throughput)
    config["contextbias"]["seeds"]["per_shard"] = 2
    at = R.check(config, registry, throughput)
    assert R.sizes(config, CB, at) == [1, 2, 5]
    assert check_ceiling(config, registry, throughput)["jobs"] == 30_977
    config["contextbias"]["seeds"]["per_shard"] = 1
    with pytest.raises(ConfigError, match=r"51,917 jobs > limits.max_jobs = 50,000"):
        check_ceiling(config, registry, throughput)
