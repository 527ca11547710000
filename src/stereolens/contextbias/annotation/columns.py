"""What the files of the ContextBias annotation study hold: the questions and the tables of
the agreement report; the key and the CSV the form saves are the shared form's
(stereolens.annotation_form)."""

from __future__ import annotations

import polars as pl

DEFAULT_DIMENSIONS = (
    "gender_presentation",
    "age_range",
    "skin_tone",
    "hair_color",
    "facial_hair_present",
    "eyewear_present",
    "head_covering_present",
    "framing",
    "clothing_garment",
)
"""Attributes a person can check on a 10-image set at a glance."""

ALL = "*"
"""dimension "*" marks the overall rows: items of all dimensions pooled."""
PIPELINE = "pipeline"
CONSENSUS = "consensus"

QUESTIONS = {
    "gender_presentation": "Gender presentation",
    "age_range": "Age range",
    "skin_tone": "Skin tone",
    "hair_color": "Hair colour",
    "facial_hair_present": "Facial hair present?",
    "eyewear_present": "Eyewear present?",
    "head_covering_present": "Head covering present?",
    "framing": "Framing of the shot",
    "clothing_garment": "Most visible garment (brief descriptor)",
}

PAIR_COLUMNS = {
    "dimension": pl.String,
    "kind": pl.String,
    "rater_a": pl.String,
    "rater_b": pl.String,
    "n_items": pl.Int64,
    "agreement": pl.Float64,
    "kappa": pl.Float64,
}
"""agreement_pairs.parquet: one row per dimension ("*" = all pooled) and pair of raters.
kind: human-human (two annotators), human-pipeline (an annotator vs the pipeline),
consensus-pipeline (the human consensus vs the pipeline). n_items = items both answered
(consensus-pipeline: items answered by every annotator); agreement = share of those items
with the same label; kappa = Cohen's kappa (null where undefined)."""

SUMMARY_COLUMNS = {
    "dimension": pl.String,
    "n_items": pl.Int64,
    "n_complete": pl.Int64,
    "n_annotators": pl.Int64,
    "raw_agreement": pl.Float64,
    "mean_pairwise_agreement": pl.Float64,
    "mean_pairwise_kappa": pl.Float64,
    "fleiss_kappa": pl.Float64,
    "fleiss_ci_low": pl.Float64,
    "fleiss_ci_high": pl.Float64,
    "ci_level": pl.Float64,
    "replicates": pl.Int64,
    "valid_replicates": pl.Int64,
    "extractor": pl.String,
    "pipeline_agreement": pl.Float64,
    "pipeline_kappa": pl.Float64,
    "prevalence_mae": pl.Float64,
}
"""agreement_summary.parquet: one row per dimension plus "*" (all items pooled; labels are
kept apart by dimension). n_items = questions in the key (sets x dimensions); n_complete =
items every annotator answered, the items of raw_agreement, Fleiss' kappa and the pipeline
columns. raw_agreement = share of complete items where all annotators chose the same label;
mean_pairwise_agreement / mean_pairwise_kappa = mean over annotator pairs (agreement_pairs,
kind human-human). fleiss_ci_low/high = percentile bootstrap over complete items
(``replicates`` draws, ``valid_replicates`` of them with a defined kappa). extractor = the
pipeline compared; pipeline_agreement / pipeline_kappa = human consensus vs pipeline label;
prevalence_mae = mean |consensus prevalence - pipeline prevalence| over items where the
labels match."""

CONSENSUS_COLUMNS = {
    "set_id": pl.String,
    "position": pl.Int64,
    "role": pl.String,
    "condition": pl.String,
    "model": pl.String,
    "dimension": pl.String,
    "n_images": pl.Int64,
    "n_annotators": pl.Int64,
    "complete": pl.Boolean,
    "consensus_label": pl.String,
    "consensus_votes": pl.Int64,
    "consensus_prevalence": pl.Float64,
    "tie_break": pl.String,
    "extractor": pl.String,
    "pipeline_label": pl.String,
    "pipeline_prevalence": pl.Int64,
    "match": pl.Boolean,
}
"""consensus_vs_pipeline.parquet: one row per item with at least one answer. consensus_label
= majority vote; ties go to the label with the higher mean slider, then alphabetically
(tie_break: none | slider | alphabetical); consensus_prevalence = mean slider of the
annotators who chose the consensus label; complete = every annotator answered the item.
pipeline_label / pipeline_prevalence: see :func:`pipeline_set_labels`."""

ANNOTATOR_COLUMNS = {
    "annotator": pl.String,
    "n_answers": pl.Int64,
    "coverage": pl.Float64,
    "unknown_share": pl.Float64,
    "mean_prevalence": pl.Float64,
}
"""agreement_annotators.parquet (quality control, App. D.2): answers per annotator, the
share of the key's items answered, the share answered unknown, the mean slider."""

TABLE_FILES = {
    "agreement_pairs": "agreement_pairs.parquet",
    "agreement_summary": "agreement_summary.parquet",
    "consensus_vs_pipeline": "consensus_vs_pipeline.parquet",
    "agreement_annotators": "agreement_annotators.parquet",
}
