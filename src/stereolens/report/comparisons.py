"""The report's model comparisons (issue 20, item 3): on the first screen, per benchmark and
headline metric, the models in rank order with their rank intervals and the groups that cannot
be told apart; below, a section with every pair's difference, interval and Holm decision.
Each benchmark's metrics write ``<KEY>_comparisons`` and ``<KEY>_ranks``
(stereolens.metrics.compare)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import polars as pl

from stereolens.report.html import Section, Table, format_value
from stereolens.report.inputs import Inputs

CAPTION = (
    "Every pair of models on each headline metric: difference = model b - model a, its 95% "
    "interval = difference +- 1.96 x the bootstrap standard error of the difference (paired "
    "where the design shows every model the same units: see 'resampling'), the two-sided Wald "
    "p-value, and Holm's adjustment over the family of all pairs of one metric and scope; "
    "'reject' = the adjusted p-value is below 0.05. The planner's minimum detectable "
    "differences refer to this test."
)
RANK_CAPTION = (
    "Rank 1 = the least biased estimate. The rank interval [low, high] counts the models "
    "significantly less biased (low = 1 + that number) and significantly more biased (high = "
    "K - that number) after Holm's adjustment; models in one group cannot be told apart from "
    "the group's first model."
)


@dataclass(frozen=True)
class Family:
    metric: str
    scope: str
    ordering: str
    decided: str


@dataclass(frozen=True)
class Block:
    title: str
    families: list[Family]


def _tables(inputs: Inputs, key: str) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    return inputs.get(f"{key}_comparisons"), inputs.get(f"{key}_ranks")


def ordering(ranks: pl.DataFrame) -> str:
    """'a [1-2] ≈ b [1-2] < c [3]': the models of one family in rank order, '≈' inside a
    group, '<' between groups (less biased first)."""
    parts: list[str] = []
    last = None
    for r in ranks.sort("group", "rank", "model").iter_rows(named=True):
        interval = (
            f"{r['rank_low']}" if r["rank_low"] == r["rank_high"]
            else f"{r['rank_low']}-{r['rank_high']}"
        )  # fmt: skip
        if last is not None:
            parts.append("≈" if r["group"] == last else "<")
        parts.append(f"{r['model']} {format_value(r['estimate'])} [{interval}]")
        last = r["group"]
    return " ".join(parts)


def _families(cmp: pl.DataFrame | None, ranks: pl.DataFrame) -> list[Family]:
    out = []
    for (metric, scope), part in ranks.group_by(["metric", "scope"], maintain_order=True):
        pairs = (
            cmp.filter((pl.col("metric") == metric) & (pl.col("scope") == scope))
            if cmp is not None and cmp.height
            else None
        )
        if pairs is None or pairs.height == 0:
            decided = "one model: nothing to compare"
        else:
            decided = f"{int(pairs['reject'].sum())} of {pairs.height} pairs differ (Holm, 5%)"
        out.append(Family(str(metric), str(scope), ordering(part), decided))
    return out


def blocks(inputs: Inputs, modules: Sequence[ModuleType]) -> list[Block]:
    """One block per benchmark whose metrics wrote a ranks table: its families of
    two or more models (the first screen leaves out the others), or one line saying that a
    single model leaves nothing to compare."""
    out = []
    for mod in modules:
        cmp, ranks = _tables(inputs, mod.KEY)
        if ranks is None:
            continue
        families = [f for f in _families(cmp, ranks) if not f.decided.startswith("one model")]
        if not families:
            models = ", ".join(sorted(ranks["model"].unique().to_list()))
            families = [Family("all", "", models, "one model in this run: nothing to compare")]
        out.append(Block(mod.TITLE, families))
    return out


def section(inputs: Inputs, modules: Sequence[ModuleType]) -> Section | None:
    """Every comparison and rank table, one subsection per benchmark."""
    subs = []
    for mod in modules:
        cmp, ranks = _tables(inputs, mod.KEY)
        tables = []
        if ranks is not None and ranks.height:
            tables.append(
                Table(f"{mod.KEY}-ranks", "Ranks and groups", RANK_CAPTION,
                      ranks.drop("benchmark"))
            )  # fmt: skip
        if cmp is not None and cmp.height:
            shown = cmp.select(
                "metric", "scope", "model_a", "model_b", "relation", "difference", "ci_low",
                "ci_high", "p_value", "p_adjusted", "reject", "resampling",
            )  # fmt: skip
            tables.append(
                Table(f"{mod.KEY}-comparisons", "Differences between models", CAPTION, shown,
                      intervals={"difference": ("ci_low", "ci_high")}, csv=cmp)
            )  # fmt: skip
        if tables:
            subs.append(Section(f"{mod.KEY}-compare", mod.TITLE, tables=tables))
    if not subs:
        return None
    return Section(
        "comparisons",
        "Comparisons between models",
        paragraphs=[
            "Is model B less biased than model A? Each benchmark's headline metrics, every "
            "pair of its models (a debiasing variant against its base model marked "
            "'variant_vs_base'), with the test the planner's detectable differences refer to."
        ],
        subsections=subs,
    )
