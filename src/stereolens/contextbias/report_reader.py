"""ContextBias's reader block's constants (stereolens.report.reader): its headline metrics, its
caption line (formulas, joint draws, measured coverage and printing rules) and its scope."""

from __future__ import annotations

from stereolens.report import reader

READER_HEADLINES = {
    "bi": reader.Headline("BI", 0.0),
    "bi_pooled": reader.Headline("pooled BI", 0.0),
    "bi_pooled_mean": reader.Headline("mean pooled BI over generators", 0.0, ranked=False),
    "bi_role": reader.Headline("mean BI over roles", 0.0),
    "bi_role_mm": reader.Headline("mean Miller-Madow BI over roles", 0.0),
    "bi_role_mean": reader.Headline("mean BI over roles and generators", 0.0, ranked=False),
    "bi_role_mm_mean": reader.Headline(
        "mean Miller-Madow BI over roles and generators", 0.0, ranked=False
    ),
    "ccs": reader.Headline("CCS", float("nan")),
    "ccs_mean": reader.Headline("mean CCS over generators", float("nan"), ranked=False),
}
"""The corrected table's metrics (docs/outputs.md, corrected.parquet): BI 0 = every label
equally often; a mean over generators (model "*") is not ranked; CCS has no value that means
"no bias", so its rows get the rank flag only (lower = less persistent)."""


READER_CAPTION = (
    "ContextBias: BI = 1 - H(p)/log K per role x condition x dimension (paper 002 Eq. 1), with a "
    "role's cohort means (dimension '*') and overall value (cohort '*'), its dimensions "
    "resampled together (94.8% and 94.7% of 1,000 datasets at 400 human labels), its mean over "
    "roles and that of its Miller-Madow value (role '*', bi.parquet's 'role' and "
    "'role_miller_madow', its interval centred at its own value, whose term already removes "
    "the plug-in's bias; 94.4-94.9% of 1,000 datasets at 400 human labels per role, 94.0-94.7% "
    "at 1,000; at the paper's design, 92 roles of 30-100 images, the mean over roles prints "
    "from 20 human labels in every role cell and 1,840 over a dimension's roles: 94.0-95.1% "
    "of 1,000 datasets at 20, the Miller-Madow one not: 90.0-93.0% at 20, 93.5-96.0% with every "
    "image, 400 a cell still; "
    "their mean over generators, model '*', not ranked: 93.3-94.2% at 400, 94.9-95.6% "
    "at 1,000; at the paper's design the mean over roles' one prints from 20 human labels in "
    "every role cell of every generator (94.2% and 94.1% of 1,000 datasets, two generators), "
    "the Miller-Madow one not (89.7% and 91.2%); 'role_matched' has no corrected row: "
    "matched support subsamples the images, which "
    "the human sample cannot follow); pooled BI of the counts pooled over roles (role '*') with "
    "its cohort means (dimension '*') and overall value (cohort '*') (95.0% and a cohort mean "
    "95.7% of 1,000 datasets; at the paper's design 92.5% and 94.1% at 10 labels a role "
    "cell: 400 a cell still; their mean over generators, model '*', not ranked, prints from "
    "20 human labels in every role cell of every generator: 93.7% and 94.7% of 1,000 "
    "datasets, two generators); CCS = Prev% / "
    "(1 + range in pp) over the three conditions (Eq. 4, condition '*'; rank flag only; 94.0%) "
    "and its mean over generators (Eq. 5, model '*'; 95.2%), their intervals withheld where two "
    "conditions' shares lie within 2 standard errors (at a tie no bootstrap interval covers: 12% "
    "with three tied)."
)
"""The reader block's caption line (stereolens.report.reader.caption): formulas, joint draws,
measured coverage and the aggregate rows' printing rule (contextbias.corrected_rule;
bench/COVERAGE.md)."""


READER_SCOPE = ("condition", "role", "cohort", "dimension", "label")
"""The corrected rows' scope (the key columns besides the model, joined with " · "): the
cohort names the cohort rows (dimension "*") of pooled and of role-level BI apart, whose ranks
are per cohort."""
