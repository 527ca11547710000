"""Designing an audit before paying for it: power, sample sizes and the check of the simulation
against the pipeline (docs/planner.md). The engine is ``power``, one design per benchmark."""
