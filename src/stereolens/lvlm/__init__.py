"""Guardrail-agnostic LVLM bias audit (Hirota et al., arXiv 2608.29590): user images as
context for person-irrelevant tasks (story, term explanation, exam QA), TVD bias scores and
refusal detection. Data files: resources/lvlm/ (prompts.v1.yaml, terms.v1.yaml,
refusal_phrases.v1.yaml).

The stages, each a workflow rule and usable from Python: user_images (the labelled photos
and the balanced per-group sets), respond (the audited model's answers), assistant (story
readings, term judgements, refusal labels), merge (the per-job files as the merged tables),
metrics (scores, refusal rates, story skew); jobs holds each rule's body."""
