"""The workflow's adaptive rounds (``design.mode: adaptive``): each model job's round, a round's
interim decision from a plug-in's :class:`~stereolens.benchmark.Rounds` estimate, and the
run's table of all rounds (docs/planner.md, "Adaptive design": "Rounds", "The decision")."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stereolens.benchmark import Benchmark, Job, benchmarks
from stereolens.validation import ConfigError

if TYPE_CHECKING:  # the workflow imports this module at parse time: scipy, polars lazily
    import polars as pl

    from stereolens.design import adaptive as A

EXTRA_COLUMNS = ("benchmark", "effect", "shards", "df", "goal")
"""Columns of a round's table besides :data:`~stereolens.design.adaptive.DECISION_COLUMNS`
and the cell's keys."""


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


@dataclass(frozen=True)
class Budget:
    """What design.adaptive.gpu_hours_cap does to a run (:func:`budget`): shards per cell
    configured and at the cap per benchmark in rounds, and the run's GPU-hours."""

    cap: float | None
    """design.adaptive.gpu_hours_cap (None: the configured sizes are the cap)."""
    configured: dict[str, int]
    shards: dict[str, int]
    """Shards per cell at the cap (the last round's size)."""
    fixed_hours: float = 0.0
    """The benchmarks that run fixed, at their configured size."""
    configured_hours: float = 0.0
    """The whole run at its configured sizes."""
    capped_hours: float = 0.0
    """The whole run with every cell of the rounds at the cap."""


def capped_config(config: dict, shards: Mapping[str, int]) -> dict:
    """``config`` with each benchmark of ``shards`` cut to that many shards per cell (its
    plug-in's ``rounds.capped``); the others as configured."""
    for plugin in in_rounds(config):
        r = plugin.rounds
        assert r is not None and r.shards is not None
        n = shards.get(plugin.name, r.shards(config))
        if n < r.shards(config):
            if r.capped is None:
                raise ConfigError(
                    f"design.adaptive.gpu_hours_cap: {plugin.name}'s rounds cannot be cut "
                    "below its configured size; set gpu_hours_cap to null"
                )
            config = r.capped(config, n)
    return config


def budget(config: dict, registry: dict | None = None, throughput: dict | None = None) -> Budget:
    """The rounds' cap under design.adaptive.gpu_hours_cap: the benchmarks in rounds get the
    largest share f of their configured shards (floor(f S) per cell) that fits the cap
    after the fixed benchmarks' GPU-hours; a ConfigError names the smallest cap that works.
    ``registry``, ``throughput``: the workflow's when None."""
    plugins = in_rounds(config)
    configured = {}
    for p in plugins:
        assert p.rounds is not None and p.rounds.shards is not None
        configured[p.name] = p.rounds.shards(config)
    cap = config["design"]["adaptive"]["gpu_hours_cap"]
    if cap is None or not plugins:
        return Budget(None, configured, dict(configured))
    from stereolens.cost import benchmark_hours, default_throughput

    if registry is None:
        from stereolens.models.registry import load_registry

        registry = load_registry(config["registry"])
    if throughput is None:
        throughput = default_throughput()
    names = set(configured)
    hours, unknown = benchmark_hours(config, registry, throughput)
    if unknown:
        raise ConfigError(
            f"design.adaptive.gpu_hours_cap: no throughput figure for {', '.join(unknown)}, so "
            "the run's GPU-hours are unknown; add them to the throughput table "
            "(config/throughput.yaml) or set gpu_hours_cap to null"
        )
    fixed = sum(h for b, h in hours.items() if b not in names)
    full = sum(hours.values())

    def shards_at(f: float) -> dict[str, int]:
        return {b: int(f * n + 1e-9) for b, n in configured.items()}

    costs: dict[float, float] = {}

    def cost(f: float) -> float:
        if f not in costs:
            new = capped_config(config, shards_at(f))
            got, _ = benchmark_hours(new, registry, throughput, names)
            costs[f] = fixed + sum(got.values())
        return costs[f]

    def done(f: float) -> Budget:
        return Budget(cap, configured, shards_at(f), fixed, full, cost(f))

    if full <= cap:
        return done(1.0)
    least = max(1 / n for n in configured.values())  # one shard per cell
    rule = _rule(config)
    if rule.rounds > 1:  # two rounds need this many shards per cell (check: S allows them)
        least = max(
            min([s for s in range(1, n + 1) if len(rule.sizes(s)) >= 2] or [1]) / n
            for n in configured.values()
        )
    steps = sorted({s / n for n in configured.values() for s in range(1, n + 1)})
    steps = [f for f in steps if f >= least - 1e-12]
    if cost(steps[0]) > cap:
        what = "one shard per cell" if rule.rounds == 1 else "two rounds of whole shards"
        at = ", ".join(f"{b} {n} of {configured[b]}" for b, n in shards_at(steps[0]).items())
        least_cap = math.ceil(cost(steps[0]) * 100) / 100  # rounded up: the printed cap works
        raise ConfigError(
            f"design.adaptive.gpu_hours_cap {cap:g}: too small: the benchmarks that run "
            f"fixed take {fixed:,.2f} GPU-hours, and {what} ({at} shards per cell) need a "
            f"cap of at least {least_cap:,.2f} GPU-hours (the configured run: "
            f"{full:,.2f}); raise it, or make the fixed benchmarks smaller"
        )
    lo, hi = 0, len(steps) - 1  # steps[lo] fits; the largest that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(steps[mid]) <= cap else (lo, mid - 1)
    return done(steps[lo])


def describe_budget(at: Budget, titles: Mapping[str, str] | None = None) -> str:
    """The cap's effect in words (`stereolens plan`, `stereolens check-config`)."""
    titles = titles or {}
    if not at.shards:
        return "no benchmark runs in rounds (a GPU-hours cap applies to the rounds alone)"
    cut = ", ".join(
        f"{titles.get(b, b)} {n} of {at.configured[b]} shard(s) per cell"
        for b, n in at.shards.items()
    )
    if at.cap is None:
        return f"no GPU-hours cap: the rounds run to the configured size ({cut})"
    return (
        f"GPU-hours cap {at.cap:g}: the benchmarks that run fixed take {at.fixed_hours:,.2f}; "
        f"the rounds' cap {cut}; the run at the cap {at.capped_hours:,.2f} GPU-hours "
        f"(configured: {at.configured_hours:,.2f})"
    )


def check(
    config: dict, registry: dict | None = None, throughput: dict | None = None
) -> Budget | None:
    """Refuse, at parse time, an adaptive config the workflow cannot run (a goal without its
    width or margin, rounds that collapse into one, a GPU-hours cap it cannot meet)."""
    if not in_rounds(config):
        return
    options = config["design"]["adaptive"]
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
    return budget(config, registry, throughput)


def sizes(config: dict, plugin: Benchmark, at: Budget | None = None) -> list[int]:
    """Cumulative shards of a cell after each round (the last the cap: the configured
    shards, or those design.adaptive.gpu_hours_cap affords: ``at``, else :func:`budget`)."""
    return _rule(config).sizes((at or budget(config)).shards[plugin.name])


def job_round(plugin: Benchmark, job: Job, bounds: Sequence[int]) -> int | None:
    """The round (1-based) whose shards hold ``job``; None: the job is not part of the
    rounds (it runs in full); len(bounds) + 1: beyond the cap (never made)."""
    r = plugin.rounds
    assert r is not None
    if "shard" not in job.wildcards or (r.in_rounds is not None and not r.in_rounds(job)):
        return None
    shard = int(job.wildcards["shard"])
    for k, n in enumerate(bounds, start=1):
        if shard < n:
            return k
    return len(bounds) + 1


def belongs(job: Job, cell: Mapping[str, Any]) -> bool:
    """A job belongs to a cell when it agrees on the cell keys it has."""
    return all(job.wildcards[k] == v for k, v in cell.items() if k in job.wildcards)


def open_cells(table: pl.DataFrame, keys: Sequence[str]) -> list[dict[str, Any]]:
    """The cells a round's decision table leaves open (decision continue), as key dicts."""
    import polars as pl

    rows = table.filter(pl.col("decision") == "continue").select(keys).unique(maintain_order=True)
    return rows.to_dicts()


def all_cells(plugin: Benchmark, jobs: Iterable[Job], group: str) -> list[dict[str, Any]]:
    """Every cell of one group: the key values of its ``reads`` jobs in the rounds."""
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
    """Round ``round_``'s decision table, one row per cell of ``current`` (keys, cell,
    effect, estimate, se, df), critical values from the information in ``previous`` and
    this round. Columns: DECISION_COLUMNS, the cell keys, EXTRA_COLUMNS."""
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


BUDGET_COLUMNS = (
    "gpu_hours_cap", "fixed_hours", "configured_hours", "capped_hours", "configured_shards",
    "cap_shards",
)  # fmt: skip
"""Columns of the run's decision table (:func:`collect`) from the :class:`Budget` the
workflow cut its rounds with: the cap and the run's GPU-hours (null without a cap), the
benchmark's shards per cell configured and at the cap."""


def collect(tables: Sequence[pl.DataFrame], at: Budget | None = None) -> pl.DataFrame:
    """The run's decision table, every round of every group, sorted (``at``: BUDGET_COLUMNS)."""
    import polars as pl

    frames = [t for t in tables if t.height]
    if not frames:
        raise ValueError("no round has a decision: the rounds' tables are empty")
    out = pl.concat(frames, how="diagonal_relaxed")
    first = [c for c in ("benchmark", "model", "cell", "round") if c in out.columns]
    out = out.sort(first)
    if at is None:
        return out
    capped = at.cap is not None
    hours = {"gpu_hours_cap": at.cap, "fixed_hours": at.fixed_hours,
             "configured_hours": at.configured_hours, "capped_hours": at.capped_hours}  # fmt: skip
    bench = pl.col("benchmark")
    return out.with_columns(
        *(pl.lit(v if capped else None, pl.Float64).alias(k) for k, v in hours.items()),
        bench.replace_strict(at.configured, default=None, return_dtype=pl.Int64).alias(
            "configured_shards"
        ),
        bench.replace_strict(at.shards, default=None, return_dtype=pl.Int64).alias("cap_shards"),
    )


def table_budget(tables: Iterable[pl.DataFrame]) -> Budget | None:
    """The :class:`Budget` the run's decision tables record; None without a GPU-hours cap."""
    rows = [t.row(0, named=True) for t in tables if t.height and "gpu_hours_cap" in t.columns]
    rows = [r for r in rows if r["gpu_hours_cap"] is not None]
    if not rows:
        return None
    first = rows[0]
    return Budget(
        first["gpu_hours_cap"],
        {r["benchmark"]: r["configured_shards"] for r in rows},
        {r["benchmark"]: r["cap_shards"] for r in rows},
        first["fixed_hours"],
        first["configured_hours"],
        first["capped_hours"],
    )
