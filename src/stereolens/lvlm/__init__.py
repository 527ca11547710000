"""Guardrail-agnostic LVLM bias audit (Hirota et al., arXiv 2608.29590): user images as context
for person-irrelevant tasks (story, term explanation, exam QA), TVD bias scores and refusal
detection; the stages are listed in docs/methods.md, "The LVLM audit"."""
