"""The report's model comparisons: on the first screen the models in rank order with their rank
intervals and the groups that cannot be told apart; below, every pair's difference, interval
and Holm decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import polars as pl

from stereolens.report.html import NOTE_COLUMN, Section, Table, format_value, withheld_text
from stereolens.report.inputs import Inputs

CAPTION = (
    "Every pair of models on each headline metric: difference = model b - model a, its 95% "
    "interval = difference +- 1.96 x the bootstrap standard error of the difference (paired "
    "where the design shows every model the same units: see 'resampling'; ContextBias: the "
    "bias-corrected difference +- t(R - 1) x the role jackknife's standard error, R = the "
    "roles), the two-sided Wald p-value, and Holm's adjustment over the family of all pairs "
    "of one metric and scope; "
    "'reject' = the adjusted p-value is below 0.05. The planner's minimum detectable "
    "differences refer to this test. Where the design is smaller than the size at which "
    "the interval covers (bench/COVERAGE.md), the interval, p-values and decision are "
    "withheld (null, 'interval_note' says why) and the pair is left out of Holm's family."
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


MAX_DIGITS = 10


def _withheld(row: dict) -> str | None:
    """The row's ``interval_note`` when its test is withheld ("" when the note is missing
    but the decision is null), None when the pair was tested."""
    note = row.get(NOTE_COLUMN)
    if note is not None and str(note).strip():
        return str(note)
    return "" if row.get("reject") is None else None


def _apart(a: float, b: float, digits: int) -> int:
    """The fewest decimals (``digits`` to MAX_DIGITS) at which a and b print differently."""
    d = digits
    while d < MAX_DIGITS and format_value(a, d) == format_value(b, d):
        d += 1
    return d


def ordering(ranks: pl.DataFrame, pairs: pl.DataFrame | None = None, digits: int = 3) -> str:
    """'a [1-2] ≈ b [1-2] < c [3]': the models of one family in rank order, '≈' inside a
    group, '<' between groups, '?' where the test is withheld (``pairs``); estimates with
    ``digits`` decimals, more where two sides of a '<' would print alike."""
    withheld: set[frozenset] = set()
    tested: set[str] = set()
    if pairs is not None:
        for r in pairs.iter_rows(named=True):
            if _withheld(r) is None:
                tested.update((r["model_a"], r["model_b"]))
            else:
                withheld.add(frozenset((r["model_a"], r["model_b"])))
    rows = list(ranks.sort("group", "rank", "model").iter_rows(named=True))
    seps = []
    for prev, r in zip(rows, rows[1:], strict=False):
        if frozenset((prev["model"], r["model"])) in withheld:
            seps.append("?")
        else:
            seps.append("≈" if r["group"] == prev["group"] else "<")
    d = digits
    for prev, r, sep in zip(rows, rows[1:], seps, strict=False):
        if sep == "<" and prev["estimate"] is not None and r["estimate"] is not None:
            d = max(d, _apart(prev["estimate"], r["estimate"], digits))
    parts: list[str] = []
    for i, r in enumerate(rows):
        if i:
            parts.append(seps[i - 1])
        text = f"{r['model']} {format_value(r['estimate'], d)}"
        if not withheld or r["model"] in tested:
            interval = (
                f"{r['rank_low']}" if r["rank_low"] == r["rank_high"]
                else f"{r['rank_low']}-{r['rank_high']}"
            )  # fmt: skip
            text += f" [{interval}]"
        parts.append(text)
    return " ".join(parts)


def decided(pairs: pl.DataFrame | None) -> str:
    """'2 of 3 pairs differ (Holm, 5%)', with '; 1 pair cannot be judged at this size
    (...)' for pairs whose test is withheld (never counted as differing)."""
    if pairs is None or pairs.height == 0:
        return "one model: nothing to compare"
    rows = list(pairs.iter_rows(named=True))
    notes = [_withheld(r) for r in rows]
    judged = [r for r, n in zip(rows, notes, strict=True) if n is None]
    out_notes = list(dict.fromkeys(withheld_text(n) for n in notes if n))
    n_withheld = len(rows) - len(judged)
    why = f" ({'; '.join(out_notes)})" if out_notes else ""
    if not judged:
        which = "the pair" if n_withheld == 1 else f"the {n_withheld} pairs"
        return f"{which} cannot be judged at this size{why}"
    text = f"{sum(bool(r['reject']) for r in judged)} of {len(judged)} pairs differ (Holm, 5%)"
    if n_withheld:
        text += (
            f"; {n_withheld} {'pair' if n_withheld == 1 else 'pairs'} cannot be judged at "
            f"this size{why}"
        )
    return text


def _families(cmp: pl.DataFrame | None, ranks: pl.DataFrame) -> list[Family]:
    out = []
    for (metric, scope), part in ranks.group_by(["metric", "scope"], maintain_order=True):
        pairs = (
            cmp.filter((pl.col("metric") == metric) & (pl.col("scope") == scope))
            if cmp is not None and cmp.height
            else None
        )
        out.append(Family(str(metric), str(scope), ordering(part, pairs), decided(pairs)))
    return out


def blocks(inputs: Inputs, modules: Sequence[ModuleType]) -> list[Block]:
    """One block per benchmark with a ranks table (families of two or more models, else a line)."""
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
                *([NOTE_COLUMN] if NOTE_COLUMN in cmp.columns else []),
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
