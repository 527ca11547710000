"""Extraction validation on explicit-attribute prompts (ContextBias paper Sec. 4.2, App. D.1,
Tables 1 and 7): the validation prompt table and :func:`validation_scores` (docs/methods.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import polars as pl

from stereolens.contextbias.prompts import derived_seeds
from stereolens.contextbias.validation_truth import (
    _NO_EXTRACTOR,
    ALL,
    CONDITION,
    DEFAULT_SEED_KEY,
    KINDS,
    PAIR_COLUMNS,
    PHRASING,
    SCORE_COLUMNS,
    VARIANT,
    ValidationTruth,
    load_validation_prompts,
    validation_prompt_id,
)
from stereolens.validation import ConfigError


# ------------------------------------------------------------------------ prompt table
def build_validation_prompts(
    models: Sequence[str],
    seeds_per_prompt: int,
    seed_key: str | Mapping[str, str] | None = None,
    prompts_path: str | os.PathLike | None = None,
) -> pl.DataFrame:
    """The validation prompts as a prompt table of the main table's layout.

    One row per prompt: prompt_id (``stable_id("validation", source_index, text)``),
    source_index, role, condition ``"VAL"``, variant ``"validation"``, phrasing, template,
    text, raw_text, quirks, n_seeds_recovered, and per model the seeds (struct ``seeds``)
    and their origin (struct ``seed_source``).

    Seeds: only 5 of the paper's 10 seeds per prompt are recoverable (PROVENANCE.md). Each
    model gets the recovered seeds of ``seed_key`` (the source's ``pipeline_final`` and
    ``pipeline_finalXL`` hold the same values; default ``pipeline_final``; a mapping gives a
    key per model) in their recorded order, then, when ``seeds_per_prompt`` exceeds them,
    stably derived seeds that are the same for every model. seed_source is
    ``"bank:<key>"`` or ``"bank:<key>+derived"``.
    """
    models = list(models)
    if not models or len(set(models)) != len(models):
        raise ConfigError(f"models must be a non-empty list without repeats, got {models}")
    if isinstance(seeds_per_prompt, bool) or not isinstance(seeds_per_prompt, int):
        raise ConfigError(f"seeds_per_prompt must be an integer, got {seeds_per_prompt!r}")
    if seeds_per_prompt < 1:
        raise ConfigError(f"seeds_per_prompt must be at least 1, got {seeds_per_prompt}")
    rows = []
    for entry in load_validation_prompts(prompts_path):
        si = entry["source_index"]
        text = " ".join(entry["prompt"].split())
        prompt_id = validation_prompt_id(si, text)
        bank = entry.get("seeds_by_model") or {}
        seeds, sources = {}, {}
        for model in models:
            if isinstance(seed_key, Mapping):
                key = seed_key.get(model, DEFAULT_SEED_KEY)
            else:
                key = seed_key or DEFAULT_SEED_KEY
            if key not in bank:
                if seed_key is not None:
                    raise ConfigError(
                        f"validation prompt {si} ({text!r}) has no seeds under {key!r}; "
                        f"it has {sorted(bank)}"
                    )
                key = next(iter(sorted(bank)), None)
            recovered = [int(s) for s in bank.get(key, [])] if key else []
            if len(set(recovered)) != len(recovered):
                raise ConfigError(f"validation prompt {si}: repeated seeds under {key!r}")
            chosen = recovered[:seeds_per_prompt]
            extra = seeds_per_prompt - len(chosen)
            if extra:
                chosen += derived_seeds(prompt_id, "validation-extension", extra, avoid=recovered)
            seeds[model] = chosen
            if not recovered:
                sources[model] = "derived"
            else:
                sources[model] = f"bank:{key}" + ("+derived" if extra else "")
        role_words = entry["role"].replace("_", " ")
        rows.append(
            {
                "prompt_id": prompt_id,
                "source_index": si,
                "role": entry["role"],
                "condition": CONDITION,
                "variant": VARIANT,
                "phrasing": PHRASING,
                "template": text.replace(role_words, "{role}", 1),
                "text": text,
                "raw_text": entry["prompt"],
                "quirks": [],
                "n_seeds_recovered": len(bank.get(key, [])) if key else 0,
                "seeds": seeds,
                "seed_source": sources,
            }
        )
    frame = pl.DataFrame(rows, schema_overrides={"quirks": pl.List(pl.String)})
    if not frame["prompt_id"].is_unique().all():
        raise ConfigError("validation prompts have duplicate (source_index, text)")
    return frame.sort("source_index")


# ------------------------------------------------------------------------ scoring
def _truth_pairs(truth: ValidationTruth | pl.DataFrame, include_implied: bool) -> pl.DataFrame:
    pairs = truth.pairs if isinstance(truth, ValidationTruth) else truth
    missing = [c for c in PAIR_COLUMNS if c not in pairs.columns]
    if missing:
        raise ValueError(f"truth table lacks columns {missing}; load it with load_validation_truth")
    kinds = list(KINDS) if include_implied else ["stated"]
    return pairs.filter(pl.col("kind").is_in(kinds))


def _normalised(col: str | pl.Expr) -> pl.Expr:
    expr = pl.col(col) if isinstance(col, str) else col
    return expr.str.strip_chars().str.to_lowercase().str.replace_all(r"\s+", " ")


def _keys(attributes: pl.DataFrame, images: pl.DataFrame) -> list[str]:
    both = "extractor" in images.columns or "extractor" in attributes.columns
    return (["extractor"] if both else []) + ["model"]


def _restore_extractor(frame: pl.DataFrame) -> pl.DataFrame:
    if "extractor" not in frame.columns:
        return frame
    return frame.with_columns(
        extractor=pl.when(pl.col("extractor") != _NO_EXTRACTOR).then(pl.col("extractor"))
    )


def validation_details(attributes: pl.DataFrame, images: pl.DataFrame, truth, **options: bool):
    """One row per (generated image of a validation prompt, expected pair): the image's
    labels in that dimension (``extracted``), whether it was extracted (``ok``), and the
    outcome flags ``correct`` (true positive) and ``other_label`` (false positive), as
    defined in :func:`validation_scores`, whose keyword ``options`` it takes. Images of
    other prompts are ignored."""
    return _restore_extractor(_details(attributes, images, truth, **options))


def _details(attributes, images, truth, include_implied=False, use_canonical=True):
    """validation_details (the arguments of validation_scores) with a null extractor spelled
    _NO_EXTRACTOR (joins skip nulls)."""
    need_img = [c for c in ("model", "prompt_id", "image_id") if c not in images.columns]
    if need_img:
        raise ValueError(f"images table lacks columns {need_img}")
    need_att = [
        c for c in ("model", "image_id", "dimension", "label") if c not in attributes.columns
    ]
    if need_att:
        raise ValueError(f"attributes table lacks columns {need_att}")
    pairs = _truth_pairs(truth, include_implied)
    keys = _keys(attributes, images)
    fill = pl.col("extractor").fill_null(_NO_EXTRACTOR)
    if "extractor" in images.columns:
        images = images.with_columns(fill)
    if "extractor" in attributes.columns:
        attributes = attributes.with_columns(fill)
    imgs = images.filter(pl.col("prompt_id").is_in(pairs["prompt_id"].unique().to_list()))
    if imgs.height == 0:
        raise ValueError(
            "no image of the images table belongs to a validation prompt (prompt_id); "
            "generate and extract the table of build_validation_prompts"
        )
    if "extractor" in keys and "extractor" not in imgs.columns:
        # an images table without extractor: every image counts for every extractor
        imgs = imgs.join(attributes.select("extractor").unique(), how="cross")
    ok = pl.col("status") == "ok" if "status" in imgs.columns else pl.lit(True)
    imgs = imgs.select(*keys, "image_id", "prompt_id", ok.alias("ok")).unique(
        subset=[*keys, "image_id"], keep="first", maintain_order=True
    )
    items = imgs.join(pairs.drop("prompt", "note"), on="prompt_id", how="inner")

    att_keys = [k for k in keys if k in attributes.columns]
    canon = "label"
    if use_canonical and "canonical_label" in attributes.columns:
        canon = pl.col("canonical_label").fill_null(pl.col("label"))
    cols = [_normalised("label").alias("_label"), _normalised(canon).alias("_canon")]
    att = attributes.filter(pl.col("image_id").is_in(imgs["image_id"].unique().to_list())).select(
        *att_keys, "image_id", "dimension", *cols
    )
    joined = items.select(*keys, "image_id", "dimension", "accepted", "open_vocabulary").join(
        att, on=[*att_keys, "image_id", "dimension"], how="inner"
    )
    hit = pl.col("accepted").list.contains(pl.col("_label")) | (
        pl.col("open_vocabulary") & pl.col("accepted").list.contains(pl.col("_canon"))
    )
    per_item = (
        joined.with_columns(_hit=hit)
        .group_by(*keys, "image_id", "dimension")
        .agg(
            pl.col("_label").unique(maintain_order=True).sort().alias("extracted"),
            pl.col("_hit").any().alias("_any_hit"),
            (~pl.col("_hit")).any().alias("_any_other"),
        )
    )
    out = items.join(per_item, on=[*keys, "image_id", "dimension"], how="left")
    return (
        out.with_columns(
            extracted=pl.col("extracted").fill_null(pl.lit([], dtype=pl.List(pl.String))),
            correct=pl.col("ok") & pl.col("_any_hit").fill_null(False),
            other_label=pl.col("ok") & pl.col("exclusive") & pl.col("_any_other").fill_null(False),
        )
        .drop("_any_hit", "_any_other")
        .sort(*keys, "source_index", "kind", "dimension", "image_id")
    )


def _rates(frame: pl.DataFrame) -> pl.DataFrame:
    tp, fp, n = pl.col("n_correct"), pl.col("n_false_positive"), pl.col("n_images")
    acc = pl.when(n > 0).then(tp / n)
    precision = pl.when(tp + fp > 0).then(tp / (tp + fp))
    return frame.with_columns(
        n_false_negative=n - tp,
        accuracy=acc,
        recall=acc,
        precision=precision,
    ).with_columns(
        f1=pl.when(pl.col("precision").is_not_null() & pl.col("recall").is_not_null()).then(
            pl.when(pl.col("precision") + pl.col("recall") > 0)
            .then(
                2
                * pl.col("precision")
                * pl.col("recall")
                / (pl.col("precision") + pl.col("recall"))
            )
            .otherwise(0.0)
        ),
        f1_paper=2 * pl.col("accuracy") / (1 + pl.col("accuracy")),
    )


def validation_scores(
    attributes: pl.DataFrame,
    images: pl.DataFrame,
    truth: ValidationTruth | pl.DataFrame,
    *,
    include_implied: bool = False,
    use_canonical: bool = True,
) -> pl.DataFrame:
    """Extraction accuracy, recall, precision and F1 on the validation prompts, per
    (extractor,) model x dimension, plus an overall row per (extractor,) model
    (dimension ``"*"``). ``kind`` tells stated pairs from implied ones (scored only with
    ``include_implied``; never mixed in one row).

    Unit: one *item* = one generated image of a validation prompt x one expected
    (dimension, label) pair of that prompt. Every shipped prompt states one pair, so items
    are images. Images of prompts that state no schema attribute (``expected: null``) are
    not scored; their number is ``n_excluded_prompts`` on the overall rows.

    - n_generated: items of the images table; n_failed: those whose extraction failed
      (status other than "ok"); n_images: the rest (extracted), the denominator.
    - Labels of an image in a dimension: its rows of the attributes table, lower-cased
      (unknown/none/empty never appear there). A label *matches* when it equals the
      expected label or, for open-vocabulary dimensions (items, clothing_garment,
      activities), one of its synonyms, case-insensitively; with ``use_canonical`` and a
      ``canonical_label`` column, an open-vocabulary row also matches through its
      canonical label.
    - TP (n_correct): an extracted item whose labels in the dimension include a match.
    - FN (n_false_negative) = n_images - TP: the expected label is missing (another label,
      or none at all, e.g. unknown).
    - FP (n_false_positive): an extracted item whose labels in the dimension include a
      label that does not match, counted only for exclusive dimensions (schema kind
      scalar: one label per person, so another label contradicts the prompt; with several
      people an item can be TP and FP at once). For list dimensions (items,
      clothing_garment, accessories, ...) other labels are other things in the image and
      never count as FP.
    - accuracy = TP / n_images; recall = TP / (TP + FN), equal to accuracy by construction
      (the identity of the paper's Tables 1 and 7); precision = TP / (TP + FP) (null when
      TP + FP = 0); f1 = 2 P R / (P + R) (0 when P + R = 0).
    - f1_paper = 2 accuracy / (1 + accuracy): F1 with precision 1, which reproduces every
      F1 of the paper's Tables 1 and 7 from its accuracy (e.g. 90.3 -> 94.9, 65 -> 78.8):
      the paper counted only the expected label, never a contradicting one.
    - Overall row: sums over all items of the (extractor,) model (micro average, as
      "Total 2200" in Table 1), with accuracy_macro = the plain mean of the dimension rows'
      accuracies (the paper's "averaged across attribute dimensions" reading).

    Rates are fractions (0..1), not percent.
    """
    details = _details(attributes, images, truth, include_implied, use_canonical)
    keys = _keys(attributes, images)
    agg = [
        pl.col("source_index").n_unique().alias("n_prompts"),
        pl.len().alias("n_generated"),
        (~pl.col("ok")).sum().alias("n_failed"),
        pl.col("ok").sum().alias("n_images"),
        pl.col("correct").sum().alias("n_correct"),
        pl.col("other_label").sum().alias("n_false_positive"),
    ]
    per_dim = _rates(details.group_by(*keys, "kind", "dimension").agg(agg))
    overall = _rates(details.group_by(*keys, "kind").agg(agg)).with_columns(dimension=pl.lit(ALL))
    macro = per_dim.group_by(*keys, "kind").agg(pl.col("accuracy").mean().alias("accuracy_macro"))
    n_excluded = truth.excluded.height if isinstance(truth, ValidationTruth) else 0
    overall = overall.join(macro, on=[*keys, "kind"], how="left").with_columns(
        n_excluded_prompts=pl.lit(n_excluded, dtype=pl.Int64)
    )
    per_dim = per_dim.with_columns(
        accuracy_macro=pl.lit(None, dtype=pl.Float64),
        n_excluded_prompts=pl.lit(None, dtype=pl.Int64),
    )
    ints = [c for c in SCORE_COLUMNS if c.startswith("n_")]
    out = pl.concat(
        [f.select(*keys, *SCORE_COLUMNS) for f in (per_dim, overall)], how="vertical_relaxed"
    ).with_columns(pl.col(ints).cast(pl.Int64))
    out = out.with_columns(_order=pl.col("dimension") == ALL)
    return _restore_extractor(out.sort(*keys, "kind", "_order", "dimension").drop("_order"))
