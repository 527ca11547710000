# Input functions of the adaptive design's rounds (design.mode adaptive, issue 23;
# stereolens.design.rounds, docs/planner.md "Adaptive design"; the rules are in
# workflow/rules/adaptive.smk), for every enabled benchmark whose plug-in has `rounds`.
# Round k of a group (the generator) is a checkpoint: its interim analysis reads the shards
# of rounds 1..k of the cells still open and writes the round's decisions; the functions
# below read those tables to request the next round's shards only for the cells left open,
# and to give the benchmark's merges the shards its cells ran. A shard's path is the fixed
# design's: a finished round is never recomputed, and a model added later gets rounds of
# its own (its own checkpoints), leaving the others' untouched.

from stereolens.design import rounds as adaptive_rounds
from stereolens.layout import ADAPTIVE

ROUNDS = {p.name: p for p in adaptive_rounds.in_rounds(config)}


@lru_cache(maxsize=None)
def round_budget():
    """The rounds' cap: the configured shards, or those design.adaptive.gpu_hours_cap
    affords (stereolens.design.rounds.budget, priced with config/throughput.yaml; checked
    in the main process by common.smk)."""
    if CHECKED_BUDGET is not None:
        return CHECKED_BUDGET
    return adaptive_rounds.budget(config, REGISTRY, default_throughput())


@lru_cache(maxsize=None)
def round_bounds(name):
    """Cumulative shards of a cell after each round of benchmark ``name``."""
    return tuple(adaptive_rounds.sizes(config, ROUNDS[name], round_budget()))


@lru_cache(maxsize=None)
def round_group_jobs(name, group):
    """The model jobs of one group (the rounds' first cell key: the generator)."""
    key = ROUNDS[name].rounds.keys[0]
    return tuple(j for j in plugin_jobs(name) if j.wildcards.get(key) == group)


@lru_cache(maxsize=None)
def round_groups(name):
    """The groups of benchmark ``name`` that run in rounds, in its job order."""
    plugin = ROUNDS[name]
    key = plugin.rounds.keys[0]
    bounds = round_bounds(name)
    found = (
        j.wildcards[key]
        for j in plugin_jobs(name)
        if adaptive_rounds.job_round(plugin, j, bounds) is not None
    )
    return tuple(dict.fromkeys(found))


def round_table(name, round_, group):
    """Round ``round_``'s decisions of one group: its checkpoint's output (asking for it
    before the round has run makes Snakemake run it, then evaluate again)."""
    import polars as pl

    job = checkpoints.adaptive_round.get(benchmark=name, round=round_, model=group)
    return pl.read_parquet(job.output[0])


def round_plan(name, group, upto):
    """[(round, the cells open before it)] of rounds 1..``upto`` that run (a round after
    every cell has stopped does not)."""
    plugin = ROUNDS[name]
    cells = adaptive_rounds.all_cells(plugin, round_group_jobs(name, group), group)
    out = []
    for k in range(1, upto + 1):
        if not cells:
            break
        out.append((k, cells))
        if k < upto:
            cells = adaptive_rounds.open_cells(round_table(name, k, group), plugin.rounds.keys)
    return out


def rounds_run(name, group):
    """The rounds of one group up to the one where its last cell stopped."""
    plan = round_plan(name, group, len(round_bounds(name)))
    last = plan[-1][0]
    # the last round's own decisions: every cell stops at the cap; earlier, the table
    # leaves none open only when the plan stopped there
    round_table(name, last, group)
    return plan


def run_jobs(name, group=None):
    """The model jobs of benchmark ``name`` (of one group: its rounds' first cell key, the
    generator) the run makes: all of the fixed design's, or in rounds the jobs outside the
    rounds and each cell's shards up to its stopping round. Reads the rounds' checkpoints:
    call it from input functions only."""
    if name not in ROUNDS:
        return plugin_jobs(name) if group is None else round_group_jobs(name, group)
    plugin = ROUNDS[name]
    bounds = round_bounds(name)
    jobs = plugin_jobs(name) if group is None else round_group_jobs(name, group)
    out = [j for j in jobs if adaptive_rounds.job_round(plugin, j, bounds) is None]
    for g in round_groups(name) if group is None else [group]:
        mine = round_group_jobs(name, g)
        for k, cells in rounds_run(name, g) if mine else []:
            out += adaptive_rounds.select(plugin, mine, bounds, [k], cells)
    return out


def get_adaptive_round_input(wildcards):
    """A round's interim inputs: the shards of rounds 1..k (of the stage its plug-in's
    interim reads) of the cells still open, and the group's earlier rounds' tables."""
    name, k, group = wildcards.benchmark, int(wildcards.round), wildcards.model
    if name not in ROUNDS or not 1 <= k <= len(round_bounds(name)):
        raise ValueError(
            f"{ADAPTIVE.path('round', benchmark=name, round=k, model=group)}: no such round "
            f"(benchmarks in rounds: {', '.join(ROUNDS) or 'none'}; design.mode adaptive)"
        )
    plugin = ROUNDS[name]
    plan = round_plan(name, group, k)
    if len(plan) < k:
        raise ValueError(f"{name} {group}: every cell stopped before round {k}")
    shards = adaptive_rounds.select(
        plugin, round_group_jobs(name, group), round_bounds(name), range(1, k + 1),
        plan[-1][1], stage=plugin.rounds.reads,
    )  # fmt: skip
    return {
        "shards": [j.output for j in shards],
        "previous": [
            ADAPTIVE.path("round", benchmark=name, round=r, model=group) for r in range(1, k)
        ],
    }


def get_adaptive_settings(wildcards):
    """What decides a round's table besides its inputs (a param: a change reruns the
    rounds): the design's level and rule, the benchmark's interim settings."""
    plugin = ROUNDS[wildcards.benchmark]
    section = config[plugin.name]
    return json.dumps(
        {
            "level": config["design"]["level"],
            "adaptive": config["design"]["adaptive"],
            plugin.name: {k: section[k] for k in plugin.rounds.settings},
            # a cap's shards per cell (they follow the throughput table too)
            **({"cap": round_bounds(plugin.name)[-1]} if round_budget().cap else {}),
        },
        sort_keys=True,
    )


def get_adaptive_budget(wildcards):
    """The rounds' cap the run was cut with (round_budget) as JSON, which the table of all
    rounds records (a change of the cap or its pricing reruns that table alone)."""
    from dataclasses import asdict

    return json.dumps(asdict(round_budget()), sort_keys=True)


def get_adaptive_decisions_input(wildcards):
    """Every round's table of every group of the benchmark, up to its stopping round."""
    name = wildcards.benchmark
    return [
        ADAPTIVE.path("round", benchmark=name, round=k, model=group)
        for group in round_groups(name)
        for k, _ in rounds_run(name, group)
    ]
