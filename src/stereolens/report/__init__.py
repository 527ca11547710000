"""The HTML report: summary first (the run, the tiny-model warning when it applies, one
bias profile per model across the benchmarks), a table of contents, one section per
benchmark (figures first; long tables collapsed, sortable, downloadable as CSV), image and
response galleries beside it, and the run's models, throughput and settings.

Modules: ``html`` (page building blocks over stereolens.templating), ``figures``
(matplotlib helpers), ``galleries`` (thumbnails and gallery pages), ``summary`` (the first
screen), ``inputs`` (the files a report reads), ``contextbias`` / ``biasig`` / ``lvlm`` (one
module per benchmark: ``facts``, ``profile``, ``sections``, ``galleries``), ``audits`` (the
per-group reader audits), ``run`` (models, throughput, settings) and ``render`` (puts it
together: :func:`stereolens.report.render.render_report`). ``html``, ``figures`` and
``galleries`` import no benchmark package.
"""
