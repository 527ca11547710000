"""Metric formulas (pure functions on tables; no model imports)."""
