"""BiasIG S_imp, S_exp and eta corrected for the VQA reader's errors from a human-labelled
sample (stereolens.metrics.reader_correction; docs/statistics.md, "Correcting for the reader's
errors"): the reader table from the answers as the metrics prepare them, and the model-level
scores computed by the benchmark's own Implicit / Explicit / Eta classes from the shares of
every unit x person x attribute (eta: pooled into the pairs' sides as the benchmark pools
the counts, its interval the benchmark's double bootstrap over both samples)."""

from __future__ import annotations

import copy

import numpy as np
import polars as pl

from stereolens.biasig.answers import prepare_answers, scoring_table
from stereolens.biasig.groups import Explicit, Implicit, safe_div
from stereolens.biasig.pairs import Eta, resolve_pairs
from stereolens.biasig.truth import (
    ATTRIBUTES,
    VALUE_INDEX,
    VALUES,
    VALUES_BY_ATTRIBUTE,
    BiasIGTruth,
)
from stereolens.metrics import corrected_tables as ct
from stereolens.metrics import human_labels as hl
from stereolens.metrics import reader_correction as rc
from stereolens.metrics import reader_double as rd

KEYS = ("variant", "model", "protected_attribute")
"""The key columns of a BiasIG corrected row; protected_attribute gender, race, age or "*"
(the k_i-weighted total), as the model-level rows of implicit.parquet and explicit.parquet."""
CELL_KEYS = ("variant", "model", "unit", "position")
COLUMNS = {"gender": 0, "race": 1, "age": 2, "*": 3}
"""S_imp's score columns (Implicit.COLS); S_exp's attribute columns are 9 + the same index,
its * column 12."""
ETA_COLUMNS = {"*": 0, "gender": 1, "race": 2, "age": 3}
"""eta's model columns (Eta.etas: eta_total, eta_gender, eta_race, eta_age)."""


def _positions(n_persons: int) -> tuple[str, ...]:
    return ("left", "right") if n_persons == 2 else ("single",)


def reader_table(
    answers: pl.DataFrame,
    prompts: pl.DataFrame,
    *,
    count: str = "paper",
    scoring_unit: str = "subject",
) -> tuple[pl.DataFrame, object]:
    """(the reader table, the prepared answers): one row per image x person x attribute
    (gender, race, age) of every scoring unit, the VQA answer as the metrics count it
    (biasig.answers.prepare_answers: canonical value, "unknown" where it is not usable under
    ``count``). item_id = the image id ("<image_id>:left" / ":right" for two-person
    prompts); stratum = "variant|model|<unit>" (unit: the scoring unit's key, '/' between its
    parts), the cell a human sample must cover with 2 labels of each person."""
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
    rows = []
    for u, row in enumerate(prep.units.iter_rows(named=True)):
        images = lookup[(row["variant"], row["model"], row["unit"])]
        codes = prep.codes[prep.offsets[u] : prep.offsets[u + 1]]
        if len(images) != codes.shape[0]:  # pragma: no cover - prepare_answers' own order
            raise ValueError(f"BiasIG unit {row['unit']!r}: images and answers disagree")
        stratum = "|".join((row["variant"], row["model"], row["unit"].replace("\x1f", "/")))
        for s, position in enumerate(_positions(row["n_persons"])):
            for image, code in zip(images, codes[:, s], strict=True):
                item = image if position == "single" else f"{image}:{position}"
                for ai, attribute in enumerate(ATTRIBUTES):
                    label = VALUES[code[ai]] if code[ai] >= 0 else "unknown"
                    rows.append(
                        (row["variant"], row["model"], row["unit"], position, row["visibility"],
                         item, attribute, label, stratum)
                    )  # fmt: skip
    names = [*CELL_KEYS, "visibility", "item_id", "attribute", "label", "stratum"]
    return pl.DataFrame(rows, schema=names, orient="row"), prep


def _functional(slots, scorer, column: int, n_units: int):
    """The model-level score column ``column`` of the cells' shares: per cell its (unit,
    person slot, value indices) in ``slots``; shares -> (units, B, 2, 9) counts ->
    ``scorer``."""

    def score(shares: list[np.ndarray]) -> np.ndarray:
        b = np.atleast_2d(shares[0]).shape[0]
        counts = np.zeros((n_units, b, 2, len(VALUES)))
        for (u, s, idx), share in zip(slots, shares, strict=True):
            counts[u, :, s, :][:, idx] = np.clip(np.atleast_2d(share), 0.0, None)
        return scorer(counts)[:, column]

    return score


def corrected_scores(
    reader: pl.DataFrame,
    human: pl.DataFrame,
    prep,
    truth: BiasIGTruth,
    *,
    prompts: pl.DataFrame | None = None,
    eta_variant: str = "paper",
    **options,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the corrected table: KEYS + reader_correction.METRIC_COLUMNS, metric s_imp, s_exp
    and, given the ``prompts`` table the answers were scored against (eta's pairs resolve
    against it, biasig.pairs.resolve_pairs under ``eta_variant``), eta: one row per
    (variant, model) x protected attribute (gender, race, age, *) at the model level; the
    cells, unit x person x attribute, left out for want of 2 human labels in their stratum:
    the naive and the corrected value are both over the cells kept). ``options``:
    corrected_metric's (eta: corrected_metric_double's, the double bootstrap; its
    interval_reliable always false, its coverage measured below 93%:
    formulas.ETA_CORRECTED_COVERAGE)."""
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
    imp, exp = Implicit(prep, truth), Explicit(prep)
    us = np.arange(prep.units.height)

    def implicit(counts):
        scores, avail = imp.prompt_scores(counts, us)
        return imp.sums(scores, avail, us)

    def explicit(counts):
        return exp.sums(exp.person_accuracy(counts, us), us)

    tables = []
    for metric, tool, sums, columns in (
        ("s_imp", imp, implicit, COLUMNS),
        ("s_exp", exp, explicit, {a: 9 + i for a, i in COLUMNS.items() if a != "*"} | {"*": 12}),
    ):
        model_group = {
            (v, m): g
            for g, (v, m, level) in enumerate(
                tool.groups.select("variant", "model", "level").rows()
            )
            if level == "model"
        }
        rows = []
        for (variant, model), picked in _runs(cells, tool.mask, index):
            g = model_group[(variant, model)]
            slots = [
                (index[key[:3]], int(key[3] == "right"), [VALUE_INDEX[v] for v in cell.labels])
                for key, cell in picked
            ]

            def scorer(counts, sums=sums, g=g):
                num, den = sums(counts)
                return safe_div(num[g], den[g])  # (B, score columns)

            for attribute, column in columns.items():
                use = [i for i, (key, _) in enumerate(picked) if attribute in ("*", key[4])]
                fn = _functional([slots[i] for i in use], scorer, column, us.size)
                key = {"variant": variant, "model": model, "protected_attribute": attribute}
                rows.append((key, [picked[i][1] for i in use], fn, (0.0, 1.0)))
        if rows:
            tables.append(ct.metric_table(rows, KEYS, metric, **options))
    if prompts is not None and cells:
        eta = Eta(prep, truth, resolve_pairs(prompts, truth, eta_variant))
        rows = _eta_rows(cells, eta, index, truth, eta_variant)
        if rows:
            table = ct.metric_table(
                rows, KEYS, "eta", estimator=rd.corrected_metric_double, **options
            )
            # measured below nominal (formulas.ETA_CORRECTED_COVERAGE): never printed
            tables.append(table.with_columns(interval_reliable=pl.lit(False)))
    if not tables:
        raise ValueError(
            f"human-label table: no BiasIG unit x person has {rc.MIN_LABELLED} human-labelled "
            "images in its stratum (variant|model|unit); label more images"
        )
    return pl.concat(tables), short


def _runs(cells: dict, mask: np.ndarray, index: dict):
    """(variant, model) -> [(cell key, cell)] of the units in ``mask`` (S_imp's implicit or
    S_exp's explicit units), in order."""
    out: dict[tuple[str, str], list] = {}
    for key, cell in cells.items():
        if mask[index[key[:3]]]:
            out.setdefault(key[:2], []).append((key, cell))
    return out.items()


def _eta_rows(cells: dict, eta: Eta, index: dict, truth: BiasIGTruth, variant: str) -> list:
    """metric_table's rows of eta: per (variant, model) x ETA_COLUMNS the cells of the
    pairs' sides (a unit x person that eta.json's pairs name; the attribute's cells only
    for eta_gender, _race, _age) and the functional that pools their shares into the
    sides' counts as Eta.sums pools the images (a cell's shares x its items: the shares
    are over all the cell's items, those without a usable answer adding to none) and
    takes Eta.etas' model eta, the eta.json-weighted mean over the resolved pairs whose
    sides have answers. Unbounded (eta is 0.5 plus signed squared deviations)."""
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
                one, truth, variant, 0, column,
            )  # fmt: skip
            key = {"variant": variant_, "model": model, "protected_attribute": attribute}
            rows.append((key, [cell for _, cell, _ in use], fn, None))
    return rows


def _one_run(eta: Eta, run: int) -> Eta:
    """``eta`` restricted to its run number ``run`` (its sides' slots and images only), so
    that a functional of one run's shares pools (sides, B, 9) counts, not every run's."""
    one = copy.copy(eta)
    one.runs = [eta.runs[run]]
    one.n_slots = eta.n_sides
    one.images = eta.images.reshape(len(eta.runs), eta.n_sides)[run].copy()
    return one


def _eta_functional(slots, eta: Eta, truth: BiasIGTruth, variant: str, run: int, column: int):
    """The model eta column ``column`` of run ``run`` from the cells' shares: per cell its
    (eta slot, value indices, items) in ``slots``; shares x items -> the slots' pooled
    counts (slots, B, 9) -> Eta.etas."""

    def score(shares: list[np.ndarray]) -> np.ndarray:
        b = np.atleast_2d(shares[0]).shape[0]
        pooled = np.zeros((eta.n_slots, b, len(VALUES)))
        for (slot, idx, n), share in zip(slots, shares, strict=True):
            pooled[slot][:, idx] += n * np.clip(np.atleast_2d(share), 0.0, None)
        return eta.etas(pooled, truth, variant)[1][run, :, column]

    return score
