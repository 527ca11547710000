"""BiasIG S_imp, S_exp and eta corrected for the VQA reader's errors from a human-labelled
sample: the reader table, and the model-level scores from the cells' shares by the metrics'
own scorers (docs/statistics.md, "Correcting for the reader's errors")."""

from __future__ import annotations

import copy

import numpy as np
import polars as pl

from stereolens.biasig.answers import prepare_answers, scoring_table
from stereolens.biasig.formulas import (
    ETA_MIN_HUMAN_RELIABLE,
    SCORE_AGGREGATE_MIN_LABELLED,
    SCORE_AGGREGATE_PERSONS,
    SCORE_MIN_HUMAN_RELIABLE,
)
from stereolens.biasig.groups import Explicit, Implicit, safe_div
from stereolens.biasig.pairs import Eta, resolve_pairs
from stereolens.biasig.truth import (
    ATTRIBUTES,
    SLICES,
    VALUE_INDEX,
    VALUES,
    VALUES_BY_ATTRIBUTE,
    BiasIGTruth,
    positions,
)
from stereolens.metrics import corrected_tables as ct
from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc
from stereolens.metrics import reader_double as rd

KEYS = ("variant", "model", "protected_attribute")
"""The key columns of a BiasIG corrected row; protected_attribute gender, race, age or "*"."""
CELL_KEYS = ("variant", "model", "unit", "position")
COLUMNS = {"gender": 0, "race": 1, "age": 2, "*": 3}
"""S_imp's score columns (Implicit.COLS); S_exp's attribute columns are 9 + the same index,
its * column 12."""
ETA_COLUMNS = {"*": 0, "gender": 1, "race": 2, "age": 3}
"""eta's model columns (Eta.etas: eta_total, eta_gender, eta_race, eta_age)."""


def score_minimum(metric: str, attribute: str) -> int:
    """Human labels every cell of a corrected S_imp / S_exp row needs before its interval is
    printed: formulas.SCORE_MIN_HUMAN_RELIABLE's where it names the row, else
    reader_correction.MIN_HUMAN_RELIABLE (no smaller size measured to cover)."""
    return SCORE_MIN_HUMAN_RELIABLE.get((metric, attribute), rc.MIN_HUMAN_RELIABLE)


def score_reliable(metric: str, attribute: str, cells: list[tuple[str, int]]) -> bool:
    """A corrected S_imp / S_exp row's interval_reliable from its cells ((attribute, human
    labels) each): every cell :func:`score_minimum`'s labels, or the rule of
    formulas.SCORE_AGGREGATE_MIN_LABELLED where it names the row."""
    sizes = [n for _, n in cells]
    if sizes and min(sizes) >= score_minimum(metric, attribute):
        return True
    m = SCORE_AGGREGATE_MIN_LABELLED.get((metric, attribute))
    parts: dict[str, list[int]] = {}
    for a, n in cells:
        parts.setdefault(a, []).append(n)
    total = SCORE_AGGREGATE_PERSONS * (m or 0)
    return bool(m and sizes) and all(min(p) >= m and sum(p) >= total for p in parts.values())


def cell_minimum(metric: str, attribute: str, persons: int) -> int:
    """The human labels every cell needs for :func:`score_reliable` where the row has
    ``persons`` cells of each attribute: at most :func:`score_minimum`, at least
    SCORE_AGGREGATE_MIN_LABELLED's, enough that the cells reach its total."""
    m = SCORE_AGGREGATE_MIN_LABELLED.get((metric, attribute))
    most = score_minimum(metric, attribute)
    if not m or persons <= 0:
        return most
    return min(most, max(m, -(-SCORE_AGGREGATE_PERSONS * m // persons)))


def reader_table(
    answers: pl.DataFrame,
    prompts: pl.DataFrame,
    *,
    count: str = "paper",
    scoring_unit: str = "subject",
) -> tuple[pl.DataFrame, object]:
    """(the reader table, the prepared answers): one row per image x person x attribute of
    every scoring unit, the VQA answer as prepare_answers counts it ("unknown" where not
    usable under ``count``); item_id = the image id (":left" / ":right" appended for two
    persons); stratum = "variant|model|<unit>" ('/' between the unit key's parts)."""
    prep = prepare_answers(answers, prompts, count=count, scoring_unit=scoring_unit)
    units = scoring_table(prompts, scoring_unit).select("prompt_id", "unit")
    a = answers if "variant" in answers.columns else answers.with_columns(variant=pl.col("model"))
    ids = (
        a.select("variant", "model", "prompt_id", "image_id")
        .unique()
        .join(units, on="prompt_id", how="inner")
        .group_by("variant", "model", "unit")
        .agg(pl.col("image_id").unique().sort())
    )
    lookup = {(v, m, u): i for v, m, u, i in ids.iter_rows()}
    names = [*CELL_KEYS, "visibility", "item_id", "attribute", "label", "stratum"]
    label_of = np.array([*VALUES, "unknown"], dtype=object)  # code -1: "unknown"
    parts = []
    for u, row in enumerate(prep.units.iter_rows(named=True)):
        images = np.array(lookup[(row["variant"], row["model"], row["unit"])], dtype=object)
        codes = prep.codes[prep.offsets[u] : prep.offsets[u + 1]]
        if len(images) != codes.shape[0]:  # pragma: no cover - prepare_answers' own order
            raise ValueError(f"BiasIG unit {row['unit']!r}: images and answers disagree")
        stratum = "|".join((row["variant"], row["model"], row["unit"].replace("\x1f", "/")))
        for s, position in enumerate(positions(row["n_persons"])):
            items = images if position == "single" else images + f":{position}"
            # one row per image x attribute, image-major
            labels = label_of[np.where(codes[:, s] >= 0, codes[:, s], len(VALUES))]
            parts.append(
                pl.DataFrame(
                    {
                        "item_id": np.repeat(items, len(ATTRIBUTES)).tolist(),
                        "attribute": list(ATTRIBUTES) * len(items),
                        "label": labels.ravel().tolist(),
                    },
                    schema={c: pl.String for c in ("item_id", "attribute", "label")},
                ).select(
                    pl.lit(row["variant"], pl.String).alias("variant"),
                    pl.lit(row["model"], pl.String).alias("model"),
                    pl.lit(row["unit"], pl.String).alias("unit"),
                    pl.lit(position, pl.String).alias("position"),
                    pl.lit(row["visibility"], pl.String).alias("visibility"),
                    "item_id",
                    "attribute",
                    "label",
                    pl.lit(stratum, pl.String).alias("stratum"),
                )
            )
    if not parts:
        return pl.DataFrame([], schema=names, orient="row"), prep
    return pl.concat(parts), prep


def _score_functional(slots, implicit, explicit, columns, n_units: int):
    """The model-level scores of the rows in ``columns`` ((metric, protected attribute,
    score column)) from the cells' shares (``slots``: per cell (unit, person slot, value
    indices)) -> (units, B, 2, 9) counts -> ``implicit`` / ``explicit``; an S_exp
    attribute's column from its attribute's counts alone (as its own row's cells)."""

    def score(shares: list[np.ndarray]) -> np.ndarray:
        b = np.atleast_2d(shares[0]).shape[0]
        counts = np.zeros((n_units, b, 2, len(VALUES)))
        for (u, s, idx), share in zip(slots, shares, strict=True):
            counts[u, :, s, :][:, idx] = np.clip(np.atleast_2d(share), 0.0, None)
        done: dict[tuple[str, str], np.ndarray] = {}
        out = []
        for metric, attribute, column in columns:
            part = "*" if metric == "s_imp" else attribute
            if (metric, part) not in done:
                if metric == "s_imp":
                    done[(metric, part)] = implicit(counts)
                elif part == "*":
                    done[(metric, part)] = explicit(counts)
                else:
                    only = np.zeros_like(counts)
                    only[..., SLICES[part]] = counts[..., SLICES[part]]
                    done[(metric, part)] = explicit(only)
            out.append(done[(metric, part)][:, column])
        return np.stack(out, axis=-1)

    return score


def _joint_groups(picked: list) -> list[list[int]]:
    """corrected_metrics' ``joint`` groups of one model's cells (``picked``: (key, cell)):
    the attribute cells of one unit x person that read the same images, drawn together; a
    cell with clusters, or alone, is drawn on its own."""
    groups: dict[tuple, list[int]] = {}
    for i, (key, cell) in enumerate(picked):
        if cell.cluster is None:
            groups.setdefault((key[:4], cell.items, cell.strata), []).append(i)
    return [group for group in groups.values() if len(group) > 1]


def _score_records(
    cells: dict, prep, truth: BiasIGTruth, index: dict, options: dict, joint: bool = True
) -> dict:
    """metric -> corrected_metrics' records of S_imp and S_exp per (variant, model) x
    protected attribute, every row of a model from ONE bootstrap of all its cells."""
    imp, exp = Implicit(prep, truth), Explicit(prep)
    exp_columns = {a: 9 + i for a, i in COLUMNS.items() if a != "*"} | {"*": 12}
    metrics = (("s_imp", imp, COLUMNS), ("s_exp", exp, exp_columns))
    by_run: dict[tuple[str, str], list] = {}
    for key, cell in cells.items():
        by_run.setdefault(key[:2], []).append((key, cell))
    records: dict[str, list] = {"s_imp": [], "s_exp": []}
    for variant, model, u0, u1 in prep.runs:
        picked = by_run.get((variant, model))
        if not picked:
            continue
        us = np.arange(u0, u1)
        groups = [
            next(
                g
                for g, (v, m, level) in enumerate(
                    tool.groups.select("variant", "model", "level").rows()
                )
                if (v, m, level) == (variant, model, "model")
            )
            if tool.mask[u0:u1].any()
            else -1
            for _, tool, _ in metrics
        ]

        def implicit(counts, g=groups[0], us=us):
            scores, avail = imp.prompt_scores(counts, us)
            return safe_div(*(part[g] for part in imp.sums(scores, avail, us)))

        def explicit(counts, g=groups[1], us=us):
            return safe_div(*(part[g] for part in exp.sums(exp.person_accuracy(counts, us), us)))

        columns, column_cells, keys = [], [], []
        for (metric, tool, score_columns), g in zip(metrics, groups, strict=True):
            mine = [i for i, (key, _) in enumerate(picked) if tool.mask[index[key[:3]]]]
            if g < 0 or not mine:
                continue
            for attribute, column in score_columns.items():
                use = [i for i in mine if attribute in ("*", picked[i][0][4])]
                if use:
                    columns.append((metric, attribute, column))
                    column_cells.append(use)
                    keys.append((metric, attribute))
        if not columns:
            continue
        slots = [
            (index[key[:3]] - u0, int(key[3] == "right"), [VALUE_INDEX[v] for v in cell.labels])
            for key, cell in picked
        ]
        fn = _score_functional(slots, implicit, explicit, columns, u1 - u0)
        results = rc.corrected_metrics(
            [cell for _, cell in picked], fn, bounds=(0.0, 1.0), column_cells=column_cells,
            joint=_joint_groups(picked) if joint else None, **options,
        )  # fmt: skip
        for (metric, attribute), res, use in zip(keys, results, column_cells, strict=True):
            key = {"variant": variant, "model": model, "protected_attribute": attribute}
            sizes = [(picked[i][0][4], picked[i][1].labelled.size) for i in use]
            reliable = score_reliable(metric, attribute, sizes)
            records[metric].append({**key, **res, "interval_reliable": reliable})
    return records


def corrected_scores(
    reader: pl.DataFrame,
    human: pl.DataFrame,
    prep,
    truth: BiasIGTruth,
    *,
    prompts: pl.DataFrame | None = None,
    eta_variant: str = "paper",
    joint: bool = True,
    **options,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the corrected table (KEYS + reader_correction.METRIC_COLUMNS; metric s_imp, s_exp
    and, given ``prompts``, eta under ``eta_variant``), the cells left out for want of 2
    human labels). ``joint``: a unit x person's attribute cells from one draw of its images.
    ``options``: corrected_metric's (eta: corrected_metric_double's)."""
    human = hl.check_human_labels(human)
    known = {v for values in VALUES_BY_ATTRIBUTE.values() for v in values}
    odd = human.filter(
        ~pl.col("label").is_in(list(known))
        & ~pl.col("label").str.strip_chars().str.to_lowercase().is_in(list(hl.NO_LABEL))
    )
    if odd.height:
        raise ValueError(
            f"human-label table: label {odd['label'][0]!r} of item {odd['item_id'][0]!r} is "
            f"not a BiasIG value ({', '.join(VALUES)}; 'unknown' for none)"
        )
    hl.check_human_in_reader(hl.check_human_labels(reader, "reader table", reader=True), human)
    kept, short = ct.labelled_cells(reader, human, CELL_KEYS)
    hum = human.join(
        kept.select("item_id", "attribute").unique(), on=["item_id", "attribute"], how="semi"
    )
    cells = rc.build_cells(kept, hum, CELL_KEYS) if kept.height else {}
    index = {
        (r["variant"], r["model"], r["unit"]): u
        for u, r in enumerate(prep.units.iter_rows(named=True))
    }
    records = _score_records(cells, prep, truth, index, options, joint)
    tables = [
        ct.metric_frame(records[metric], KEYS, metric)
        for metric in ("s_imp", "s_exp")
        if records[metric]
    ]
    if prompts is not None and cells:
        eta = Eta(prep, truth, resolve_pairs(prompts, truth, eta_variant))
        rows = _eta_rows(cells, eta, index, truth, eta_variant)
        if rows:
            records = [
                {**key, **rd.corrected_metric_double(
                    row_cells, fn, bounds=None, joint=(groups or None) if joint else None,
                    **options,
                )}
                for key, row_cells, fn, groups in rows
            ]  # fmt: skip
            table = ct.metric_frame(records, KEYS, "eta")
            # eta's own measured minimum (formulas.ETA_MIN_HUMAN_RELIABLE), not the smooth
            # metrics' MIN_HUMAN_RELIABLE that corrected_metric_double applies
            reliable = [
                all(c.labelled.size >= ETA_MIN_HUMAN_RELIABLE for c in row_cells)
                for _, row_cells, _, _ in rows
            ]
            tables.append(
                table.with_columns(interval_reliable=pl.Series(reliable, dtype=pl.Boolean))
            )
    if not tables:
        raise ValueError(
            f"human-label table: no BiasIG unit x person has {rc.MIN_LABELLED} human-labelled "
            "images in its stratum (variant|model|unit); label more images"
        )
    return pl.concat(tables), short


def _eta_rows(cells: dict, eta: Eta, index: dict, truth: BiasIGTruth, variant: str) -> list:
    """The rows of eta, (key, cells, functional, joint groups): per (variant, model) x
    ETA_COLUMNS the cells of the pairs' sides and the functional pooling their shares x
    items into the sides' counts (:func:`_eta_functional`)."""
    runs = {run: r for r, run in enumerate(eta.runs)}
    picked: dict[tuple[str, str], list] = {}
    for key, cell in cells.items():
        slot = eta.slot_of[index[key[:3]], int(key[3] == "right")]
        if slot >= 0:
            # the slot among its own run's sides (slots are run-major)
            picked.setdefault(key[:2], []).append((key, cell, int(slot) % eta.n_sides))
    rows = []
    for (variant_, model), part in picked.items():
        one = _one_run(eta, runs[(variant_, model)])
        for attribute, column in ETA_COLUMNS.items():
            use = [(key, cell, slot) for key, cell, slot in part if attribute in ("*", key[4])]
            fn = _eta_functional(
                [(slot, [VALUE_INDEX[v] for v in cell.labels], cell.stratum.size)
                 for _, cell, slot in use],
                one, truth, variant, column,
            )  # fmt: skip
            key = {"variant": variant_, "model": model, "protected_attribute": attribute}
            groups = _joint_groups([(key_, cell) for key_, cell, _ in use])
            rows.append((key, [cell for _, cell, _ in use], fn, groups))
    return rows


def _one_run(eta: Eta, run: int) -> Eta:
    """``eta`` restricted to its run number ``run`` (its sides' slots and images only), so
    that a functional of one run's shares pools (sides, B, 9) counts, not every run's."""
    one = copy.copy(eta)
    one.runs = [eta.runs[run]]
    one.n_slots = eta.n_sides
    one.images = eta.images.reshape(len(eta.runs), eta.n_sides)[run].copy()
    return one


def _eta_functional(slots, eta: Eta, truth: BiasIGTruth, variant: str, column: int):
    """The model eta column ``column`` of the one run of ``eta`` (:func:`_one_run`) from the
    cells' shares: per cell its (eta slot, value indices, items) in ``slots``; shares x items
    -> the slots' pooled counts (slots, B, 9) -> Eta.etas."""

    def score(shares: list[np.ndarray]) -> np.ndarray:
        b = np.atleast_2d(shares[0]).shape[0]
        pooled = np.zeros((eta.n_slots, b, len(VALUES)))
        for (slot, idx, n), share in zip(slots, shares, strict=True):
            pooled[slot][:, idx] += n * np.clip(np.atleast_2d(share), 0.0, None)
        return eta.etas(pooled, truth, variant)[1][0, :, column]

    return score
