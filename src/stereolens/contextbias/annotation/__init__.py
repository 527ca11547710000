"""The ContextBias human annotation study (paper Sec. 4.3 and App. D.2): a blinded
annotation form, and agreement between annotators and with the extraction pipeline.

- :func:`form.export_annotation_sample` draws image sets (role x condition x generator, N images
  each), hides which is which and writes a self-contained HTML form plus a separate key;
- :func:`answers.read_answers` reads and validates the CSV files the form saves;
- :func:`pipeline.pipeline_set_labels` gives the pipeline's answer to the same questions;
- :func:`study.agreement_report` computes raw agreement, pairwise Cohen's kappa, Fleiss' kappa
  with a percentile bootstrap CI, the human consensus and its agreement with the pipeline;
- :func:`study.write_agreement_tables` writes the report as parquet files.

An *item* is one question about one set: (set_id, dimension). Every answer is a label (a
schema label, a brief descriptor for open vocabularies, or ``unknown`` = not visible) plus a
0-N prevalence slider (how many of the set's N images show that label).

Kappa values come from statsmodels (:func:`statsmodels.stats.inter_rater.cohens_kappa` and
:func:`~statsmodels.stats.inter_rater.fleiss_kappa`); the bootstrap replicates of Fleiss'
kappa use the same formula vectorised over replicates. A kappa is null where it is undefined
(chance agreement 1: every answer used one and the same label).
"""
