"""The HTML report: the first screen, one section per benchmark, galleries, and the run's models,
throughput and settings; its modules are mapped in docs/architecture.md, "The report's modules"."""
