"""Everything about a model and nothing about a benchmark: asking it (ask)."""
