"""Tiny random-weight models built in code, for tests and the demo workflow (no downloads)."""
