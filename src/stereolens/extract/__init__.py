"""Vision-language model backends and schema-constrained extraction."""
