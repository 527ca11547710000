"""The report's section of the adaptive design (design.mode adaptive): every
round of every benchmark that ran in rounds, and why each cell stopped, from
results/<benchmark>/adaptive/decisions.parquet (stereolens.design.rounds)."""

from __future__ import annotations

from stereolens.benchmark import benchmarks
from stereolens.design.rounds import describe_budget, table_budget
from stereolens.layout import adaptive_table
from stereolens.report.html import Section, Table
from stereolens.report.inputs import Inputs

CAPTION = (
    "One row per cell and round. estimate and se: the benchmark's headline estimate on the "
    "shards of rounds 1..k and its bootstrap standard error (ContextBias: BI(CA-U) - "
    "BI(CF), overall, bias-corrected, 2 x the plug-in - the replicates' mean; se = the role "
    "bootstrap replicates' sd x sqrt(R / (R - 1)), as bootstrap.parquet's bc-t interval); "
    "shards: the cumulative seed shards per role x condition. critical: c_k of the "
    "group-sequential rule, P(|Z_j| < c_j for all j <= k) = 1 - alpha(t_k) under the "
    "canonical joint normal with corr(Z_j, Z_k) = sqrt(I_j / I_k), I = 1 / se^2, "
    "alpha(t) the design's spending function at the information time t_k = I_k / (I_k x "
    "cap / shards_k) (the last round spends what is left), moved to the t(df) quantile of "
    "the same tail probability. The repeated confidence interval estimate +- critical x se "
    "holds for all rounds at once with probability 1 - alpha, so the interval at whatever "
    "round a cell stopped keeps its coverage. decision: stop when the goal holds (reason), "
    "or at the last round ('cap reached'); continue ('open') requests the next round's "
    "shards for that cell only. A cell without a standard error (fewer roles than "
    "contextbias.metrics.interval_min_roles) continues to the cap."
)


def section(inputs: Inputs, config: dict) -> list[Section]:
    """The adaptive design's section (none in the fixed design)."""
    subs, tables = [], []
    for plugin in benchmarks():
        table = inputs.get(adaptive_table(plugin.name))
        if table is None or not table.height:
            continue
        tables.append(table)
        last = table.sort("round").group_by("cell", maintain_order=True).last()
        stops = last.group_by("reason").len().sort("reason")
        why = "; ".join(f"{n} {r}" for r, n in stops.iter_rows())
        summary = (
            f"{last.height} cell(s) over {table['round'].max()} round(s); where they "
            f"stopped: {why}. Goal: {table['goal'][0]}."
        )
        cut = table_budget([table])
        if cut is not None:
            n = cut.shards[plugin.name]
            summary += (
                f" The rounds' cap: {n} of {cut.configured[plugin.name]} shard(s) per cell "
                f"(design.adaptive.gpu_hours_cap {cut.cap:g})."
            )
        keys = [c for c in plugin.rounds.keys if c in table.columns] if plugin.rounds else []
        shown = table.select(
            "round", *keys, "cell", "shards", "estimate", "se", "critical", "ci_low",
            "ci_high", "decision", "reason",
        ).sort(*keys, "cell", "round")  # fmt: skip
        subs.append(
            Section(
                f"{plugin.name}-adaptive",
                plugin.title,
                paragraphs=[summary],
                tables=[
                    Table(
                        f"{plugin.name}-adaptive-rounds",
                        "Rounds and decisions",
                        CAPTION,
                        shown,
                        intervals={"estimate": ("ci_low", "ci_high")},
                        csv=table,
                    )
                ],
            )  # fmt: skip
        )
    if not subs:
        return []
    paragraphs = [
        "The run spent its model jobs in rounds (design.mode adaptive): after each "
        "round an interim analysis stopped the cells whose question was settled, "
        "and only the open cells got the next round's shards. The intervals are "
        "repeated confidence intervals, valid whatever round a cell stopped at."
    ]
    at = table_budget(tables)
    if at is not None:  # the workflow's own budget, in stereolens plan's words
        titles = {p.name: p.title for p in benchmarks()}
        paragraphs.append(describe_budget(at, titles) + ".")
    return [
        Section(
            "adaptive", "Adaptive design: rounds and stopping", paragraphs=paragraphs,
            subsections=subs,
        )
    ]  # fmt: skip
