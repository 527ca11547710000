"""The ContextBias study subsections of the report: the extraction validation (paper
Tables 1 and 7), the extraction audit per demographic group, the canonicalisation of
open-vocabulary labels and the human agreement study.
"""

from __future__ import annotations

import polars as pl

from stereolens.report.audits import GAP_CAPTION, audit_section, minimum_text
from stereolens.report.html import Section, Table
from stereolens.report.inputs import Inputs


def validation_section(scores: pl.DataFrame) -> Section:
    keep = [
        c
        for c in ("extractor", "model", "kind", "dimension", "n_images", "accuracy", "recall",
                  "precision", "f1", "f1_paper")
        if c in scores.columns
    ]  # fmt: skip
    stated = scores.filter(pl.col("kind") == "stated") if "kind" in scores.columns else scores
    return Section(
        "contextbias-validation",
        "Extraction validation",
        paragraphs=[
            "Images generated from the 220 explicit-attribute prompts (the attribute is stated "
            "in the prompt), scored against what the prompt states."
        ],
        tables=[
            Table(
                "contextbias-validation-model",
                "Accuracy, recall and F1 per model (paper Table 1)",
                "accuracy = correct / images; recall and precision over the stated labels; "
                "f1 = 2PR/(P+R); f1_paper = 2 acc / (1 + acc), the paper's identity.",
                stated.filter(pl.col("dimension") == "*").select(keep).sort(pl.all()),
            ),
            Table(
                "contextbias-validation-dimension",
                "Per dimension (paper Table 7)",
                "The same scores per stated dimension.",
                stated.filter(pl.col("dimension") != "*").select(keep).sort(pl.all()),
            ),
        ],
    )


def canonical_section(mapping: pl.DataFrame) -> Section:
    section = Section("contextbias-canonicalisation", "Canonicalisation of open-vocabulary labels")
    if mapping.is_empty():
        section.paragraphs.append("Canonicalisation is off or found no open-vocabulary labels.")
        return section
    summary = (
        mapping.group_by("dimension", "decided_by")
        .agg(
            pl.len().alias("raw_labels"),
            pl.col("cluster_id").n_unique().alias("clusters"),
            pl.col("core_label").n_unique().alias("core_labels"),
        )
        .sort(pl.all())
    )
    section.tables += [
        Table(
            "contextbias-canonical-summary",
            "Raw labels, clusters and core labels per dimension",
            "Raw labels, embedding clusters (cosine similarity >= threshold) and final core "
            "labels per dimension and deciding step; review and override with "
            "results/contextbias/canonical_mapping.csv.",
            summary,
        ),
        Table(
            "contextbias-canonical-mapping",
            "The mapping, most frequent raw labels first",
            "Every raw label with its cluster, canonical and core label and the step that "
            "decided it.",
            mapping.sort(["count", "dimension", "raw_label"], descending=[True, False, False]),
            max_rows=100,
        ),
    ]
    return section


def agreement_section(inputs: Inputs) -> Section:
    """The human agreement study: where the annotation form is, the agreement table."""
    study = Section("contextbias-agreement", "Human agreement study")
    if inputs.has("annotation_form"):
        study.paragraphs.append(
            "A blinded annotation form is in results/contextbias/annotation/form.html "
            "(answers save to CSV; list them under contextbias.annotation.answers)."
        )
    agreement = inputs.get("agreement")
    if agreement is not None:
        study.tables.append(
            Table(
                "contextbias-agreement-summary",
                "Agreement of the annotators and of the pipeline (paper Sec. 4.3)",
                "Raw agreement, Fleiss' kappa with bootstrap CI, and human consensus vs pipeline.",
                agreement,
            )
        )
    return study


def subsections(inputs: Inputs) -> list[Section]:
    """The study subsections the run has tables for, in page order."""
    out = []
    validation = inputs.get("validation")
    if validation is not None:
        out.append(validation_section(validation))
    by_group, group_gaps = inputs.get("validation_by_group"), inputs.get("validation_group_gaps")
    if by_group is not None and group_gaps is not None:
        out.append(extraction_group_section(by_group, group_gaps))
    mapping = inputs.get("mapping")
    if mapping is not None:
        out.append(canonical_section(mapping))
    study = agreement_section(inputs)
    if not study.is_empty():
        out.append(study)
    return out


def extraction_group_section(by_group: pl.DataFrame, gaps: pl.DataFrame) -> Section:
    """ContextBias: extraction validation per demographic group, and its flags."""
    return audit_section(
        ("contextbias-validation-by-group", "contextbias-validation-group-gaps",
         "contextbias-validation-by-group-rates"),
        "Extraction validation per demographic group",
        by_group,
        gaps,
        ["extractor", "model", "grouping", "group_dimension"],
        {
            "empty": "No validation item carries a gender, skin tone or age group (no stated "
            "demographic and none read in the images).",
            "what": "extractor",
            "fine": "No extractor's per-group errors alone would produce the bias it is used "
            "to measure.",
            "gap_caption": GAP_CAPTION.format(
                unit="Items are clustered by validation prompt (its seeds' images, an "
                "image's dimension rows): every interval and test uses the prompts as the "
                "units;",
                test="chi-squared, or Fisher's exact test for two small groups, for "
                "independent items; Rao-Scott F (second order) for clustered ones",
                induced="the BI (1 - H(q) / log K, q_g = a_g / sum a) the per-group "
                "accuracies a_g alone would give the group dimension, every group equally "
                "common and every misread lost",
                bias="|CA-U - CF| BI shift of that dimension (stated grouping; else the "
                "overall shift) of the extractor and model",
                minimum=minimum_text() + " (prompts)",
            ),
            "rates_caption": "grouping 'stated' = the demographic the validation prompt "
            "states (how well that demographic is read); 'shown' = the label the extractor "
            "reads for the person in the same image (accuracy on the other dimensions). "
            "Accuracy = recall with Wilson intervals, precision (contradicting labels of "
            "exclusive dimensions) with Wilson intervals, both on the effective counts "
            "(counts / design effect, the prompts being the units), F1 with a t(prompts - 1) "
            "interval on the logit scale from its bootstrap standard error over prompts; "
            "model * = the generators pooled.",
        },
    )  # fmt: skip
