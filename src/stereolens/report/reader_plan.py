"""The reader block's plan sentence (no human labels yet): how many human labels to collect,
the planner's count (stereolens.plan.reader_plan, through the plug-ins' reader designs)
where it has one, else the report's own human_labels_needed estimate."""

from __future__ import annotations

import json

import polars as pl

from stereolens.report.reader import ReaderBlock

TARGET_WIDTH = 0.05
"""The corrected interval's width the label count is planned for: a label share known to
+- 2.5 percentage points (95%)."""
DEFAULT_DISAGREEMENT = 0.136
"""The reader's disagreement rate with humans assumed where the run has no reader audit:
1 - 0.864, the lowest extraction accuracy ContextBias reports (paper 002 Table 1)."""
PLAN_SHARE = 0.5
"""The label share the count is planned at: 0.5 has the largest sampling variance."""
PLAN_CAPTION = (
    "Labels to collect = what `stereolens plan --configfile <the run's config>` prints for "
    "the benchmark (stereolens.plan.reader_plan; docs/planner.md, 'Human labels for the "
    "reader correction'): per generator the human labels a stratified sample needs for a "
    "95% corrected interval of the benchmark's reader_sample.target_width on a label share "
    "of its items, allocated over the correction's strata (reader_sample.allocation), "
    "with the disagreement rate reader_sample.disagreement (or a pilot's), at least 2 per "
    "stratum. Where the planner prints nothing for a benchmark (a report without the run's config "
    "names no models), the report's own "
    "estimate: human_labels_needed (docs/statistics.md, 'How many human labels'), the "
    "smallest n with 2 x 1.96 x sqrt(share (1 - share) / N + d / n) <= "
    f"{TARGET_WIDTH} for one label share of the N items the reader read, share "
    f"{PLAN_SHARE}, d = 1 - the pooled accuracy of the run's reader audit (the worst "
    f"reader it audits), else {DEFAULT_DISAGREEMENT} (1 - 86.4%, the lowest extraction "
    "accuracy ContextBias reports, paper 002 Table 1), at least 2 per sampling stratum; "
    "a simple random sample of all items. A corrected interval is printed only where every "
    "cell of its row has its printing minimum of human labels (the caption above), so the "
    "planner also counts, per generator, the labels that put every cell (a stratum) of the "
    "headline rows at its minimum, at most the cell's items: the largest of the rows using "
    "it, reader_correction.MIN_HUMAN_RELIABLE (ContextBias's per-cell rows, the LVLM), a "
    "rule over a row's many cells (contextbias.corrected_rule: the means over roles; "
    "biasig.corrected.cell_minimum: S_imp over a generator's implicit units), "
    "biasig.corrected.score_minimum (BiasIG S_exp '*') or biasig.formulas."
    "ETA_MIN_HUMAN_RELIABLE (a side of a BiasIG eta pair) (metrics.sample_design."
    "printable_counts). A cell with fewer items than its minimum never prints its rows' "
    "intervals, whatever is labelled; the sentence says so and names the design setting "
    "(e.g. contextbias.seeds.per_prompt) at which every cell has enough. The count the plan "
    "recommends: per cell the larger of the width's labels and the largest minimum of the "
    "rows using it that the cell has items for; where no cell has, the width's count, with "
    "every corrected interval withheld."
)


def audit_disagreement(rates: pl.DataFrame | None) -> float | None:
    """1 - a reader audit's pooled accuracy, the largest over what it audits; None without."""
    if rates is None or rates.height == 0 or not {"n_items", "n_correct"} <= set(rates.columns):
        return None
    keys = [
        c
        for c in ("extractor", "assistant", "model", "grouping", "group_dimension")
        if c in rates.columns
    ]
    pooled = rates.group_by(keys or pl.lit(1)).agg(
        (1.0 - pl.col("n_correct").sum() / pl.col("n_items").sum()).alias("d")
    )
    d = pooled["d"].drop_nulls().drop_nans()
    return float(d.max()) if len(d) else None


def labels_needed(n_items: int, disagreement: float, n_strata: int = 1) -> tuple[int | None, int]:
    """(human_labels_needed for TARGET_WIDTH at PLAN_SHARE over ``n_items``, None where no n
    reaches it; the correction's floor of 2 labelled items in each of ``n_strata``)."""
    from stereolens.metrics.reader_correction import MIN_LABELLED, human_labels_needed

    n = human_labels_needed(disagreement, TARGET_WIDTH, max(n_items, 1), share=PLAN_SHARE)
    return n, MIN_LABELLED * max(n_strata, 1)


_PLANS: dict[str, list[dict]] = {}


def planner_part(config: dict, key: str) -> dict | None:
    """The benchmark's part of stereolens.plan.reader_plan(config), computed once per
    config; None where `stereolens plan` prints nothing for it."""
    from stereolens.benchmark import benchmarks, resolve

    memo = json.dumps(config, sort_keys=True, default=str)
    if memo not in _PLANS:  # what stereolens.plan.reader_plan(config) returns
        _PLANS.clear()
        _PLANS[memo] = [
            resolve(b.reader_design)(config, None) for b in benchmarks(config) if b.reader_design
        ]
    part = next((p for p in _PLANS[memo] if p["benchmark"] == key), None)
    return part if part is not None and part["rows"] else None


def _planned_count(part: dict, n_items: int, what: str, measured: str) -> str:
    """The plan sentence from the planner's ``part`` (planner_part)."""
    unit = part["unit"]
    per = "; ".join(
        f"{r['model']} {r['n_human']:,} of {r['n_items']:,}"
        if r["n_human"] is not None
        else f"{r['model']} not reachable (all {r['n_items']:,} give width {r['width']:.3f})"
        for r in part["rows"]
    )
    planned_items = sum(r["n_items"] for r in part["rows"])
    floor = sum(r["floor"] for r in part["rows"])
    lo = min(r["disagreement_min"] for r in part["rows"])
    hi = max(r["disagreement_max"] for r in part["rows"])
    source = part["disagreement_source"]
    if source == "default":
        source = f"{part['benchmark']}.reader_sample.disagreement"
    settings = (
        f"a 95% corrected interval of width {part['target_width']:g} on a label share of one "
        f"model's {unit}, {part['allocation']} allocation over the strata, disagreement "
        f"{lo:.3f}{f'-{hi:.3f}' if hi != lo else ''} ({source})"
    )
    if part["n_human"] is not None:
        count = f"collect {part['n_human']:,} human labels of the {planned_items:,} {unit} ({per})"
    else:
        count = (
            f"for some model no number of human labels reaches the width ({per}); label as "
            f"many as you can, at least {floor:,} (2 per stratum)"
        )
    extra = ""
    if planned_items != n_items:
        extra = (
            f"; the planner counts {planned_items:,} {unit} for the config, "
            f"{n_items:,} {what} were read"
        )
    return f"{count}: {settings}, as `stereolens plan` prints it{measured}{extra}"


def _printable(part: dict) -> str:
    """The plan's printable_counts sentence; empty for a part without them."""
    rows = part["rows"]
    if not rows or "n_printable" not in rows[0]:
        return ""
    unit = part["unit"]
    short = sum(r["cells_short"] for r in rows)
    cells = sum(r["strata"] for r in rows)
    lo = min(r["minimum_min"] for r in rows)
    hi = max(r["minimum_max"] for r in rows)
    text = (
        f" A corrected interval is printed where every cell of its row has its printing "
        f"minimum ({lo:,}{f'-{hi:,}' if hi != lo else ''} human labels, at most the cell's "
        f"{unit}): {part['n_printable']:,} in all"
    )
    if not short:
        return f"{text}; the plan recommends {part['n_recommended']:,}."
    needed: dict[str, int] = {}
    for r in rows:
        if r["knob"] and r["knob_needed"] is not None:
            needed[r["knob"]] = max(needed.get(r["knob"], 0), r["knob_needed"])
    grow = "; ".join(f"{k} >= {v:,}" for k, v in needed.items())
    grow = f" ({grow} gives every cell enough)" if grow else ""
    if short == cells:
        return (
            f"{text}, but no cell has that many {unit}{grow}: every headline row's corrected "
            f"interval will be withheld whatever is labelled; the plan recommends the "
            f"width's count, {part['n_recommended']:,}."
        )
    return (
        f"{text}; {short:,} of {cells:,} cells have fewer {unit} than their minimum{grow}, "
        f"and the rows needing more than such a cell has will be withheld whatever is "
        f"labelled; the plan recommends {part['n_recommended']:,} (per cell the largest "
        f"minimum it reaches, the width's count elsewhere)."
    )


def plan_block(
    key: str,
    title: str,
    *,
    n_items: int,
    what: str,
    disagreement: float | None = None,
    audit: str = "",
    n_strata: int = 1,
    config_key: str | None = None,
    planned: dict | None = None,
) -> ReaderBlock:
    """A benchmark's block without human labels (a perfect reader assumed): the labels to
    collect, the planner's (``planned``), else :func:`labels_needed` of ``disagreement``."""
    cfg = config_key or key
    head = (
        f"The numbers assume a perfect reader: no human labels were given "
        f"({cfg}.reader_correction.human_labels)."
    )
    if planned is not None:
        measured = (
            f" (the run's {audit} measured a disagreement rate of {disagreement:.3f}; "
            f"{cfg}.reader_sample.disagreement or `stereolens plan --pilot` plans with another)"
            if disagreement is not None
            else ""
        )
        count = _planned_count(planned, n_items, what, measured)
        return ReaderBlock(key, title, plan=f"{head} The plan says: {count}.{_printable(planned)}")
    d = DEFAULT_DISAGREEMENT if disagreement is None else disagreement
    source = (
        f"the {audit}'s disagreement rate {d:.3f}"
        if disagreement is not None
        else f"a disagreement rate of {d:.3f} assumed (no reader audit in this run)"
    )
    n, floor = labels_needed(n_items, d, n_strata)
    strata = (
        f"; the correction's minimum is 2 in each of its {n_strata:,} strata, {floor:,}"
        if n_strata > 1
        else ""
    )
    if n is not None:
        count = (
            f"collect {max(n, floor):,} human labels of the {n_items:,} {what} "
            f"({n:,} for a label share's interval of width {TARGET_WIDTH} with {source}{strata})"
        )
    else:
        each = f", 2 in each of its {n_strata:,} strata" if n_strata > 1 else ""
        count = (
            f"with {n_items:,} {what} no number of human labels narrows a label share's "
            f"interval to width {TARGET_WIDTH} (their sampling alone is wider; {source}); "
            f"label as many as you can, at least {floor:,} (the correction's minimum{each})"
        )
    plan = (
        f"{head} `stereolens plan` prints no count for it here (no reader design, or no "
        f"run config); the report's estimate, a simple random sample: {count}."
    )
    return ReaderBlock(key, title, plan=plan)
