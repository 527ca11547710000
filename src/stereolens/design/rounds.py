"""The workflow's adaptive rounds (``design.mode: adaptive``): each model job's round, a round's
interim decision from a plug-in's :class:`~stereolens.benchmark.Rounds` estimate, and the
run's table of all rounds (docs/planner.md, "Adaptive design": "Rounds", "The decision")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stereolens.benchmark import Benchmark, Job, benchmarks
from stereolens.validation import ConfigError

if TYPE_CHECKING:  # the workflow imports this module at parse time: scipy, polars lazily
    import polars as pl

    from stereolens.design import adaptive as A

EXTRA_COLUMNS = ("benchmark", "effect", "shards", "df", "goal")
"""Columns of a round's table besides :data:`~stereolens.design.adaptive.DECISION_COLUMNS`
and the cell's keys: the benchmark, the headline effect's planner name, the cumulative shards
the round's estimate is on, the t quantile's degrees of freedom (null: normal) and the goal
in words."""


def _rule(config: dict) -> A.Rule:
    from stereolens.design.adaptive_plan import rule_from

    return rule_from(config["design"]["adaptive"], config["design"]["level"])


def adaptive(config: dict) -> bool:
    """Whether the config runs the adaptive design (design.mode adaptive)."""
    return config["design"]["mode"] == "adaptive"


def in_rounds(config: dict) -> list[Benchmark]:
    """The enabled benchmarks that run in rounds: none in the fixed design; in the adaptive
    one those whose plug-in has ``rounds`` (the others run their fixed design)."""
    if not adaptive(config):
        return []
    return [p for p in benchmarks(config) if p.rounds is not None]


def check(config: dict) -> None:
    """Refuse, at parse time, an adaptive config the workflow cannot run: a GPU-hours cap
    (the planner's; the workflow's cap is the configured size), goal width without a
    target, equivalence without a margin, rounds that collapse into one (too few shards)."""
    if not in_rounds(config):
        return
    options = config["design"]["adaptive"]
    if options["gpu_hours_cap"] is not None:
        raise ConfigError(
            "design.adaptive.gpu_hours_cap: the workflow's rounds stop at the configured "
            "size; set the benchmark's size to the cap `stereolens plan` gives for it and "
            "gpu_hours_cap to null"
        )
    rule = _rule(config)  # its own errors name the key
    for plugin in in_rounds(config):
        assert plugin.rounds is not None and plugin.rounds.shards is not None
        cap = plugin.rounds.shards(config)
        if rule.rounds > 1 and len(rule.sizes(cap)) < 2:
            raise ConfigError(
                f"design.adaptive.rounds {rule.rounds}: {plugin.name} has {cap} shard(s) per "
                f"cell, so its rounds collapse into one; a round is made of whole shards: "
                f"make them smaller ({plugin.rounds.shard_key or 'its shard size'})"
            )
    if options["goal"] == "width" and not options["width"]:
        raise ConfigError(
            "design.adaptive.goal width needs design.adaptive.width: a target width per "
            "headline effect (names as `stereolens plan --power` prints them)"
        )
    if options["goal"] == "equivalence" and not options["margin"]:
        raise ConfigError(
            "design.adaptive.goal equivalence needs design.adaptive.margin: a margin per "
            "headline effect (names as `stereolens plan --power` prints them)"
        )


def sizes(config: dict, plugin: Benchmark) -> list[int]:
    """Cumulative shards of a cell after each round (the last the cap)."""
    assert plugin.rounds is not None and plugin.rounds.shards is not None
    return _rule(config).sizes(plugin.rounds.shards(config))


def job_round(plugin: Benchmark, job: Job, bounds: Sequence[int]) -> int | None:
    """The round (1-based) whose shards hold ``job``; None: the job is not part of the
    rounds (it runs in full)."""
    r = plugin.rounds
    assert r is not None
    if "shard" not in job.wildcards or (r.in_rounds is not None and not r.in_rounds(job)):
        return None
    shard = int(job.wildcards["shard"])
    for k, n in enumerate(bounds, start=1):
        if shard < n:
            return k
    return None  # beyond the cap: never requested


def belongs(job: Job, cell: Mapping[str, Any]) -> bool:
    """A job belongs to a cell when it agrees on the cell keys it has."""
    return all(job.wildcards[k] == v for k, v in cell.items() if k in job.wildcards)


def open_cells(table: pl.DataFrame, keys: Sequence[str]) -> list[dict[str, Any]]:
    """The cells a round's decision table leaves open (decision continue), as key dicts."""
    import polars as pl

    rows = table.filter(pl.col("decision") == "continue").select(keys).unique(maintain_order=True)
    return rows.to_dicts()


def all_cells(plugin: Benchmark, jobs: Iterable[Job], group: str) -> list[dict[str, Any]]:
    """Every cell of one group (the first key's value): the key values of its ``reads``
    jobs in the rounds."""
    r = plugin.rounds
    assert r is not None
    out: dict[tuple, dict[str, Any]] = {}
    for job in jobs:
        w = job.wildcards
        if job.stage == r.reads and w.get(r.keys[0]) == group and job_round(plugin, job, [10**18]):
            out.setdefault(tuple(w[k] for k in r.keys), {k: w[k] for k in r.keys})
    return list(out.values())


def select(
    plugin: Benchmark,
    jobs: Iterable[Job],
    bounds: Sequence[int],
    rounds: Iterable[int],
    cells: Sequence[Mapping[str, Any]],
    stage: str | None = None,
) -> list[Job]:
    """The jobs of ``rounds`` (and ``stage``) that belong to one of ``cells``."""
    wanted = set(rounds)
    return [
        job
        for job in jobs
        if (stage is None or job.stage == stage)
        and job_round(plugin, job, bounds) in wanted
        and any(belongs(job, c) for c in cells)
    ]


def _goal(options: dict[str, Any], effect: str) -> A.Goal:
    from stereolens.design import adaptive as A

    kind = options["goal"]
    base = effect.split(":")[0]  # a generator's effect, else the benchmark's
    width = options["width"].get(effect, options["width"].get(base))
    margin = options["margin"].get(effect, options["margin"].get(base))
    if kind == "width" and not width:
        raise ConfigError(
            f"design.adaptive.width has no target for {effect!r} (goal width): add "
            f"`{base}: <width>` (or `{effect}: <width>` for this cell alone)"
        )
    if kind == "equivalence" and not margin:
        raise ConfigError(
            f"design.adaptive.margin has no margin for {effect!r} (goal equivalence): add "
            f"`{base}: <margin>` (or `{effect}: <margin>` for this cell alone)"
        )
    return A.Goal(kind, width=width, margin=margin)


def _describe(goal: A.Goal) -> str:
    if goal.kind == "width":
        return f"RCI width <= {goal.width:g}"
    if goal.kind == "equivalence":
        return f"RCI within 0 +- {goal.margin:g}"
    return "RCI excludes 0" + (f", or within +- {goal.margin:g}" if goal.margin else "")


def decide_round(
    config: dict,
    plugin: Benchmark,
    round_: int,
    current: pl.DataFrame,
    previous: Sequence[pl.DataFrame] = (),
) -> pl.DataFrame:
    """Round ``round_``'s decision table: one row per cell of ``current`` (the interim
    estimate: keys, cell, effect, estimate, se, df), its critical value from the
    information of the cell's rows in ``previous`` (rounds 1..round_ - 1) and this one.
    Columns: DECISION_COLUMNS, then the cell keys and EXTRA_COLUMNS."""
    import numpy as np
    import polars as pl

    from stereolens.design import adaptive as A
    from stereolens.design.adaptive_plan import to_t

    r = plugin.rounds
    assert r is not None
    bounds = sizes(config, plugin)
    if not 1 <= round_ <= len(bounds):
        raise ValueError(f"{plugin.name}: round {round_} of {len(bounds)}")
    rule = _rule(config)
    options = config["design"]["adaptive"]
    last = round_ == len(bounds)
    earlier = pl.concat(previous, how="vertical_relaxed") if previous else None
    frames = []
    for row in current.iter_rows(named=True):
        looks = [(round_, row["se"])]
        if earlier is not None:
            mine = earlier.filter(pl.col("cell") == row["cell"]).sort("round")
            looks = [*zip(mine["round"], mine["se"], strict=True), *looks]
        # the rounds with an interval are the looks: one without spent nothing, and its
        # alpha carries over to the next look (Lan-DeMets: looks need not be planned)
        looks = [(k, s) for k, s in looks if s is not None and np.isfinite(s) and s > 0]
        critical = float("nan")
        if looks and looks[-1][0] == round_:
            info = np.maximum.accumulate([1.0 / s**2 for _, s in looks])
            at = [bounds[k - 1] for k, _ in looks] + list(bounds[round_:])
            c = rule.critical(at, info=info)[-1]
            critical = float(to_t(np.array([c]), row["df"])[0])
        goal = _goal(options, row["effect"])
        table = A.decision_table(
            round_, [row["cell"]], [row["estimate"]], [row["se"]], critical, goal, last
        )
        frames.append(
            table.with_columns(
                *(pl.lit(row[k], pl.String).alias(k) for k in r.keys),
                pl.lit(plugin.name).alias("benchmark"),
                pl.lit(row["effect"]).alias("effect"),
                pl.lit(bounds[round_ - 1], pl.Int64).alias("shards"),
                pl.lit(row["df"], pl.Int64).alias("df"),
                pl.lit(_describe(goal)).alias("goal"),
            )
        )
    if not frames:
        raise ValueError(f"{plugin.name} round {round_}: the interim estimate has no cell")
    return pl.concat(frames, how="vertical_relaxed")


def collect(tables: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """The run's decision table: every round of every group, sorted by benchmark, the
    round's group, cell and round."""
    import polars as pl

    frames = [t for t in tables if t.height]
    if not frames:
        raise ValueError("no round has a decision: the rounds' tables are empty")
    out = pl.concat(frames, how="diagonal_relaxed")
    first = [c for c in ("benchmark", "model", "cell", "round") if c in out.columns]
    return out.sort(first)
