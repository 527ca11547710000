"""Designing an audit before paying for it (issue 15): the power of each benchmark's headline
comparisons at the configured sample sizes (`stereolens plan --power`), the sample size a
target effect needs (`--target-effect`), a check of the simulation against the real metric
pipeline, and the extractors audited per demographic group.

Modules: :mod:`~stereolens.design.power` (the engine), one design per benchmark
(:mod:`~stereolens.design.contextbias`, :mod:`~stereolens.design.biasig`,
:mod:`~stereolens.design.lvlm`), :mod:`~stereolens.design.priors` (the documented prior),
:mod:`~stereolens.design.check` (predicted power against the pipeline's rejection rate),
:mod:`~stereolens.design.cli` (the planner's options). The per-group audits of the readers
live with their benchmarks (:mod:`~stereolens.contextbias.extraction_audit`,
:mod:`~stereolens.lvlm.story_reading`) on the shared statistics of
:mod:`~stereolens.metrics.group_audit`.
"""
