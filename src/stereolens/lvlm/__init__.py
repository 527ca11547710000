"""Guardrail-agnostic LVLM bias audit (Hirota et al., arXiv 2608.29590): user images as
context for person-irrelevant tasks (story, term explanation, exam QA), TVD bias scores and
refusal detection. Data files: resources/lvlm/ (prompts.v1.yaml, terms.v1.yaml,
refusal_phrases.v1.yaml)."""
